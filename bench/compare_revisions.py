"""Prove a refactor changed no behaviour: train the same recipe and evaluate the result with an older revision
of draftsmith and with this checkout, then compare bit for bit.

    python -m bench.compare_revisions --rev ff28ead --target ~/.cache/draftsmith/targets/small-seed0
    python -m bench.compare_revisions --rev eb256ac --target ... --recipe eagle/eagle3_toy.yaml train.max_steps=40

The older revision runs from a `git worktree`, imported from its src/ folder (or, for revisions of the flat layout,
through a `draftsmith` package folder of symlinks) put first on PYTHONPATH, so the installed checkout is not used. Both trainings run the recipe with the training script of its folder (train/<folder>.py; default: the
toy quickstart's recipes/medusa/toy.yaml, whose drafter section is `model:` before draftsmith 0.2 and `draft:`
after; the overrides are the same) with one thread each; then both evaluators decode the same held-out prompts
with the NEW checkpoint. Prints whether the final weights are bit-identical, whether metrics.jsonl matches
(wall-time fields excluded), and tau / alpha / acceptance / per-prompt rows of the two reports; exit 1 on any
difference.

Feeds docs/DEVLOG.md, "Refactor check: behaviour unchanged".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("config", "models", "data", "train", "eval", "ship", "toy", "scripts", "recipes")
EVAL = [
    "--data",
    "stdlib:heldout",
    "--num-prompts",
    "20",
    "--max-new-tokens",
    "96",
    "--depth",
    "3",
    "--tree",
    "topk:3",
    "--check-lossless",
    "--no-progress",
]


def _old_checkout(rev: str, root: Path) -> tuple[Path, Path]:
    """`(source tree, PYTHONPATH folder)` of `rev`."""
    src = root / "src"
    subprocess.run(["git", "worktree", "add", "-f", "-q", str(src), rev], cwd=REPO, check=True)
    if (src / "src" / "draftsmith").is_dir():  # the src/ layout (draftsmith 0.3 on)
        return src, src / "src"
    pkg = root / "pkg" / "draftsmith"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").touch()  # a regular package, so the installed draftsmith cannot take its place
    for name in PACKAGES:
        if (src / name).is_dir():
            (pkg / name).symlink_to(src / name)
    return src, pkg.parent


def _run(cmd: list[str], log: Path, pythonpath: Path | None) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    with log.open("w") as out:
        code = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=log.parent).returncode
    if code != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} ... failed (exit {code}); see {log}")


def _metrics(run: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


def _method(recipe: str) -> str:
    """The training script a recipe runs: its folder under recipes/ (`eagle/eagle3_toy.yaml` -> eagle), as the
    recipes are laid out (distill's folder is its method too)."""
    return recipe.split("/", 1)[0]


def compare(rev: str, target: str, recipe: str, work: Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file

    src, pythonpath = _old_checkout(rev, work)
    try:
        cli = "import sys; from draftsmith.scripts.cli import main; sys.exit(main(sys.argv[1:]))"
        procs = {}
        for name, tree, path in (("old", src, pythonpath), ("new", REPO, None)):
            cmd = [
                sys.executable,
                str(tree / "train" / f"{_method(recipe)}.py"),
                "--config",
                str(tree / "recipes" / recipe),
                f"target.path={target}",
                f"output_dir={work / name}",
                *overrides,
            ]
            procs[name] = (cmd, work / f"{name}-train.log", path)
        # One after the other: the timings are not compared, the bits are.
        for cmd, log, path in procs.values():
            _run(cmd, log, path)
        final = work / "new" / "final"
        for name, path in (("old", pythonpath), ("new", None)):
            _run(
                [
                    sys.executable,
                    "-c",
                    cli,
                    "eval",
                    "--target",
                    target,
                    "--drafter",
                    str(final),
                    *EVAL,
                    "--report",
                    str(work / f"{name}-eval.json"),
                ],
                work / f"{name}-eval.log",
                path,
            )
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(src)], cwd=REPO, check=False)
    a, b = (load_file(str(work / n / "final" / "model.safetensors")) for n in ("old", "new"))
    ra, rb = (json.loads((work / f"{n}-eval.json").read_text()) for n in ("old", "new"))

    def rows(report: dict[str, Any]) -> list[tuple[Any, ...]]:
        return [
            (r.get("id"), r.get("turn"), r.get("accepted"), r.get("new_tokens")) for r in report["per_prompt"]
        ]

    return {
        "weights_bit_identical": a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a),
        "metrics_identical": _metrics(work / "old") == _metrics(work / "new"),
        "tau": (ra["tau"], rb["tau"]),
        "alpha": (ra["alpha"], rb["alpha"]),
        "acceptance_by_depth_identical": ra["acceptance_by_depth"] == rb["acceptance_by_depth"],
        "target_forwards": (ra["target_forwards"], rb["target_forwards"]),
        "per_prompt_rows_identical": rows(ra) == rows(rb),
        "lossless": (ra["lossless"], rb["lossless"]),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.compare_revisions",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rev", required=True, help="the older git revision (e.g. the commit before a refactor)")
    p.add_argument("--target", required=True, help="a built toy target directory (draftsmith build-target)")
    p.add_argument(
        "--recipe", default="medusa/toy.yaml", help="recipe under recipes/ (default medusa/toy.yaml)"
    )
    p.add_argument("--work", type=Path, default=None, help="working folder (default: a temporary one)")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="recipe overrides for both trainings (train.max_steps=40)",
    )
    args = p.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="draftsmith-compare-"))
    work.mkdir(parents=True, exist_ok=True)
    result = compare(args.rev, str(Path(args.target).expanduser()), args.recipe, work, args.overrides)
    for key, value in result.items():
        print(f"{key}: {value}")
    same = all(v is True for k, v in result.items() if k.endswith("identical")) and all(
        x == y for k, (x, y) in ((k, v) for k, v in result.items() if isinstance(v, tuple))
    )
    print("IDENTICAL" if same else "DIFFERENT")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
