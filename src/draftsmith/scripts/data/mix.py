"""`draftsmith data mix`: many data sources in one deduplicated, shuffled training file, its mix recorded.

    draftsmith data mix ../shared/data/gsm8k/train.jsonl wiki.txt hf:owner/name stdlib:train@2000 \\
        --exclude mt_bench.jsonl --exclude gsm8k/test.jsonl --target DIR --out mix.jsonl

Each SOURCE is anything a recipe's `data.train` reads (a file, a `save_to_disk` directory, `hf:owner/name[:split]`,
`stdlib[:split]`, `prompts[:split]`), optionally `SOURCE@N` for at most its first N records. Records whose text
repeats one already kept (case and whitespace aside) are dropped, and so are records whose first user turn is
a prompt of an `--exclude` source (the evaluation sets: they must stay held out). The result is shuffled with
--seed, so any first N records of it are a smaller sample of the same mix (a scaling curve's points are
prefixes: `data.max_samples=N`).

OUT is `messages` / `text` JSON lines that every recipe reads, each record naming its `source`; OUT.meta.json
records each source (records read, kept, duplicates, held out, tokens with --target's tokenizer, the file's
sha256), the seed and the exclude sources. Train on text the target did not write with EAGLE-3's
`draft.labels=top1` (the target's own greedy tokens as labels, cached with its features). The mix is
deterministic: the same command writes the same bytes, so rerunning it is safe.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from draftsmith.data.formats import Conversation
from draftsmith.data.mix import DOCUMENT_CHARS, WRITER, SourceSpec, local_sha256, mix_sources
from draftsmith.runtime.display import table
from draftsmith.runtime.errors import UserError, run_main
from draftsmith.runtime.files import atomic_file, check_output_file, write_json

META_SUFFIX = ".meta.json"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="draftsmith data mix", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "sources", nargs="+", metavar="SOURCE[@N]", help="data sources, in order (N: at most N records)"
    )
    p.add_argument("--out", type=Path, required=True, help="the mixed JSON-lines file to write")
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="SOURCE",
        help="held-out prompts (an evaluation set) that no training record may start with; repeatable",
    )
    p.add_argument(
        "--target",
        help="a target directory whose tokenizer counts each source's tokens (recorded in the meta)",
    )
    p.add_argument("--seed", type=int, default=0, help="the shuffle's seed (default 0)")
    p.add_argument(
        "--document-chars",
        type=int,
        default=DOCUMENT_CHARS,
        help=f"cut documents (text records) into pieces of at most this many characters at paragraph "
        f"boundaries, each a record (default {DOCUMENT_CHARS}: about 500 tokens of English)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.document_chars < 100:
        parser.error("--document-chars must be >= 100")
    try:
        specs = [SourceSpec.parse(s) for s in args.sources]
    except ValueError as err:
        raise UserError(str(err)) from None
    out: Path = args.out.expanduser()
    check_output_file(out, "--out")
    meta_path = out.with_name(out.name + META_SUFFIX)
    if out.exists() and not _written_by_mix(meta_path):
        raise UserError(
            f"--out {out} exists and is not a `{WRITER}` output (no {meta_path.name} beside it); choose another "
            "file or remove it"
        )
    count_tokens = _token_counter(args.target) if args.target else None
    mix = mix_sources(specs, args.exclude, args.seed, count_tokens, local_sha256, args.document_chars)
    if not mix.records:
        raise UserError("the mix is empty: every record was empty, a duplicate or a held-out prompt")
    with atomic_file(out) as tmp, tmp.open("w", encoding="utf-8") as f:
        for record in mix.records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    write_json(meta_path, mix.meta())
    rows = [
        [
            c.source,
            c.records,
            c.kept,
            c.duplicates,
            c.held_out,
            c.empty,
            "-" if c.tokens is None else f"{c.tokens:,}",
        ]
        for c in mix.counts
    ]
    print("\n".join(table(["source", "read", "kept", "duplicates", "held out", "empty", "tokens"], rows)))
    tokens = mix.meta()["tokens"]
    print(
        f"wrote {len(mix.records):,} records{'' if tokens is None else f' ({tokens:,} tokens)'} to {out} "
        f"(seed {args.seed}; {mix.excluded_prompts:,} held-out prompts kept out); the mix is in {meta_path}"
    )
    return 0


def _written_by_mix(meta_path: Path) -> bool:
    try:
        return json.loads(meta_path.read_text()).get("written_by") == WRITER
    except (OSError, ValueError, AttributeError):
        return False


def _token_counter(target: str):  # noqa: ANN202 (a closure over the tokenizer)
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(target)
    except (OSError, ValueError) as err:
        raise UserError(f"--target {target}: cannot load its tokenizer ({err})") from None

    def count(conv: Conversation) -> int:
        texts = [conv.text] if conv.text is not None else [str(m.get("content") or "") for m in conv.messages]
        return sum(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])

    return count


if __name__ == "__main__":
    sys.exit(run_main(main))
