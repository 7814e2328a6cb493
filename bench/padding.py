"""How many of a training step's positions are padding, with and without length grouping, beside sequence
packing (docs/BENCHMARKS.md, "Padding, grouping and packing").

    python -m bench.padding --target DIR [--data SOURCE ...] [--max-len 320 2048] [--micro-batch 8 32 64]

Each source's conversations are rendered with the target's chat template and cut to max_len, as training does;
then one epoch of StepSchedule's micro batches is laid out: padded to each batch's longest sample (random
order, or `train.group_by_length`), or packed first-fit-decreasing into rows of max_len tokens padded to the
batch's longest row. Prints the share of positions that are padding in each layout.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from transformers import AutoTokenizer

from draftsmith.runtime.display import table
from draftsmith.train.core.data import DataConfig, build_datasets
from draftsmith.train.core.sampler import StepSchedule


def padded_share(batches: Sequence[Sequence[int]]) -> float:
    """Padding / all positions when each batch is padded to its longest sample."""
    real = sum(sum(b) for b in batches)
    return 1.0 - real / sum(len(b) * max(b) for b in batches)


def packed_share(batches: Sequence[Sequence[int]], max_len: int) -> float:
    """Padding / all positions when each batch's samples are packed first-fit-decreasing into rows of at most
    `max_len` tokens and the rows padded to the longest."""
    real = total = 0
    for batch in batches:
        rows: list[int] = []
        for n in sorted(batch, reverse=True):
            fit = next((i for i, used in enumerate(rows) if used + n <= max_len), None)
            if fit is None:
                rows.append(n)
            else:
                rows[fit] += n
        real += sum(rows)
        total += len(rows) * max(rows)
    return 1.0 - real / total


def epoch_batches(lengths: list[int], micro_batch: int, grouped: bool) -> list[list[int]]:
    """The sample lengths of every micro batch of one epoch (StepSchedule, one process, no accumulation)."""
    schedule = StepSchedule(len(lengths), micro_batch, 1, 1, seed=0, lengths=lengths if grouped else None)
    return [
        [lengths[i] for i in schedule.micro_batches(step, 0)[0]] for step in range(schedule.steps_per_epoch)
    ]


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="a target directory (its tokenizer and chat template)")
    p.add_argument("--data", nargs="+", default=["../shared/data/gsm8k/train.jsonl"])
    p.add_argument("--max-len", nargs="+", type=int, default=[320, 2048])
    p.add_argument("--micro-batch", nargs="+", type=int, default=[8, 32, 64])
    args = p.parse_args(argv)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    rows = []
    for source in args.data:
        for max_len in args.max_len:
            cfg = DataConfig(train=[source], eval_fraction=0.0, max_len=max_len)
            lengths = build_datasets(cfg, tokenizer, seed=0, progress=False).train.lengths
            mean = sum(lengths) / len(lengths)
            for mb in args.micro_batch:
                shares = [
                    padded_share(epoch_batches(lengths, mb, grouped=False)),
                    padded_share(epoch_batches(lengths, mb, grouped=True)),
                    packed_share(epoch_batches(lengths, mb, grouped=False), max_len),
                ]
                name = source.rsplit("/", 1)[-1]
                rows.append([name, f"{len(lengths):,}", f"{mean:.0f}", str(max_len), str(mb)])
                rows[-1] += [f"{s:.1%}" for s in shares]
    header = ["data", "samples", "mean tokens", "max_len", "micro batch", "random", "grouped", "packed"]
    print("\n".join(table(header, rows)))


if __name__ == "__main__":
    main()
