"""Can one draft layer learn to copy? Copy tasks in the training data, and the drafter's copying measured.

docs/BENCHMARKS.md, "Copy tasks in the training data, and whether the draft layer copies". Three steps:

    python -m bench.copy_tasks make --documents ../shared/data/llamafactory_demo/c4_demo.jsonl \\
        --articles ../shared/data/llamafactory_demo/wiki_demo.txt --out DIR
    python -m bench.copy_tasks merge CHAT_CACHE COPY_CACHE --out MERGED
    python -m bench.copy_tasks probe --target T --drafter RUN/final --cache COPY_CACHE --samples 40

`make` writes DIR/copy_train.jsonl (chats asking the target to repeat a passage verbatim, the passage as the
answer: the first --train documents and --per-article passages of every article) and DIR/copy_eval.jsonl
(--eval documents from --eval-start on, as held-out `turns` prompts for `draftsmith eval`). Cache the training file with the chat
cache's recipe and settings; `merge` then joins the two caches into one directory (symlinked shards, the first
cache's samples first and unchanged), so a drafter trains on the chat samples plus the copy tasks without
caching the chat answers again. `probe` is the teacher-forced top-1 of each TTT step at a cache's answer
positions against the target's greedy token (`draft.labels: top1`): how well a drafter copies the samples it
was trained on, beside how well it copies held-out ones when decoding.
"""

from __future__ import annotations

import argparse
import json
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from draftsmith.train.cache.store import shard_name, write_index

ASKS = (
    "Repeat the following text exactly.",
    "Copy this text word for word:",
    "Please repeat the text below without changing anything.",
    "Write out the following passage again, exactly as it is.",
    "Echo back this text verbatim.",
)
PASSAGE_CHARS = 700  # about 150 tokens: the answer lengths of the chat data (at most 256 new tokens)
MIN_CUT = 200  # a sentence end this early is not used: the passage is cut at its length instead


def passage(text: str, max_chars: int = PASSAGE_CHARS) -> str:
    """`text`'s opening, cut after the last full sentence within `max_chars` (else at `max_chars`)."""
    text = text.strip()
    if len(text) <= max_chars:
        return text
    head = text[:max_chars]
    end = max(head.rfind(". "), head.rfind(".\n"))
    return head[: end + 1] if end > MIN_CUT else head


def pieces(text: str, max_chars: int = PASSAGE_CHARS) -> list[str]:
    """All of `text` as consecutive passages (`passage` applied again to what is left)."""
    out, rest = [], text.strip()
    while rest:
        out.append(passage(rest, max_chars))
        rest = rest[len(out[-1]) :].strip()
    return out


def copy_chat(text: str, ask: str) -> dict[str, Any]:
    """One copy task: the user asks for `text` verbatim, the answer is `text`."""
    return {
        "messages": [{"role": "user", "content": f"{ask}\n\n{text}"}, {"role": "assistant", "content": text}]
    }


def make(  # noqa: ANN201
    documents: list[str],
    articles: list[str],
    train: int,
    per_article: int,
    evals: int,
    eval_start: int,
    seed: int,
):
    """`(training chats, held-out prompts)`: the openings of the first `train` documents and the first
    `per_article` consecutive passages of each article as copy chats (shuffled with `seed`); the openings of
    `evals` documents from `eval_start` on as `turns` prompts."""
    if eval_start < train:
        raise ValueError(f"the held-out documents start at {eval_start}, inside the {train} trained on")
    rng = random.Random(seed)
    texts = [passage(t) for t in documents[:train]] + [p for a in articles for p in pieces(a)[:per_article]]
    chats = [copy_chat(t, rng.choice(ASKS)) for t in texts]
    rng.shuffle(chats)
    prompts = [
        {"question_id": i, "category": "copy", "turns": [f"{ASKS[0]}\n\n{passage(t)}"]}
        for i, t in enumerate(documents[eval_start : eval_start + evals])
    ]
    return chats, prompts


def merge(first: Path, second: Path, out: Path) -> dict[str, tuple[int, int]]:
    """Join two caches built with the same recipe into `out`: every split's shards, `first`'s then `second`'s
    (symlinked, renumbered), and both caches' data files. Returns each split's `(samples, tokens)`.

    Raises:
        ValueError: the caches differ in target, layers, storage or hidden size, or `out` exists.
    """
    a, b = (json.loads((d / "index.json").read_text()) for d in (first, second))
    for key in ("target", "layers", "storage", "hidden_size", "method"):
        if a.get(key) != b.get(key):
            raise ValueError(f"the caches differ in {key!r}: {a.get(key)!r} against {b.get(key)!r}")
    if out.exists():
        raise ValueError(f"{out} exists: merge into a new directory")
    out.mkdir(parents=True)
    header = {k: v for k, v in a.items() if k not in ("format", "format_version", "splits")}
    header["data"] = dict(a["data"], train=a["data"]["train"] + b["data"]["train"])
    header["data_sha256"] = {**a.get("data_sha256", {}), **b.get("data_sha256", {})}
    splits: dict[str, list[dict[str, Any]]] = {}
    for split in a["splits"]:
        shards = splits[split] = []
        for directory, cache in ((first, a), (second, b)):
            for entry in cache["splits"].get(split, {}).get("shards", []):
                name = f"{shard_name(split, len(shards))}.safetensors"
                os.symlink((directory / entry["file"]).resolve(), out / name)
                start = shards[-1]["samples"][1] if shards else 0
                count = entry["samples"][1] - entry["samples"][0]
                shards.append(dict(entry, file=name, samples=[start, start + count]))
    index = json.loads(write_index(out, header, splits).read_text())
    return {s: (v["samples"], v["tokens"]) for s, v in index["splits"].items()}


def step_hits(
    pred: list[torch.Tensor], top1: torch.Tensor, answer: torch.Tensor
) -> tuple[list[int], list[int]]:
    """`(hits, counts)` per TTT step s for one sample: column t's prediction `pred[s][t]` (target ids) against
    the target's greedy token `top1[t + s + 1]`, counted where position t + s + 1 is an answer position."""
    hits, counts = [], []
    for s, p in enumerate(pred):
        n = len(top1) - s - 1
        where = answer[s + 1 : s + 1 + n]
        hits.append(int(((p[:n] == top1[s + 1 : s + 1 + n]) & where).sum()))
        counts.append(int(where.sum()))
    return hits, counts


def probe(target_dir: str, drafter: str, cache: Path, samples: int) -> list[float]:
    """Teacher-forced top-1 per TTT step of `drafter` over the first `samples` training samples of `cache`."""
    from draftsmith.models.checkpoint import load_drafter
    from draftsmith.models.target import TOP1, FrozenTarget, TargetConfig, feature_key
    from draftsmith.train.cache.store import FeatureCache

    target = FrozenTarget.load(TargetConfig(path=target_dir), layers=0)
    model, _ = load_drafter(drafter, target)
    opened = FeatureCache.open(cache, verify=False, progress=False)
    layers = [lid for lid in opened.layers if lid != TOP1]
    data = opened.dataset("train")
    hits = torch.zeros(model.config.ttt_steps)
    counts = torch.zeros_like(hits)
    for i in range(min(samples, len(data))):
        item = data[i]
        features = torch.cat([item[feature_key(lid)] for lid in layers], -1)[None]
        with torch.no_grad():
            hidden = model.unroll_hidden(features, item["input_ids"][None])
        pred = [model.to_target_ids(model.logits(h).argmax(-1))[0] for h in hidden]
        h, c = step_hits(pred, item[feature_key(TOP1)].long(), item["loss_mask"])
        hits += torch.tensor(h, dtype=hits.dtype)
        counts += torch.tensor(c, dtype=counts.dtype)
    return (hits / counts.clamp(min=1)).tolist()


def _read_documents(path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()]


def _read_articles(path: Path) -> list[str]:
    return [line for line in path.read_text().split("\n") if len(line) > 400]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.copy_tasks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("make", help="write the copy chats and the held-out copy prompts")
    p.add_argument("--documents", type=Path, required=True, help="a JSON-lines file of {text} documents")
    p.add_argument("--articles", type=Path, help="a text file of articles, one per line")
    p.add_argument("--train", type=int, default=170, help="documents made into training chats")
    p.add_argument(
        "--per-article", type=int, default=1, help="consecutive passages of each article trained on"
    )
    p.add_argument("--eval", type=int, default=20, help="documents made into held-out prompts")
    p.add_argument("--eval-start", type=int, default=200, help="the first held-out document")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--out", type=Path, required=True, help="a directory for copy_train.jsonl and copy_eval.jsonl"
    )
    m = sub.add_parser("merge", help="join two caches of the same recipe (symlinked shards)")
    m.add_argument("first", type=Path)
    m.add_argument("second", type=Path)
    m.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("probe", help="teacher-forced top-1 per TTT step on a cache's answer positions")
    r.add_argument("--target", required=True)
    r.add_argument("--drafter", required=True, help="an EAGLE-3 checkpoint (a run's final/)")
    r.add_argument("--cache", type=Path, required=True, help="a cache built with draft.labels=top1")
    r.add_argument("--samples", type=int, default=40)
    args = parser.parse_args(argv)
    if args.command == "make":
        articles = _read_articles(args.articles) if args.articles else []
        chats, prompts = make(
            _read_documents(args.documents),
            articles,
            args.train,
            args.per_article,
            args.eval,
            args.eval_start,
            args.seed,
        )
        args.out.mkdir(parents=True, exist_ok=True)
        for name, rows in (("copy_train.jsonl", chats), ("copy_eval.jsonl", prompts)):
            (args.out / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
        print(f"{len(chats)} copy chats and {len(prompts)} held-out prompts in {args.out}")
    elif args.command == "merge":
        print(merge(args.first, args.second, args.out))
    else:
        top1 = probe(args.target, args.drafter, args.cache, args.samples)
        from draftsmith.train.core.metrics import chain_tau_estimate

        estimate = chain_tau_estimate(top1)
        print(f"top-1 by step {' '.join(f'{x:.3f}' for x in top1)}; tau estimate {estimate:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
