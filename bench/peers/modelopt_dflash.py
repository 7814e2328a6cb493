#!/usr/bin/env python
"""DFlash block-drafter training with NVIDIA ModelOpt 0.47 on CPU.

Run it with the interpreter of a venv holding ModelOpt (never draftsmith's own), e.g.

    /tmp/peers/venv/bin/python bench/peers/modelopt_dflash.py --model DIR --data train.jsonl --out OUT \
        --steps 292 --seq-len 384 --block-size 8 --num-draft-layers 2 --target-layer-ids 1,5 \
        --num-anchors 64 --mask-token-id 0 --lr 3e-3 --batch-size 8 --warmup-steps 29 --lr-scheduler cosine

What runs is ModelOpt's own DFlash, unmodified: `mtsp.convert(model, [("dflash", cfg)])` wraps the target in
`HFDFlashModel` (modelopt/torch/speculative/plugins/hf_dflash.py), whose training forward runs the frozen
target in process (HF `output_hidden_states`, sdpa), samples `dflash_num_anchors` random anchors per
sequence, builds the dense block mask, runs `DFlashModule` (plugins/modeling_dflash.py) and computes its
loss; an HF `Trainer` steps it (ModelOpt's own examples train with HF Trainer too); `DFlashExporter` writes
the export (z-lab layout). Nothing CPU-specific needs patching: ModelOpt's DFlash hard-codes no CUDA, and
`dflash_use_torch_compile` is False (0.47 never reads it).

Data (--data, JSONL of {"input_ids": [...], "loss_mask": [...]}, loss_mask[j] = 1 when token j is an answer
token): padded / truncated to exactly --seq-len, which ModelOpt requires to be a multiple of the block size.
They are fed as ModelOpt's own online collator feeds DFlash (`LanguageDataCollator` with
shift_labels=False): `labels` = input_ids with -100 where loss_mask is 0, `attention_mask` 0 on padding.
ModelOpt then trains block slot k (k >= 1) of the block anchored at a on token a+k when labels[a+k] is kept,
and anchors only at kept positions a <= seq_len - block_size.

Settings passed, and why (ModelOpt's defaults in brackets):
  * dflash_architecture_config sized like the target: num_hidden_layers, intermediate_size,
    num_attention_heads, num_key_value_heads, head_dim, rms_norm_eps, hidden_act, rope_parameters,
    max_position_embeddings. [ModelOpt builds the draft from `Qwen3Config(**arch)` and then "inherits" the
    target's dimensions only where the Qwen3Config value is None, which it never is: without them a draft
    for a 96-wide target gets 32 heads of 128, intermediate 22016 and eps 1e-6.]
  * target_layer_ids = --target-layer-ids (ModelOpt ids = OUTPUTS of decoder layers = draftsmith canonical
    - 1). ModelOpt 0.47 requires exactly one id per draft layer [default: z-lab's spread over 1..L-3].
  * dflash_loss_objective=decay, dflash_loss_decay_factor=--loss-decay: slot k weighs exp(-(k-1)/gamma),
    draftsmith's slot weights [objective "dpace", which ignores the decay factor].
  * dflash_self_logit_distillation=True (its default): soft cross-entropy against the target's softmax at
    the position before each slot's token. --no-distill trains on the data's tokens instead.
  * dflash_mask_token_id = --mask-token-id [the tokenizer's mask token; the toy tokenizer has none].
  * dflash_num_anchors, dflash_block_size as given; bidirectional blocks, no sliding window, no attention
    sink (its defaults).
  * HF Trainer: AdamW (betas 0.9/0.999, eps 1e-8), weight decay 0, grad clip 1.0, --lr-scheduler with
    --warmup-steps, float32, --steps optimizer steps of --batch-size, no gradient accumulation.

--init-norm-from-target is an ablation (off by default), not ModelOpt's behaviour: the draft's output norm
starts as the target's final norm, as draftsmith's DFlash starts, instead of ModelOpt's ones.

Output (--out): DFlashExporter's model.safetensors + config.json, and train_log.json (step times, the
settings above, versions).

Feeds docs/BENCHMARKS.md, "DFlash against the peers' DFlash".
"""

import argparse
import json
import os
from typing import Any

import modelopt
import modelopt.torch.opt as mto
import modelopt.torch.speculative as mtsp
import torch
import transformers
from _hf_trainer import train_and_export, write_summary  # the sibling bench/peers/_hf_trainer.py
from transformers import AutoModelForCausalLM, AutoTokenizer

IGNORE = -100


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, help="local HF model dir (target)")
    p.add_argument("--data", required=True, help="JSONL {input_ids, loss_mask}, see module docstring")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seq-len", type=int, default=384, help="a multiple of --block-size")
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--num-draft-layers", type=int, default=2)
    p.add_argument(
        "--target-layer-ids",
        default=None,
        help="comma list of ModelOpt ids (OUTPUTS of decoder layers, draftsmith canonical - 1), one per draft "
        "layer; default: ModelOpt's build_target_layer_ids",
    )
    p.add_argument("--num-anchors", type=int, default=64)
    p.add_argument("--mask-token-id", type=int, required=True)
    p.add_argument("--loss-objective", choices=["decay", "dpace"], default="decay")
    p.add_argument("--loss-decay", type=float, default=4.0, help="gamma: slot k weighs exp(-(k-1)/gamma)")
    p.add_argument("--no-distill", action="store_true", help="cross-entropy on the data's tokens")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--lr-scheduler", default="cosine", help="HF lr_scheduler_type")
    p.add_argument("--max-samples", type=int, default=None)
    p.add_argument(
        "--init-norm-from-target",
        action="store_true",
        help="ABLATION, not ModelOpt's behaviour: start the draft's output norm as the target's final norm "
        "(draftsmith's init) instead of ModelOpt's ones",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10)
    return p.parse_args()


def load_records(path, max_samples):
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if "input_ids" not in r:
                continue
            ids = list(r["input_ids"])
            mask = list(r.get("loss_mask", [1] * len(ids)))
            assert len(mask) == len(ids), "loss_mask length != input_ids length"
            out.append((ids, mask))
            if max_samples and len(out) >= max_samples:
                break
    return out


class FixedLenDataset(torch.utils.data.Dataset):
    """ModelOpt's online DFlash batch: input_ids, attention_mask, unshifted labels (-100 = not trained)."""

    def __init__(self, records, seq_len, pad_id):
        self.items = []
        for ids, mask in records:
            ids, mask = ids[:seq_len], mask[:seq_len]
            n, pad = len(ids), seq_len - len(ids)
            input_ids = torch.tensor(ids + [pad_id] * pad, dtype=torch.long)
            labels = input_ids.clone()
            labels[torch.tensor(mask + [0] * pad, dtype=torch.bool).logical_not()] = IGNORE
            attention = torch.tensor([1] * n + [0] * pad, dtype=torch.long)
            self.items.append({"input_ids": input_ids, "attention_mask": attention, "labels": labels})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def main():
    a = parse_args()
    if a.seq_len % a.block_size:
        raise SystemExit(
            f"--seq-len {a.seq_len} must be a multiple of --block-size {a.block_size} (ModelOpt)"
        )
    torch.manual_seed(a.seed)
    mto.enable_huggingface_checkpointing()
    os.makedirs(a.out, exist_ok=True)

    tok = AutoTokenizer.from_pretrained(a.model)
    model: Any = AutoModelForCausalLM.from_pretrained(
        a.model, dtype=torch.float32
    )  # ModelOpt converts it in place
    cfg = model.config
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (cfg.pad_token_id or 0)
    records = load_records(a.data, a.max_samples)
    assert records, "no usable records in --data"
    print(f"{len(records)} records; target L={cfg.num_hidden_layers} H={cfg.hidden_size}", flush=True)

    rope = dict(
        getattr(cfg, "rope_parameters", None)
        or {"rope_type": "default", "rope_theta": getattr(cfg, "rope_theta", 10000.0)}
    )
    arch = {
        "num_hidden_layers": a.num_draft_layers,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        "rms_norm_eps": cfg.rms_norm_eps,
        "hidden_act": cfg.hidden_act,
        "rope_parameters": rope,
        "max_position_embeddings": cfg.max_position_embeddings,
    }
    if a.target_layer_ids:
        arch["target_layer_ids"] = [int(x) for x in a.target_layer_ids.split(",")]
    dflash_cfg = {
        "dflash_block_size": a.block_size,
        "dflash_num_anchors": a.num_anchors,
        "dflash_mask_token_id": a.mask_token_id,
        "dflash_loss_objective": a.loss_objective,
        "dflash_loss_decay_factor": a.loss_decay,
        "dflash_self_logit_distillation": not a.no_distill,
        "dflash_use_torch_compile": False,
        "dflash_freeze_base_model": True,
        "dflash_architecture_config": arch,
    }
    mtsp.convert(model, [("dflash", dflash_cfg)])
    if a.init_norm_from_target:
        model.dflash_module.norm.load_state_dict(model.get_submodule(model.base_model_path).norm.state_dict())
    dc = model.dflash_config
    resolved = {
        k: getattr(dc, k, None)
        for k in (
            "num_hidden_layers",
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "rms_norm_eps",
            "rope_parameters",
            "layer_types",
            "sliding_window",
            "_attn_implementation",
        )
    }
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(
        f"target_layer_ids {model.target_layer_ids}; draft {resolved}; trainable params {n_train}", flush=True
    )

    ds = FixedLenDataset(records, a.seq_len, pad_id)
    targs = transformers.TrainingArguments(
        output_dir=os.path.join(a.out, "_trainer"),
        use_cpu=True,
        max_steps=a.steps,
        per_device_train_batch_size=a.batch_size,
        gradient_accumulation_steps=1,
        learning_rate=a.lr,
        lr_scheduler_type=a.lr_scheduler,
        warmup_steps=a.warmup_steps,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        max_grad_norm=1.0,
        logging_steps=a.log_every,
        save_strategy="no",
        report_to=[],
        remove_unused_columns=False,
        dataloader_drop_last=True,
        dataloader_num_workers=0,
        seed=a.seed,
        disable_tqdm=True,
    )
    common, records = train_and_export(model, targs, ds, a, "acc")
    summary = {
        **common,
        "lr": a.lr,
        "warmup_steps": a.warmup_steps,
        "lr_scheduler": a.lr_scheduler,
        "block_size": a.block_size,
        "num_anchors": a.num_anchors,
        "mask_token_id": a.mask_token_id,
        "init_norm_from_target": a.init_norm_from_target,
        "target_layer_ids": list(model.target_layer_ids),
        "loss": {
            "objective": a.loss_objective,
            "decay_factor": a.loss_decay,
            "self_logit_distillation": not a.no_distill,
        },
        "draft": {k: v for k, v in resolved.items()},
        "trainable_params": n_train,
        "versions": {
            "modelopt": modelopt.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
        "records": records,
    }
    write_summary(a.out, summary)


if __name__ == "__main__":
    main()
