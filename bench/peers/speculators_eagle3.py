#!/usr/bin/env python
"""Minimal EAGLE-3 draft-head training with vLLM's `speculators` 0.9 on CPU.

Run it with the interpreter of a venv holding speculators (never draftsmith's own), e.g.

    /tmp/peers/spec-venv/bin/python bench/peers/speculators_eagle3.py --model DIR --data train.jsonl \
        --out OUT --steps 292 --seq-len 384 --ttt-steps 7 --draft-vocab-size 1024 --lr 3e-3 \
        --batch-size 8 --warmup-steps 29 --lr-scheduler cosine

What runs is speculators' own code, end to end, in the order of `speculators.train.cli.main`:

  1. Data: `speculators.data_generation.preprocessing.load_and_preprocess_dataset` (what
     `speculators prepare-data` runs) on --data. Speculator-format rows {"input_ids", "loss_mask"} pass
     straight through: truncated to --seq-len, rows with no loss_mask=1 token dropped, shuffled (seed). The
     result is saved with `save_to_disk` under OUT/prepared_data, as prepare-data does.
  2. Draft vocabulary: speculators' default path. `save_token_frequency_distribution` counts the tokens with
     loss_mask == 1 (assistant/answer tokens only; prompt and template tokens are not counted) over the
     truncated training rows -> prepared_data/token_freq.pt; then `parse_vocab_mappings` (its
     `build_vocab_mappings_from_distribution`) keeps the --draft-vocab-size most frequent (ties: lower id),
     fills up with the lowest unused ids if fewer occur, sorts them by target id and stores
     d2t[i] = target_id_i - i (OFFSETS, sorted) and t2d a bool mask [V]; cached as d2t-<Vd>.npy/t2d-<Vd>.npy.
  3. Model: `speculators.train.cli.build_draft_model` from a `TrainConfig` resolved from real
     `speculators train` flags (the equivalent command line is printed and written to OUT/run.yaml and
     OUT/train_command.txt by speculators' own `cfg.save`). It copies the target's embedding and its
     lm_head rows of the draft vocabulary into the draft; both stay FROZEN (speculators trains the fc, the
     decoder layer and the final norm only; the draft head IS the target's head restricted to the draft
     vocabulary, and `verifier_norm` + `verifier_lm_head` compute the distillation targets).
  4. Loader: speculators' `ArrowDataset` + `_setup_dataloader` (its multipack sampler, `CollateFn`,
     `shift_batch`). Samples are PACKED into one row of --total-seq-len tokens (document-id masking).
  5. Trainer: `speculators.train.trainer.Trainer.run_training` (AdamW/Muon, grad clip 1.0, LR scheduler, its
     metric logging, its end-of-epoch checkpoint under OUT/trainer_checkpoints/0, which it writes in bf16).
  6. Output: `model.save_pretrained(OUT)` in float32: OUT/config.json + OUT/model.safetensors (speculators'
     save format; d2t, t2d, embed_tokens.weight, lm_head.weight, fc.weight, layers.0.*, norm.weight), plus
     OUT/train_log.json.

Target hidden states ("online", in process, through HF transformers): vLLM is not available, so
`HFOnlineTransfer` (bench/peers/_speculators.py) implements speculators' `hs_connectors.HiddenStatesTransfer` interface (the plug-in
point through which `ArrowDataset` fetches hidden states; normally a vLLM server writes them). Every time
the loader asks for a sample, the frozen HF target runs on that sample's input_ids, inside the training
step. The payload is exactly what vLLM's `extract_hidden_states` produces for speculators: `hidden_states`
[T, len(ids)+1, H] at the layer ids `eagle_aux_hidden_state_layer_ids` + [L], where vLLM's id k is
`hidden_states + residual` BEFORE decoder layer k runs, i.e. the PRE-norm residual stream entering layer k
(draftsmith's canonical id k; ModelOpt's k-1), and id L (num_hidden_layers) is the pre-norm output of the
last layer (speculators applies the target's final norm itself: `verifier_lm_head(verifier_norm(h_L))`).
They are taken with forward pre-hooks on decoder layer k and on the final norm (NOT HF's
`output_hidden_states`, whose last entry is post-norm); the hooks are checked against HF's hidden_states
once at start-up.

Deviations from speculators' defaults, and why:
  * --target-layer-ids = draftsmith canonical [2, L//2, L-3] (also speculators' own default; passed
    explicitly, as speculators warns it must be).
  * --arch classic (default): --no-norm-before-fc --no-norm-before-residual --no-norm-output. speculators
    0.9's defaults for eagle3 are norm_before_fc=True (an RMSNorm over the 3H concat before fc),
    norm_before_residual=True (the residual of the first layer is the NORMED hidden) and norm_output=True
    ("EAGLE 3.1": the normed output is fed to the next TTT step). draftsmith's Eagle3Draft (and the original
    EAGLE-3) has none of these, so a default speculators checkpoint cannot be converted exactly. With
    --arch speculators the 0.9 defaults are kept (training metrics only; convert_peers refuses it).
  * --draft-attn-impl sdpa (default simple_flex_attention needs a GPU) and --loss-implementation eager
    (the fused losses are Triton kernels).
  * --hidden-states-dtype float32 (default bfloat16): on CPU the trainer's torch.autocast("cuda") is inert,
    the model is float32, and the hidden states are cast to this dtype in the collate.
  * --ttt-steps 7 (default 3), --draft-vocab-size 1024 (default: none = full vocab), --lr 3e-3 (default
    1e-3; Muon's lr defaults to --lr), --scheduler-type cosine (default linear), --scheduler-warmup-steps 29
    (default 1%), --max-steps 292, --epochs as those steps need (default 20; below), --num-workers 0
    (default 12; 2 cores and the target runs inside the loader).
  * --total-seq-len (default 8192): speculators has no "batch size"; it packs samples into one row of
    total_seq_len tokens. To match "--steps optimizer steps of --batch-size sequences", the driver picks the
    largest token budget for which speculators' own multipack sampler yields at least N // batch-size batches
    an epoch for this data and seed, so the tokens per step equal those of batch-size average sequences
    (reported in train_log.json: samples/tokens per step), and passes --epochs ceil(steps / batches an epoch)
    with --max-steps steps (speculators' schedule then decays over --max-steps).
  * train/validation split: speculators' `create_train_val_loaders` insists on 0 < train_data_ratio < 1
    (default 0.9 holds 10% out). Here every sample trains (the matched setting is every sample in every
    epoch, as the other trainers'), so the driver builds the train loader itself from speculators' own
    pieces (`ArrowDataset` with train_ratio=1.0, `_setup_dataloader`) and passes no validation loader (the
    Trainer supports None).
  * optimizer: speculators' default kept (Muon for the 2D matrices of fc/attention/MLP with
    adjust_lr_fn=match_rms_adamw, AdamW for the norms; weight decay 0.1 / 0.01); --optimizer adamw switches.
  * loss: speculators' default kept: forward KL to the target's softmax over the DRAFT vocabulary
    (target logits restricted to the draft vocabulary and renormalised), per step the mean over
    loss-masked tokens, TTT steps summed with weight ttt_step_loss_decay**s = 1 (all equal). Teacher
    forcing (ground-truth ids) at every TTT step. Loss mask: shift_batch drops position 0, so column t
    reads (g_t, x_{t+1}), predicts x_{t+2} against the target's distribution at position t+1, and is gated by
    loss_mask[t+1]: a prediction is supervised when the token BEFORE the predicted one is an answer token
    (the first answer token is never a target; the token after the last one is). At TTT step s column t
    predicts x_{t+s+2}, gated by loss_mask[t+s+1]. ModelOpt uses the same convention.
  * seed 0 (default 42), like bench/peers/modelopt_eagle3.py.
  * --threads (default 2, the cap for this machine): with another CPU-bound job on the 2 cores, 2 OpenMP
    threads oversubscribe them and small ops stall (the target forward of one sample took 0.5 s instead of
    0.01 s, a training step 12 s instead of 2.5 s); pass --threads 1 then.
  * the final weights are additionally written in float32 with save_pretrained (the trainer's own
    checkpoint rounds them to bf16).

Monkeypatches (speculators 0.9 assumes an accelerator):
  * `speculators.train.trainer.get_local_rank` -> torch.device("cpu"): the Trainer does
    `model.to(local_rank)` and `batch[k].to(local_rank)` with local_rank = 0 (CUDA device 0).
  * `torch.accelerator.synchronize` -> no-op when no accelerator exists: the Trainer's step timer calls it
    on every logged step and it raises on a CPU-only build; CPU execution is synchronous, so nothing is lost.
Nothing else in speculators is changed; the hidden-state source is a plug-in object, not a patch.

train_log.json: steps, mean_step_s_excl_first (wall seconds per optimizer step, data fetch + target
forward + draft forward/backward + optimizer, excluding the first step), per-step records (speculators'
own metric dict: loss, loss_s, full_acc_s, cond_acc_s per TTT step s, lr, its profile), the final metrics and
the mean of the last 20 steps, versions, torch_threads, feature_layers, the resolved speculators config.

Feeds docs/BENCHMARKS.md, "EAGLE-3 against NVIDIA ModelOpt 0.47 and vLLM speculators 0.9".
"""

from __future__ import annotations

import json

import torch
from _speculators import (  # the sibling bench/peers/_speculators.py
    build_loader,
    common_args,
    prepare_data,
    resolve,
    speculators_argv,
    start_run,
    token_budget,
    train,
    training_log,
)


def parse_args():
    p = common_args(__doc__.split("\n")[0], optimizer="muon")
    p.add_argument("--ttt-steps", type=int, default=3)
    p.add_argument("--draft-vocab-size", type=int, default=None, help="default: the target vocabulary")
    p.add_argument(
        "--aux-layers",
        type=str,
        default=None,
        help="comma list of speculators/vLLM layer ids (= draftsmith canonical ids: the input of layer k); "
        "default 2, L//2, L-3",
    )
    p.add_argument("--num-draft-layers", type=int, default=1)
    p.add_argument(
        "--loss-decay", type=float, default=1.0, help="ttt_step_loss_decay (speculators default 1)"
    )
    p.add_argument(
        "--arch",
        default="classic",
        choices=["classic", "speculators"],
        help="classic: no norm_before_fc / norm_before_residual / norm_output (original EAGLE-3, convertible); "
        "speculators: the 0.9 defaults (all three on)",
    )
    return p.parse_args()


def main():
    a = parse_args()
    out, data_dir, ckpt_dir = start_run(a)  # with the monkeypatches of the module docstring

    from speculators.model import SpeculatorModel
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.cli import build_draft_model, parse_vocab_mappings
    from transformers import AutoConfig

    tcfg = AutoConfig.from_pretrained(a.model)
    L = int(tcfg.num_hidden_layers)
    layer_ids = [int(x) for x in a.aux_layers.split(",")] if a.aux_layers else [2, L // 2, L - 3]

    # ---- 1. data, as `speculators prepare-data` ----
    n_samples, lengths = prepare_data(a, data_dir, token_freq=True)
    budget, epochs = token_budget(a, n_samples, lengths)

    # ---- 2./3. config from real `speculators train` flags ----
    argv = [
        *speculators_argv(a, "eagle3", out, data_dir, ckpt_dir, budget, layer_ids, epochs),
        "--num-layers",
        str(a.num_draft_layers),
        "--draft-vocab-size",
        str(a.draft_vocab_size or tcfg.vocab_size),
        "--ttt-steps",
        str(a.ttt_steps),
        "--ttt-step-loss-decay",
        str(a.loss_decay),
    ]
    if a.arch == "classic":
        argv += ["--no-norm-before-fc", "--no-norm-before-residual", "--no-norm-output"]
    args, capture = resolve(argv, out)

    d2t, t2d, draft_vocab_size = parse_vocab_mappings(args)
    model_class = SpeculatorModel.registry["eagle3"]
    model = build_draft_model(args, model_class, t2d, d2t, draft_vocab_size)
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    frozen = sorted(n for n, p in model.named_parameters() if not p.requires_grad)
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(
        f"{n_samples} samples; draft vocab {draft_vocab_size}; layer ids {model.target_layer_ids}; "
        f"token budget {budget}; trainable params {n_train}: {trainable}; frozen: {frozen}",
        flush=True,
    )

    # ---- 4. loader: speculators' ArrowDataset + multipack sampler + CollateFn + shift_batch ----
    loader, transfer, hook_err, per_batch, tok_batch = build_loader(
        a,
        data_dir,
        budget,
        int(tcfg.hidden_size),
        list(model.target_layer_ids),
        shift_batch,
        args.seed,
        lengths,
    )

    # ---- 5. speculators' Trainer ----
    head_before = model.lm_head.weight.detach().clone()
    model, t0, total = train(model, model_class, args, loader)

    # ---- 6. save (speculators' save_pretrained, float32) + log ----
    model.eval()
    model.save_pretrained(str(out))
    summary = {
        **training_log(capture, t0, total, transfer, per_batch, tok_batch),
        "feature_layers": list(model.target_layer_ids),
        "feature_layers_convention": "speculators/vLLM id k = pre-norm residual stream entering decoder layer k "
        "(= draftsmith canonical id k)",
        "seq_len": a.seq_len,
        "batch_size_requested": a.batch_size,
        "token_budget_total_seq_len": budget,
        "samples": n_samples,
        "ttt_steps": a.ttt_steps,
        "draft_vocab_size": draft_vocab_size,
        "arch": a.arch,
        "optimizer": a.optimizer,
        "trainable_parameters": trainable,
        "trainable_parameter_count": n_train,
        "lm_head_unchanged_by_training": bool(torch.equal(head_before, model.lm_head.weight.detach())),
        "hook_check_max_abs_diff": hook_err,
        "speculators_argv": argv,
    }
    (out / "train_log.json").write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps({k: v for k, v in summary.items() if k != "records"}, default=str), flush=True)


if __name__ == "__main__":
    main()
