"""draftsmith's EAGLE-3 against peers' EAGLE-3, trained alike and measured by the same evaluator.

    python -m draftsmith.scripts.bench_peers --target DIR --peer-python /tmp/peers/venv/bin/python --out DIR

Peers live in their own virtual environment (never dependencies of draftsmith); this script drives them
through `scripts/peers/*.py` with that environment's python. Today: NVIDIA ModelOpt 0.47
(`pip install torch==2.13.0 "transformers<5.15" "nvidia-modelopt==0.47.*" requests accelerate datasets`).

Both see the same target, the same training samples (draftsmith's pipeline renders and truncates them; the
peer gets the token ids and answer masks as JSONL, padded to one length as ModelOpt requires), the same
number of optimizer steps, batch size, learning-rate peak, TTT depth and draft-vocabulary size. Each keeps
its own loss weighting and vocabulary selection. The peer's export is converted (scripts/convert_peers.py)
and both drafters are measured by draftsmith's evaluator on the same held-out prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def export_training_data(target: Any, out: Path, max_len: int, max_samples: int) -> tuple[Path, int, int]:
    """draftsmith's training samples as JSONL {input_ids, loss_mask}; returns (path, samples, answer tokens)."""
    from draftsmith.train.core.data import DataConfig, build_datasets

    data = build_datasets(
        DataConfig(train=["stdlib:train"], eval=["stdlib:heldout"], max_len=max_len, max_samples=max_samples),
        target.tokenizer,
        seed=0,
        progress=False,
    )
    path = out / "train.jsonl"
    answer_tokens = 0
    with path.open("w") as f:
        for i in range(len(data.train)):
            s = data.train[i]
            ids = [int(t) for t in s["input_ids"]]
            mask = [int(m) for m in s["loss_mask"]]
            answer_tokens += sum(mask)
            f.write(json.dumps({"input_ids": ids, "loss_mask": mask}) + "\n")
    return path, len(data.train), answer_tokens


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", required=True, help="toy target directory (small preset)")
    parser.add_argument("--peer-python", required=True, help="python of the peers' virtual environment")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-len", type=int, default=384)
    parser.add_argument("--max-samples", type=int, default=2400)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--ttt-steps", type=int, default=7)
    parser.add_argument("--draft-vocab-size", type=int, default=1024)
    parser.add_argument("--num-prompts", type=int, default=20)
    parser.add_argument("--skip-training", action="store_true", help="reuse trained drafters in --out")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    from draftsmith.eval.acceptance import EvalArgs, evaluate
    from draftsmith.eval.drafters import load_drafter_spec
    from draftsmith.models.target import FrozenTarget, TargetConfig
    from draftsmith.scripts.convert_peers import modelopt_eagle3
    from draftsmith.train import eagle as eagle_recipe
    from draftsmith.train.core.metrics import read_metrics

    target = FrozenTarget.load(TargetConfig(path=args.target))
    data, samples, answer_tokens = export_training_data(target, args.out, args.max_len, args.max_samples)
    steps = samples // args.batch_size  # one epoch, as the draftsmith toy recipe
    print(
        f"training data: {samples} samples, {answer_tokens} answer tokens, {steps} steps of {args.batch_size}"
    )
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    timings: dict[str, float] = {}
    if not args.skip_training:
        cmd = [
            args.peer_python, str(REPO / "scripts" / "peers" / "modelopt_eagle3.py"), "--model", args.target,
            "--data", str(data), "--out", str(args.out / "modelopt"), "--steps", str(steps),
            "--seq-len", str(args.max_len), "--ttt-steps", str(args.ttt_steps),
            "--draft-vocab-size", str(args.draft_vocab_size), "--lr", str(args.lr),
            "--batch-size", str(args.batch_size), "--warmup-steps", str(steps // 10), "--lr-scheduler", "cosine",
        ]  # fmt: skip
        subprocess.run(cmd, check=True, env=env)
        eagle_recipe.main(
            ["--config", str(REPO / "recipes" / "eagle" / "eagle3_toy.yaml"), f"target.path={args.target}",
             f"output_dir={args.out / 'draftsmith'}", f"data.max_len={args.max_len}",
             f"data.max_samples={args.max_samples}", f"train.micro_batch_size={args.batch_size}",
             f"train.lr={args.lr}", f"draft.ttt_steps={args.ttt_steps}",
             f"draft.draft_vocab_size={args.draft_vocab_size}", f"train.max_steps={steps}"]
        )  # fmt: skip
    peer_log = json.loads((args.out / "modelopt" / "train_log.json").read_text())
    timings["modelopt_step_s"] = peer_log["mean_step_s_excl_first"]
    ours = [
        r["perf/step_s"]
        for r in read_metrics(args.out / "draftsmith" / "metrics.jsonl")
        if "perf/step_s" in r
    ]
    timings["draftsmith_step_s"] = sum(ours[1:]) / max(1, len(ours) - 1)  # the first window includes warm-up
    converted = modelopt_eagle3(
        args.out / "modelopt", target, args.out / "modelopt-converted", args.ttt_steps
    )

    rows = []
    for name, ckpt in [("draftsmith", args.out / "draftsmith" / "final"), ("modelopt", converted)]:
        drafter = load_drafter_spec(str(ckpt), target)
        for temperature in (0.0, 1.0):
            for tree in ("chain", "dynamic:4:16"):
                t0 = time.perf_counter()
                r = evaluate(
                    EvalArgs(target=args.target, drafter=str(ckpt), data="stdlib:heldout",
                             num_prompts=args.num_prompts, max_new_tokens=96, depth=5, tree=tree,
                             temperature=temperature, check_lossless=temperature == 0, progress=False),
                    target, drafter,
                )  # fmt: skip
                row = {"drafter": name, "T": temperature, "tree": tree, "tau": r["tau"], "alpha": r["alpha"],
                       "lossless": r["lossless"], "eval_s": time.perf_counter() - t0}  # fmt: skip
                print(json.dumps(row), flush=True)
                rows.append(row)
    result = {"samples": samples, "answer_tokens": answer_tokens, "steps": steps, **timings, "rows": rows,
              "peer_versions": peer_log.get("versions"), "torch_threads_peer": peer_log.get("torch_threads")}  # fmt: skip
    (args.out / "peers.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))


if __name__ == "__main__":
    sys.exit(main())
