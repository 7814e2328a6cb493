#!/usr/bin/env python
"""Minimal EAGLE-3 draft-head training with NVIDIA ModelOpt 0.47 on CPU.

Online training: the (frozen) target runs inside the training step; ModelOpt's
HFEagleModel taps aux hidden states with forward hooks, runs the draft for
`--ttt-steps` training-time-test steps and distils from the target's softmax.

Data (--data, JSONL; one record per line, records of either kind may be mixed;
lines that are neither are skipped, e.g. a header line):
  * {"input_ids": [int, ...], "loss_mask": [int, ...]}   (pre-tokenised)
      loss_mask has the same length/indexing as input_ids and is passed to
      ModelOpt unchanged (ModelOpt convention: loss_mask[j] gates the
      distillation target = target distribution at position j, i.e. the
      prediction of token j+1).
  * {"messages": [{"role": ..., "content": ...}, ...]}   (OpenAI style)
      tokenised with the target tokenizer's chat template; loss_mask is the
      per-token assistant mask from `return_assistant_tokens_mask=True`
      (needs {% generation %} tags; falls back to all-ones otherwise). This is
      the same unshifted per-token mask ModelOpt's own offline dataset stores.
Every sample is truncated/right-padded to exactly --seq-len (ModelOpt caches
its TTT attention masks per TTT step, not per length, so a fixed length is
mandatory). Padding gets attention_mask=0 and loss_mask=0.

d2t (draft->target vocab map) is built exactly like ModelOpt's
`calibrate_frequent_vocab`: Counter over all token ids of the (untruncated)
training samples, `most_common(VD)`, d2t[i] = token_id_i - i (draft id i is
the i-th most frequent token). If fewer than VD distinct tokens occur,
ModelOpt would assert; here the rest is filled with the unused target ids in
ascending order (reported on stdout).

Output (--out): ModelOpt's EagleExporter output, i.e. model.safetensors +
config.json (the deployment format vLLM/SGLang/TRT-LLM read), plus
d2t.pt (ModelOpt's draft_vocab_cache format) and train_log.json.

Feeds docs/BENCHMARKS.md, "EAGLE-3 against NVIDIA ModelOpt 0.47 and vLLM speculators 0.9".
"""

import argparse
import json
import os
from collections import Counter
from typing import Any

import modelopt.torch.opt as mto
import modelopt.torch.speculative as mtsp
import torch
import transformers
from _hf_trainer import train_and_export, write_summary  # the sibling bench/peers/_hf_trainer.py
from modelopt.torch.speculative.plugins.hf_eagle import HFEagleModel, default_eagle_aux_layer_ids
from transformers import AutoModelForCausalLM, AutoTokenizer


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, help="local HF Llama dir (target)")
    p.add_argument("--data", required=True, help="JSONL, see module docstring")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--ttt-steps", type=int, default=3)
    p.add_argument(
        "--draft-vocab-size",
        type=int,
        default=None,
        help="default: target vocab size (then no d2t, no draft lm_head)",
    )
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument(
        "--max-samples", type=int, default=None, help="only read this many usable records (also used for d2t)"
    )
    p.add_argument(
        "--aux-layers",
        type=str,
        default=None,
        help="comma list of ModelOpt layer ids (0-based decoder-layer OUTPUTS); "
        "default ModelOpt's {1, L//2-1, L-4}",
    )
    p.add_argument("--num-draft-layers", type=int, default=1)
    p.add_argument(
        "--draft-intermediate-size", type=int, default=None, help="default: target intermediate_size"
    )
    p.add_argument(
        "--loss-decay", type=float, default=0.9, help="eagle_loss_decay_factor: step k weight = decay**k"
    )
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--lr-scheduler", default="linear", help="HF lr_scheduler_type")
    p.add_argument(
        "--keep-export-yarn",
        action="store_true",
        help="keep ModelOpt's default eagle_export_rope_scaling (yarn factor 32) in the exported config.json",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=1)
    return p.parse_args()


def load_records(path, tok, seq_len, max_samples):
    """Return list of (input_ids, loss_mask) full-length lists."""
    out = []
    has_gen_tags = bool(tok.chat_template) and "generation" in tok.chat_template
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if "input_ids" in r:
                ids = list(r["input_ids"])
                lm = list(r.get("loss_mask", [1] * len(ids)))
                assert len(lm) == len(ids), "loss_mask length != input_ids length"
            elif "messages" in r or "conversations" in r:
                msgs = r.get("messages") or r.get("conversations")
                enc = tok.apply_chat_template(
                    msgs,
                    tokenize=True,
                    return_dict=True,
                    add_generation_prompt=False,
                    return_assistant_tokens_mask=has_gen_tags,
                )
                ids = list(enc["input_ids"])
                if has_gen_tags and "assistant_masks" in enc:
                    lm = [int(x) for x in enc["assistant_masks"]]
                else:
                    lm = [1] * len(ids)
            else:
                continue
            if len(ids) < 3:
                continue
            out.append((ids, lm))
            if max_samples and len(out) >= max_samples:
                break
    return out


def build_d2t(records, vocab_size, draft_vocab_size):
    """ModelOpt calibrate_frequent_vocab semantics on token counts."""
    counter: Counter[int] = Counter()
    for ids, _ in records:
        counter.update(ids)
    vocab = [t for t, _ in counter.most_common(draft_vocab_size)]
    n_seen = len(vocab)
    if n_seen < draft_vocab_size:
        used = set(vocab)
        vocab += [t for t in range(vocab_size) if t not in used][: draft_vocab_size - n_seen]
    d2t = torch.tensor([t - i for i, t in enumerate(vocab)], dtype=torch.int64)
    return d2t, n_seen


class FixedLenDataset(torch.utils.data.Dataset):
    def __init__(self, records, seq_len, pad_id):
        self.items = []
        for ids, lm in records:
            ids, lm = ids[:seq_len], lm[:seq_len]
            n = len(ids)
            pad = seq_len - n
            self.items.append(
                {
                    "input_ids": torch.tensor(ids + [pad_id] * pad, dtype=torch.long),
                    "attention_mask": torch.tensor([1] * n + [0] * pad, dtype=torch.long),
                    "loss_mask": torch.tensor(lm + [0] * pad, dtype=torch.long),
                }
            )

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def main():
    a = parse_args()
    torch.manual_seed(a.seed)
    mto.enable_huggingface_checkpointing()
    os.makedirs(a.out, exist_ok=True)

    tok = AutoTokenizer.from_pretrained(a.model)
    model: Any = AutoModelForCausalLM.from_pretrained(
        a.model, dtype=torch.float32
    )  # ModelOpt converts it in place
    cfg = model.config
    V, H, L = cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers
    VD = a.draft_vocab_size or V
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (cfg.pad_token_id or 0)

    records = load_records(a.data, tok, a.seq_len, a.max_samples)
    assert records, "no usable records in --data"
    print(f"{len(records)} records; target V={V} H={H} L={L}; draft vocab {VD}", flush=True)

    aux = [int(x) for x in a.aux_layers.split(",")] if a.aux_layers else default_eagle_aux_layer_ids(L)
    rope_theta = (
        (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta")
        or getattr(cfg, "rope_theta", None)
        or 10000.0
    )

    arch = {
        # ModelOpt's default_eagle_config is sized for Llama-3-8B (32 heads, head_dim 128,
        # intermediate 14336, rope_theta 10000); size the draft like the target instead.
        "num_hidden_layers": a.num_draft_layers,
        "intermediate_size": a.draft_intermediate_size or cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": getattr(cfg, "head_dim", None) or H // cfg.num_attention_heads,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": rope_theta,
        "rope_scaling": {"rope_type": "default", "rope_theta": rope_theta},
        "torch_dtype": "float32",
        "draft_vocab_size": VD,
        "eagle_aux_hidden_state_layer_ids": aux,
    }
    eagle_cfg = {
        "eagle_decoder_type": "llama",
        "eagle_ttt_steps": a.ttt_steps,
        "eagle_loss_decay_factor": a.loss_decay,
        "eagle_use_torch_compile": False,  # required on CPU
        "eagle_freeze_base_model": True,
        "eagle_self_logit_distillation": True,
        "eagle_mix_hidden_states": False,
        "eagle_architecture_config": arch,
    }
    if not a.keep_export_yarn:
        eagle_cfg["eagle_export_rope_scaling"] = {}
    # EAGLE3_DEFAULT_CFG sets use_aux_hidden_state/use_last_layernorm; convert() merges
    # our arch dict over eagle3_default_config for decoder_type "llama".
    mtsp.convert(model, [("eagle", eagle_cfg)])

    d2t_path = None
    if VD < V:
        d2t, n_seen = build_d2t(records, V, VD)
        d2t_path = os.path.join(a.out, "d2t.pt")
        torch.save(d2t, d2t_path)
        print(
            f"d2t: {n_seen} distinct tokens seen, {VD - max(0, VD - n_seen)} from counts, "
            f"{max(0, VD - n_seen)} filled",
            flush=True,
        )
    HFEagleModel.load_draft_vocab_cache(model, d2t_path)

    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(
        f"aux layer ids {model.eagle_config.eagle_aux_hidden_state_layer_ids}; trainable params {n_train}",
        flush=True,
    )

    ds = FixedLenDataset(records, a.seq_len, pad_id)
    targs = transformers.TrainingArguments(
        output_dir=os.path.join(a.out, "_trainer"),
        use_cpu=True,
        max_steps=a.steps,
        per_device_train_batch_size=a.batch_size,
        learning_rate=a.lr,
        lr_scheduler_type=a.lr_scheduler,
        warmup_steps=a.warmup_steps,
        weight_decay=0.0,
        logging_steps=a.log_every,
        save_strategy="no",
        report_to=[],
        remove_unused_columns=False,
        dataloader_drop_last=True,
        dataloader_num_workers=0,
        seed=a.seed,
        disable_tqdm=True,
    )
    common, records = train_and_export(model, targs, ds, a, "ttt acc")
    summary = {
        **common,
        "ttt_steps": a.ttt_steps,
        "aux_layer_ids": list(model.eagle_config.eagle_aux_hidden_state_layer_ids),
        "records": records,
    }
    write_summary(a.out, summary)


if __name__ == "__main__":
    main()
