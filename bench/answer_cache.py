r"""Greedy answers at a batch of 64 with the cache that appends in place and with transformers' concatenating
one (docs/BENCHMARKS.md, "Appending in place"): wall time, tokens/s and how many answers are identical token
for token.

    python -m bench.answer_cache --target DIR [--data prompts:train] [--batch 64] [--max-new-tokens 192] \
        [--dtypes float32] [--repeats 3] [--static]

The batch of bench/head_fold.py (the second that `data regenerate --target` cuts from `--data`, first turns),
answered by `regenerate_local.generate_batch` as `data regenerate` runs it, once with its growing cache
(`answer_cache`) and once with none passed (`generate` then builds transformers' `DynamicCache`), in turn
`--repeats` times (bench/answer_race.py); `--static` adds a third, transformers' static cache
(`cache_implementation="static"`). Set ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
MKL_ENABLE_INSTRUCTIONS=AVX2 for a CPU without AVX-512.
"""

from __future__ import annotations

import sys
from typing import Any

from bench.answer_race import Variants, parser, race


def main() -> int:
    p = parser(__doc__, "float32")
    p.add_argument("--static", action="store_true", help="also answer with transformers' static cache")
    args = p.parse_args()
    from draftsmith.scripts.data import regenerate_local

    growing = regenerate_local.answer_cache
    try:
        race(args, lambda target: cache_variants(regenerate_local, growing, args.static))
    finally:
        regenerate_local.answer_cache = growing
    return 0


def cache_variants(regenerate_local: Any, growing: Any, static: bool) -> Variants:
    """`generate_batch`'s cache swapped in turn: the growing one, none (`generate` builds its concatenating
    `DynamicCache`) and, with `static`, `generate`'s static cache (`answer_cache`'s keywords go to `generate`)."""

    def use(cache: Any) -> None:
        regenerate_local.answer_cache = cache

    variants = {
        "growing cache": lambda _: use(growing),
        "concatenating": lambda _: use(lambda model, room: {}),
    }
    if static:
        variants["static cache"] = lambda _: use(lambda model, room: {"cache_implementation": "static"})
    return variants


if __name__ == "__main__":
    sys.exit(main())
