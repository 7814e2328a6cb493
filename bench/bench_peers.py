r"""draftsmith against peers' trainers, trained alike and measured by the same evaluator: EAGLE-3 (default) or
DFlash (`--family dflash`).

    python -m bench.bench_peers --target DIR --out DIR \
        --modelopt-python /tmp/peers/venv/bin/python --speculators-python /tmp/peers/spec-venv/bin/python
    python -m bench.bench_peers --family dflash --target DIR --out DIR --modelopt-python /tmp/peers/venv/bin/python \
        --speculators-python /tmp/peers/spec-venv/bin/python

Peers live in their own virtual environments (never dependencies of draftsmith); this script drives them
through `bench/peers/*.py` with each environment's python:
- NVIDIA ModelOpt 0.47: `pip install torch==2.13.0 "transformers<5.15" "nvidia-modelopt==0.47.*" requests
  accelerate datasets`. EAGLE-3 through bench/peers/modelopt_eagle3.py, DFlash through
  bench/peers/modelopt_dflash.py.
- vLLM speculators 0.9: `pip install torch==2.13.0 transformers==5.19.0 "datasets<=5.1" accelerate` plus
  speculators' pure-python requirements (aiohttp click httpx huggingface-hub loguru numpy openai protobuf psutil
  pydantic pydantic-settings rich safetensors tqdm typer, and `--no-deps hs-connectors==0.9.0`), then
  `pip install --no-deps speculators==0.9.0` (it requires torchvision / torchaudio, which have no CPU build
  here and which its trainers never import). EAGLE-3 through bench/peers/speculators_eagle3.py, trained twice:
  with its default optimizer (Muon) and with AdamW (draftsmith's). Its 0.9 default EAGLE-3 architecture adds
  three norms that EAGLE-3 does not have; the driver trains the EAGLE-3 architecture (`--arch classic`), the
  one the converter can map. DFlash through bench/peers/speculators_dflash.py, with AdamW and every draft
  layer full attention (its default sliding-window layers attend causally inside the block; that file
  explains).

Both see the same target, the same training samples (draftsmith's pipeline renders and truncates them; the
peer gets the token ids and answer masks as JSONL, padded to one length as ModelOpt requires), the same
number of optimizer steps, batch size, learning-rate peak and warm-up. EAGLE-3: the same TTT depth and
draft-vocabulary size; each keeps its own loss weighting and vocabulary selection. DFlash: the same block
size, draft layers, taps, anchors per sequence, mask token and slot weights exp(-(k-1)/gamma); draftsmith
trains against the target's distribution (`objective.loss=kl`, as ModelOpt's default distillation does, and
speculators with `--loss-fn kl_div`).
ModelOpt 0.47 takes exactly one tap per draft layer, so both default to z-lab's spread for --draft-layers
(the 8-layer toy target, 2 layers: canonical 2, 6, ModelOpt's outputs 1, 5) instead of the toy recipe's three
taps. The peer's export is converted (bench/convert_peers.py) and both drafters are measured by draftsmith's
evaluator on the same held-out prompts: EAGLE-3 as a chain and the dynamic tree `dynamic:4:16`, DFlash as a
chain and `topk:3` (bench/bench_block.py's cells), at T=0 and T=1.

Feeds docs/BENCHMARKS.md, "EAGLE-3 against NVIDIA ModelOpt 0.47 and vLLM speculators 0.9" and "DFlash against the
peers' DFlash".
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

import torch

from draftsmith.runtime.display import table as md_table

REPO = Path(__file__).resolve().parents[1]


def export_training_data(
    target: Any, out: Path, max_len: int, max_samples: int | None, train: list[str] | None = None
) -> tuple[Path, int, int]:
    """draftsmith's training samples as JSONL {input_ids, loss_mask}; returns (path, samples, answer tokens).

    `train` None: the toy recipes' data (stdlib:train, stdlib:heldout held out); otherwise those files with
    5 % held out, as the SmolLM2 recipes split them (the same seed, so the same samples as draftsmith trains on).
    """
    from draftsmith.train.core.data import DataConfig, build_datasets

    config = (
        DataConfig(train=["stdlib:train"], eval=["stdlib:heldout"], max_len=max_len, max_samples=max_samples)
        if train is None
        else DataConfig(train=train, eval=[], eval_fraction=0.05, max_len=max_len, max_samples=max_samples)
    )
    data = build_datasets(config, target.tokenizer, seed=0, progress=False)
    out.mkdir(parents=True, exist_ok=True)
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


def eagle3_peer_command(
    peer: dict[str, Any],
    python: str,
    target: str,
    data: Path,
    out: Path,
    steps: int,
    seq_len: int,
    lr: float,
    batch_size: int,
    ttt_steps: int,
    draft_vocab_size: int,
    warmup_steps: int | None = None,
) -> list[str]:
    """The command that trains one EAGLE-3 peer (`PEERS["eagle3"][name]`) on `data` with draftsmith's settings."""
    return [
        python,
        str(REPO / "bench" / "peers" / peer["script"]),
        *("--model", target, "--data", str(data), "--out", str(out), "--steps", str(steps)),
        *("--seq-len", str(seq_len), "--lr", str(lr), "--batch-size", str(batch_size)),
        *("--warmup-steps", str(steps // 10 if warmup_steps is None else warmup_steps)),
        *("--lr-scheduler", "cosine", *peer["args"]),
        *("--ttt-steps", str(ttt_steps), "--draft-vocab-size", str(draft_vocab_size)),
    ]


PEERS: dict[str, dict[str, dict[str, Any]]] = {
    "eagle3": {
        "modelopt": {"python": "modelopt_python", "script": "modelopt_eagle3.py", "args": []},
        "speculators-muon": {
            "python": "speculators_python",
            "script": "speculators_eagle3.py",
            "args": ["--optimizer", "muon", "--arch", "classic"],
        },
        "speculators-adamw": {
            "python": "speculators_python",
            "script": "speculators_eagle3.py",
            "args": ["--optimizer", "adamw", "--arch", "classic"],
        },
    },
    "dflash": {
        "modelopt": {"python": "modelopt_python", "script": "modelopt_dflash.py", "args": []},
        "speculators": {"python": "speculators_python", "script": "speculators_dflash.py", "args": []},
    },
}
TREES = {"eagle3": ("chain", "dynamic:4:16"), "dflash": ("chain", "topk:3")}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--family", choices=sorted(PEERS), default="eagle3", help="the drafter family compared"
    )
    parser.add_argument("--target", required=True, help="toy target directory (small preset)")
    parser.add_argument("--modelopt-python", help="python of the ModelOpt virtual environment")
    parser.add_argument("--speculators-python", help="python of the speculators virtual environment")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-len", type=int, default=384)
    parser.add_argument("--max-samples", type=int, default=2400)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--ttt-steps", type=int, default=7)
    parser.add_argument("--draft-vocab-size", type=int, default=1024)
    dflash = parser.add_argument_group("DFlash (--family dflash; defaults: recipes/dflash/toy.yaml)")
    dflash.add_argument("--block-size", type=int, default=8)
    dflash.add_argument("--draft-layers", type=int, default=2)
    dflash.add_argument(
        "--taps",
        default=None,
        help="comma-separated canonical ids of the fused target layers, one per draft layer (ModelOpt 0.47's rule); "
        "default: z-lab's spread, the default of both",
    )
    dflash.add_argument("--num-anchors", type=int, default=64)
    dflash.add_argument("--decay-gamma", type=float, default=4.0, help="slot k weighs exp(-(k-1)/gamma)")
    dflash.add_argument(
        "--dflash-loss", default="kl", help="draftsmith's objective.loss (ModelOpt distils: kl)"
    )
    parser.add_argument(
        "--peers",
        default=None,
        help="comma-separated peers to compare (default: every peer of the family whose --*-python is given)",
    )
    parser.add_argument("--num-prompts", type=int, default=20)
    parser.add_argument(
        "--train",
        default="all",
        help="comma-separated drafters to (re)train (draftsmith, modelopt, speculators-muon, speculators-adamw; "
        "DFlash: draftsmith, modelopt, speculators), 'all' (default) or 'none': the others are reused from --out",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    from bench.convert_peers import modelopt_dflash, modelopt_eagle3, speculators_dflash, speculators_eagle3
    from draftsmith.eval.acceptance import EvalArgs, evaluate
    from draftsmith.eval.drafters import load_drafter_spec
    from draftsmith.models.dflash import default_feature_layers, pick_mask_token
    from draftsmith.models.target import FrozenTarget, TargetConfig
    from draftsmith.train import dflash as dflash_recipe
    from draftsmith.train import eagle as eagle_recipe
    from draftsmith.train.core.metrics import read_metrics

    family = PEERS[args.family]
    peers = {name: p for name, p in family.items() if getattr(args, p["python"])}
    if args.peers:
        unknown = set(args.peers.split(",")) - set(peers)
        if unknown:
            parser.error(
                f"--peers {args.peers}: {', '.join(sorted(unknown))} is not a {args.family} peer whose python "
                f"was given (available: {', '.join(peers) or 'none'})"
            )
        peers = {name: p for name, p in peers.items() if name in args.peers.split(",")}
    if not peers:
        parser.error(
            f"pass the python of a {args.family} peer's virtual environment: "
            + ", ".join(sorted({"--" + p["python"].replace("_", "-") for p in family.values()}))
        )
    target = FrozenTarget.load(TargetConfig(path=args.target))
    data, samples, answer_tokens = export_training_data(target, args.out, args.max_len, args.max_samples)
    steps = samples // args.batch_size  # one epoch, as the draftsmith toy recipe
    print(
        f"training data: {samples} samples, {answer_tokens} answer tokens, {steps} steps of {args.batch_size}"
    )
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    train = set(family) | {"draftsmith"} if args.train == "all" else set(args.train.split(",")) - {"none"}
    unknown = train - set(family) - {"draftsmith"}
    if unknown:
        parser.error(f"--train: unknown {args.family} drafters {sorted(unknown)}")
    taps = (
        [int(t) for t in args.taps.split(",")]
        if args.taps
        else default_feature_layers(target.num_layers, args.draft_layers)
    )
    mask = pick_mask_token(target.tokenizer, int(target.embed_tokens.weight.shape[0]))  # draftsmith's default
    for name, peer in peers.items():
        if name in train and args.family == "eagle3":
            cmd = eagle3_peer_command(
                peer,
                getattr(args, peer["python"]),
                args.target,
                data,
                args.out / name,
                steps,
                args.max_len,
                args.lr,
                args.batch_size,
                args.ttt_steps,
                args.draft_vocab_size,
            )
        elif name in train:
            cmd = [
                getattr(args, peer["python"]),
                str(REPO / "bench" / "peers" / peer["script"]),
                *("--model", args.target, "--data", str(data), "--out", str(args.out / name)),
                *("--steps", str(steps), "--seq-len", str(args.max_len), "--lr", str(args.lr)),
                *("--batch-size", str(args.batch_size), "--warmup-steps", str(steps // 10)),
                *("--lr-scheduler", "cosine", *peer["args"]),
                *("--block-size", str(args.block_size), "--num-draft-layers", str(args.draft_layers)),
                *("--mask-token-id", str(mask)),
            ]
            if name == "modelopt":  # ModelOpt's ids name layer OUTPUTS: canonical - 1
                cmd += [
                    "--target-layer-ids",
                    ",".join(str(t - 1) for t in taps),
                    "--num-anchors",
                    str(args.num_anchors),
                    "--loss-objective",
                    "decay",
                    "--loss-decay",
                    str(args.decay_gamma),
                ]
            else:  # speculators' ids are canonical; its loss is named as draftsmith's objective.loss
                loss = {"kl": "kl_div"}.get(args.dflash_loss, args.dflash_loss)
                # its anchors are per packed row, and a row packs about --batch-size samples
                cmd += [
                    "--aux-layers",
                    ",".join(map(str, taps)),
                    "--decay-gamma",
                    str(args.decay_gamma),
                    "--num-anchors",
                    str(args.num_anchors * args.batch_size),
                    "--loss-fn",
                    loss,
                ]
        else:
            continue
        subprocess.run(cmd, check=True, env=env)
    if "draftsmith" in train:
        common = [
            f"target.path={args.target}",
            f"output_dir={args.out / 'draftsmith'}",
            f"data.max_len={args.max_len}",
            f"data.max_samples={args.max_samples}",
            f"train.micro_batch_size={args.batch_size}",
            f"train.lr={args.lr}",
            f"train.max_steps={steps}",
        ]
        if args.family == "eagle3":
            eagle_recipe.main(
                [
                    "--config",
                    str(REPO / "recipes" / "eagle" / "eagle3_toy.yaml"),
                    *common,
                    f"draft.ttt_steps={args.ttt_steps}",
                    f"draft.draft_vocab_size={args.draft_vocab_size}",
                ]
            )
        else:
            dflash_recipe.main(
                [
                    "--config",
                    str(REPO / "recipes" / "dflash" / "toy.yaml"),
                    *common,
                    f"draft.block_size={args.block_size}",
                    f"draft.num_layers={args.draft_layers}",
                    f"draft.feature_layers=[{','.join(map(str, taps))}]",
                    f"draft.num_feature_layers={len(taps)}",
                    f"draft.num_anchors={args.num_anchors}",
                    f"draft.decay_gamma={args.decay_gamma}",
                    f"draft.mask_token_id={mask}",
                    f"objective.loss={args.dflash_loss}",
                ]
            )
    ours = [
        r["perf/step_s"]
        for r in read_metrics(args.out / "draftsmith" / "metrics.jsonl")
        if "perf/step_s" in r
    ]
    step_s = {"draftsmith": sum(ours[1:]) / max(1, len(ours) - 1)}  # the first window includes warm-up
    threads = {"draftsmith": torch.get_num_threads()}
    versions, checkpoints = {}, {"draftsmith": args.out / "draftsmith" / "final"}
    for name in peers:
        log = json.loads((args.out / name / "train_log.json").read_text())
        step_s[name] = log["mean_step_s_excl_first"]
        versions[name] = log.get("versions")
        threads[name] = log.get("torch_threads")
        if args.family == "dflash":
            convert = modelopt_dflash if name == "modelopt" else speculators_dflash
            checkpoints[name] = convert(args.out / name, target, args.out / f"{name}-converted")
        else:
            convert = modelopt_eagle3 if name == "modelopt" else speculators_eagle3
            checkpoints[name] = convert(
                args.out / name, target, args.out / f"{name}-converted", args.ttt_steps
            )

    rows = []
    for name, ckpt in checkpoints.items():
        drafter = load_drafter_spec(str(ckpt), target)
        for temperature in (0.0, 1.0):
            for tree in TREES[args.family]:
                # EAGLE-3 checks both T=0 cells against plain decoding; DFlash the chain, as bench_block does.
                check = temperature == 0 and (args.family == "eagle3" or tree == "chain")
                t0 = time.perf_counter()
                r = evaluate(
                    EvalArgs(
                        target=args.target,
                        drafter=str(ckpt),
                        data="stdlib:heldout",
                        num_prompts=args.num_prompts,
                        max_new_tokens=96,
                        depth=5,
                        tree=tree,
                        temperature=temperature,
                        check_lossless=check,
                        baseline=check,
                        progress=False,
                    ),
                    target,
                    drafter,
                )
                row = {
                    "drafter": name,
                    "T": temperature,
                    "tree": tree,
                    "tau": r["tau"],
                    "tau_stderr": r["tau_stderr"],
                    "alpha": r["alpha"],
                    "lossless": r["lossless"],
                    "eval_s": time.perf_counter() - t0,
                }
                print(json.dumps(row), flush=True)
                rows.append(row)
    result = {
        "family": args.family,
        "samples": samples,
        "answer_tokens": answer_tokens,
        "steps": steps,
        "step_s": step_s,
        "torch_threads": threads,
        "peer_versions": versions,
        "rows": rows,
    }
    if args.family == "dflash":
        result["dflash"] = {
            "block_size": args.block_size,
            "draft_layers": args.draft_layers,
            "taps": taps,
            "num_anchors": args.num_anchors,
            "decay_gamma": args.decay_gamma,
            "mask_token_id": mask,
            "draftsmith_loss": args.dflash_loss,
        }
    (args.out / "peers.json").write_text(json.dumps(result, indent=2) + "\n")
    print(format_table(rows, step_s, threads, TREES[args.family]))
    return 0


def format_table(
    rows: list[dict[str, Any]],
    step_s: dict[str, float],
    threads: dict[str, Any],
    trees: tuple[str, ...] = TREES["eagle3"],
) -> str:
    """Markdown: tau per drafter and setting, its ratio to the best peer, and the training step time."""
    cells = [(t, tree) for t in (0.0, 1.0) for tree in trees]
    tau = {(r["drafter"], r["T"], r["tree"]): r["tau"] for r in rows}
    names = list(dict.fromkeys(r["drafter"] for r in rows))
    header = ["", *(f"T={t:g} {tree}" for t, tree in cells), "training step"]
    lines = [
        [
            name,
            *(f"{tau[(name, t, tr)]:.3f}" for t, tr in cells),
            f"{step_s[name]:.2f} s ({threads.get(name)} threads)",
        ]
        for name in names
    ]
    peers = [n for n in names if n != "draftsmith"]
    if peers and "draftsmith" in names:
        best = [max(tau[(p, t, tr)] for p in peers) for t, tr in cells]
        ratios = [tau[("draftsmith", t, tr)] / b for (t, tr), b in zip(cells, best, strict=True)]
        lines.append(["draftsmith / best peer", *(f"{r:.3f}" for r in ratios), ""])
    return "\n".join(md_table(header, lines))


if __name__ == "__main__":
    sys.exit(main())
