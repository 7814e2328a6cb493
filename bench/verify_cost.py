r"""What a verification forward of n tokens costs the target at batch 1 on a CPU, against one token, and two ways
of making it cheaper that the evaluator does not take (docs/BENCHMARKS.md, "Prompt lookup as a chain, and what a
verification costs"):

    python -m bench.verify_cost --target DIR [--sizes 1,6,16] [--context 200] [--repeats 40] [--dtype float32]

- `as loaded`: the model's own forward over n new tokens after `--context` cached positions (transformers'
  cache), logits at every position as a verification computes them, cut back after each. The evaluator's
  `SpeculativeDecoder.verify_costs` times its own forward, which also captures the drafter's feature layers;
  this one has no drafter, so it can time the same forward with and without packed weights.
- `packed`: every linear layer's weight reordered once into MKL's packed layout for products of n rows
  (`torch.ops.mkl._mkl_reorder_linear_weight`). Also the packed weights' size against the weights'.
- `decode`: plain decoding of `--new` tokens after the context, one token a forward, with transformers'
  concatenating cache against models/growing_cache.py's (which appends in place), in turn `--repeats` times.

Set ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 for a CPU without AVX-512.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, DynamicCache

from draftsmith.models.growing_cache import growing_cache
from draftsmith.models.parts import with_cache


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="a target directory (config.json and weights)")
    p.add_argument("--sizes", default="1,6,16", help="tokens per verification forward")
    p.add_argument("--context", type=int, default=200, help="positions in the cache before each forward")
    p.add_argument("--new", type=int, default=128, help="tokens of the plain-decoding comparison")
    p.add_argument("--repeats", type=int, default=40, help="forwards per size (after 5 not measured)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = p.parse_args()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=getattr(torch, args.dtype)).eval()
    vocab = model.config.get_text_config(decoder=True).vocab_size
    context = torch.randint(0, vocab, (1, args.context))
    sizes = [int(s) for s in args.sizes.split(",")]
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}, context {args.context}"
    )
    print(
        "| tokens n | as loaded (ms) | / one token | MKL-packed weights (ms) | packed bytes / weight bytes |"
    )
    print("|---:|---:|---:|---:|---:|")
    one = None
    for n in sizes:
        loaded = verify_ms(model, context, n, args.repeats)
        one = loaded if one is None else one
        restore = pack_linears(model, n)
        packed = verify_ms(model, context, n, args.repeats)
        ratio = restore()
        print(f"| {n} | {loaded:.1f} | {loaded / one:.2f} | {packed:.1f} | {ratio:.2f} |")
    print()
    print("| plain decoding cache | median tokens/s | runs |")
    print("|---|---:|---|")
    runs: dict[str, list[float]] = {"transformers' DynamicCache": [], "growing cache": []}
    for _ in range(max(1, args.repeats // 10)):
        runs["transformers' DynamicCache"].append(decode_rate(model, context, args.new, DynamicCache))
        runs["growing cache"].append(
            decode_rate(
                model, context, args.new, lambda: growing_cache(model.config, args.context + args.new)
            )
        )
    for name, rates in runs.items():
        print(f"| {name} | {statistics.median(rates):.1f} | {', '.join(f'{r:.1f}' for r in rates)} |")
    return 0


@torch.inference_mode()
def verify_ms(model: Any, context: torch.Tensor, n: int, repeats: int) -> float:
    """Median milliseconds of a forward over `n` tokens after `context` in the cache, cut back after each."""
    cache = DynamicCache()
    model(context, **with_cache(model, cache), use_cache=True)
    ids = context[:, :n]
    times = []
    for i in range(repeats + 5):
        t0 = time.perf_counter()
        model(ids, **with_cache(model, cache), use_cache=True)
        if i >= 5:
            times.append(time.perf_counter() - t0)
        cache.crop(-n)
    return statistics.median(times) * 1e3


def pack_linears(model: nn.Module, rows: int) -> Callable[[], float]:
    """Every `nn.Linear` of `model` computing with MKL-packed weights for products of `rows` rows (other row
    counts fall back to the plain product); returns a function that undoes it and gives the packed weights'
    size over the weights'."""
    packed_numel = weight_numel = 0
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    for lin in linears:
        weight = lin.weight.detach()
        packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)
        packed_numel, weight_numel = packed_numel + packed.numel(), weight_numel + weight.numel()

        def forward(x: torch.Tensor, packed: torch.Tensor = packed, lin: nn.Linear = lin) -> torch.Tensor:
            return torch.ops.mkl._mkl_linear(x, packed, lin.weight, lin.bias, rows)

        lin.forward = forward  # type: ignore[method-assign,assignment]

    def restore() -> float:
        for lin in linears:
            del lin.forward  # back to the class's forward
        return packed_numel / weight_numel

    return restore


@torch.inference_mode()
def decode_rate(model: Any, context: torch.Tensor, new: int, make_cache: Callable[[], Any]) -> float:
    """Tokens/s of greedy plain decoding of `new` tokens after `context` with the cache `make_cache()`."""
    cache = make_cache()
    t0 = time.perf_counter()
    logits = model(context, **with_cache(model, cache), use_cache=True, logits_to_keep=1).logits
    for _ in range(new - 1):
        ids = logits[:, -1:].argmax(-1)
        logits = model(ids, **with_cache(model, cache), use_cache=True, logits_to_keep=1).logits
    return new / (time.perf_counter() - t0)


if __name__ == "__main__":
    sys.exit(main())
