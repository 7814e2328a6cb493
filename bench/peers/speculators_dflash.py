#!/usr/bin/env python
"""Minimal DFlash drafter training with vLLM's `speculators` 0.9 on CPU.

Run it with the interpreter of a venv holding speculators (never draftsmith's own), e.g.

    /tmp/peers/spec-venv/bin/python bench/peers/speculators_dflash.py --model DIR --data train.jsonl \
        --out OUT --steps 292 --seq-len 384 --lr 3e-3 --batch-size 8 --warmup-steps 29 --lr-scheduler cosine \
        --block-size 8 --num-draft-layers 2 --aux-layers 2,6 --num-anchors 64 --mask-token-id 0

What runs is speculators' own code in the order of `speculators.train.cli.main`, as in
bench/peers/speculators_eagle3.py, whose docstring explains the shared pieces (bench/peers/_speculators.py):
the in-process HF target serving hidden states through speculators' `HiddenStatesTransfer` plug-in point, the
two CPU monkeypatches, `speculators prepare-data`'s preprocessing, the packed loader over every sample
(train_ratio 1.0) with a token budget giving --steps batches of about --batch-size samples, and speculators'
Trainer. For DFlash:

  * `--speculator-type dflash`, `DFlashDraftModel.from_training_args` through `build_draft_model`: Qwen3
    decoder layers (q/k norms), `fc` over the concatenated taps, `hidden_norm`, `norm`, the target's
    embedding and LM head (frozen; --draft-vocab-size = the target's vocabulary: every token, as draftsmith's
    DFlash drafts).
  * --aux-layers are speculators/vLLM ids = draftsmith's canonical ids (the residual stream entering layer k);
    vLLM maps them to z-lab's target_layer_ids as id - 1.
  * No batch preprocessing (speculators' cli uses `shift_batch` for EAGLE-3 only): anchor blocks are drawn
    inside the model (`select_anchors`, up to --num-anchors per packed row).

Deviations from speculators' DFlash defaults, to match draftsmith's toy recipe (bench_peers --family dflash):
  * --block-size 8 (default 16), --num-layers 2 (default 5), --max-anchors 64 (default 512).
  * --full-attention-indices = every draft layer. By default speculators 0.9 makes every draft layer a
    sliding-window layer (window 2048), and a sliding-window layer attends CAUSALLY inside the block
    (`sliding_window_non_causal` is false for dflash): a different drafter from DFlash's bidirectional block
    (z-lab, ModelOpt, draftsmith), which draftsmith's converter would refuse.
  * --loss-fn kl_div with --per-position-loss-weight fixed-exp-decay and --dflash-decay-gamma 4 (defaults:
    ce with D-PACE): distillation from the target with slot weights exp(-(k-1)/4), what draftsmith's
    `objective.loss=kl` and ModelOpt's default do. --loss-fn / --position-weight switch back.
  * --draft-attn-impl sdpa (default simple_flex_attention: FlexAttention has no backward on CPU) and
    --loss-implementation eager (the fused losses are Triton kernels).
  * --optimizer adamw (default muon), as the other DFlash runs; --hidden-states-dtype float32; seed 0.

train_log.json: the fields of speculators_eagle3.py's (step times, speculators' metrics, versions, packing)
plus the DFlash settings.

Feeds docs/BENCHMARKS.md, "DFlash against the peers' DFlash".
"""

from __future__ import annotations

import json

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
    p = common_args(__doc__.split("\n")[0], optimizer="adamw")
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--num-draft-layers", type=int, default=2)
    p.add_argument("--aux-layers", required=True, help="comma list of speculators/vLLM ids (= canonical ids)")
    p.add_argument("--num-anchors", type=int, default=64, help="speculators' --max-anchors (per packed row)")
    p.add_argument("--mask-token-id", type=int, required=True)
    p.add_argument("--decay-gamma", type=float, default=4.0, help="slot k weighs exp(-(k-1)/gamma)")
    p.add_argument("--loss-fn", default="kl_div", help="speculators' --loss-fn (its DFlash default: ce)")
    p.add_argument(
        "--position-weight",
        default="fixed-exp-decay",
        choices=["fixed-exp-decay", "dpace"],
        help="speculators' --per-position-loss-weight (its DFlash default: dpace, which needs --loss-fn ce)",
    )
    return p.parse_args()


def main():
    a = parse_args()
    out, data_dir, ckpt_dir = start_run(a)

    from speculators.model import SpeculatorModel
    from speculators.train.cli import build_draft_model, parse_vocab_mappings
    from transformers import AutoConfig

    tcfg = AutoConfig.from_pretrained(a.model)
    layer_ids = [int(x) for x in a.aux_layers.split(",")]

    n_samples, lengths = prepare_data(a, data_dir, token_freq=True)  # its vocabulary map: all V tokens
    budget, epochs = token_budget(a, n_samples, lengths)
    argv = [
        *speculators_argv(a, "dflash", out, data_dir, ckpt_dir, budget, layer_ids, epochs),
        "--num-layers",
        str(a.num_draft_layers),
        "--full-attention-indices",
        *[str(i) for i in range(a.num_draft_layers)],
        "--draft-vocab-size",
        str(tcfg.vocab_size),
        "--block-size",
        str(a.block_size),
        "--max-anchors",
        str(a.num_anchors),
        "--mask-token-id",
        str(a.mask_token_id),
        "--dflash-decay-gamma",
        str(a.decay_gamma),
        "--per-position-loss-weight",
        a.position_weight,
        "--loss-fn",
        a.loss_fn,
    ]
    args, capture = resolve(argv, out)

    model_class = SpeculatorModel.registry["dflash"]
    d2t, t2d, draft_vocab_size = parse_vocab_mappings(args)
    model = build_draft_model(args, model_class, t2d, d2t, draft_vocab_size)
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(
        f"{n_samples} samples; layer ids {model.target_layer_ids}; token budget {budget}; "
        f"trainable params {n_train}: {trainable}",
        flush=True,
    )

    loader, transfer, hook_err, per_batch, tok_batch = build_loader(
        a, data_dir, budget, int(tcfg.hidden_size), list(model.target_layer_ids), None, args.seed, lengths
    )
    model, t0, total = train(model, model_class, args, loader)
    model.eval()
    model.save_pretrained(str(out))
    summary = {
        **training_log(capture, t0, total, transfer, per_batch, tok_batch),
        "feature_layers": list(model.target_layer_ids),
        "seq_len": a.seq_len,
        "batch_size_requested": a.batch_size,
        "token_budget_total_seq_len": budget,
        "samples": n_samples,
        "block_size": a.block_size,
        "num_draft_layers": a.num_draft_layers,
        "num_anchors": a.num_anchors,
        "mask_token_id": a.mask_token_id,
        "loss": {"loss_fn": a.loss_fn, "per_position_loss_weight": a.position_weight, "gamma": a.decay_gamma},
        "optimizer": a.optimizer,
        "trainable_parameters": trainable,
        "trainable_parameter_count": n_train,
        "hook_check_max_abs_diff": hook_err,
        "speculators_argv": argv,
    }
    (out / "train_log.json").write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps({k: v for k, v in summary.items() if k != "records"}, default=str), flush=True)


if __name__ == "__main__":
    main()
