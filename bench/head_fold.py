r"""Greedy answers at a batch of 64 with and without the LM head's stride fix (docs/BENCHMARKS.md, "The head's
copy in generate's prefill"): wall time, tokens/s and how many answers are identical token for token.

    python -m bench.head_fold --target DIR [--data prompts:train] [--batch 64] [--max-new-tokens 192] \
        [--dtypes bfloat16,float32] [--repeats 3]

One length-sorted batch of `--data` (the second that `data regenerate --target` would cut, first turns only),
answered by `regenerate_local.generate_batch` as `data regenerate` runs it: once as loaded (the head's
`foldable_input` pre-hook in place) and once with that hook removed, the state before it existed, in turn
`--repeats` times (bench/answer_race.py). Set
ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 for a CPU without AVX-512.
"""

from __future__ import annotations

import sys
from typing import Any

from bench.answer_race import Variants, parser, race


def main() -> int:
    args = parser(__doc__, "bfloat16,float32").parse_args()
    race(args, head_variants)
    return 0


def head_variants(target: Any) -> Variants:
    """The LM head with its `foldable_input` pre-hook (as loaded) and without it, the state before it existed."""
    head = target.model.get_output_embeddings()
    hooks = dict(head._forward_pre_hooks)

    def with_hooks(keep: bool) -> None:
        head._forward_pre_hooks.clear()
        if keep:
            head._forward_pre_hooks.update(hooks)

    return {"head fix": lambda _: with_hooks(True), "without": lambda _: with_hooks(False)}


if __name__ == "__main__":
    sys.exit(main())
