r"""The features and EAGLE-3 training, compiled or not (docs/BENCHMARKS.md, "Compiled or not, stage by stage").

    python -m bench.compile_training --target DIR --work /tmp/ct [--samples 256] [--steps 60] [--dtype float32]

The quickstart's recipe on the first `--samples` built-in `prompts:train` prompts with the target's greedy
answers (`data regenerate`, made once in WORK), their features cached (`draftsmith cache`, timed), then
`--steps` training steps from the cache twice: eager (`train.compile=false`) and compiled
(`train.compile=true`, accelerate's inductor backend). Seconds per step are the median over the logged
windows after the first (the compiled run pays its compilation in the first); both runs must reach the same
held-out loss within bf16/compile noise, which the table shows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="a target directory")
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = p.parse_args()

    from accelerate.state import AcceleratorState

    from draftsmith.runtime.display import table
    from draftsmith.scripts.data import regenerate
    from draftsmith.train import eagle
    from draftsmith.train.cache import build

    answers = args.work / "answers.jsonl"
    regen = ["--target", args.target, "--data", "prompts:train", "--out", str(answers), "--temperature", "0"]
    regen += ["--max-new-tokens", "128", "--max-samples", str(args.samples), "--batch-size", "64"]
    assert regenerate.main([*regen, "--dtype", args.dtype, "--no-progress"]) == 0
    recipe = "recipes/eagle/eagle3_smollm2.yaml"
    common = [f"target.path={args.target}", f"data.train=[{answers}]", f"data.cache={args.work / 'cache'}"]
    began = time.perf_counter()
    assert build.main(["eagle", "--config", recipe, *common, f"target.dtype={args.dtype}"]) == 0
    cache_s = time.perf_counter() - began
    index = json.loads((args.work / "cache" / "index.json").read_text())
    tokens = sum(s["tokens"] for s in index["splits"].values())
    print(f"cache: {tokens} tokens in {cache_s:.1f} s, {tokens / cache_s:.0f} tokens/s", flush=True)
    rows = []
    precision = "bf16" if args.dtype == "bfloat16" else "no"
    for compiled in (False, True):
        # accelerate keeps one state per process, dynamo backend included: each run starts from none
        AcceleratorState._reset_state(reset_partial_state=True)
        out = args.work / f"run-compile-{compiled}"
        settings = [
            f"output_dir={out}",
            f"train.max_steps={args.steps}",
            f"train.mixed_precision={precision}",
        ]
        settings += [f"train.compile={str(compiled).lower()}", "log.every=10", "checkpoint.every=0"]
        began = time.perf_counter()
        assert eagle.main(["--config", recipe, *common, *settings]) == 0
        wall = time.perf_counter() - began
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        train = [r for r in records if "perf/step_s" in r]
        step_s = statistics.median(r["perf/step_s"] for r in train[1:])
        rate = statistics.median(r["perf/tokens_per_s"] for r in train[1:])
        final = json.loads((out / "final" / "config.json").read_text())["training"]["heldout"]
        loss = final.get("eval/loss")
        rows.append(
            (
                f"compile={compiled}",
                f"{train[0]['perf/step_s']:.2f}",
                f"{step_s:.3f}",
                f"{rate:.0f}",
                f"{wall:.0f}",
                f"{loss:.4f}" if loss is not None else "-",
            )
        )
        print(rows[-1], flush=True)
    print(
        "\n".join(
            table(
                ["training", "first window s/step", "later s/step", "tokens/s", "wall s", "held-out loss"],
                rows,
            )
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
