"""What the machine computes fast: whether bfloat16 matrix products run natively."""

from __future__ import annotations

from pathlib import Path

import torch

# CPU flags (Linux /proc/cpuinfo) of native bfloat16 dot products. Without them oneDNN emulates bfloat16, which
# is slower than float32; with them a bfloat16 product ran 3.8-4.8x faster than float32 here (docs/BENCHMARKS.md).
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def native_bfloat16(device: torch.device | str = "cpu", cpuinfo: str | None = None) -> bool:
    """True when `device` multiplies bfloat16 matrices natively: a CUDA device that supports bfloat16, or a CPU
    whose flags list AVX512-BF16 or AMX-BF16 (`cpuinfo`: the text of /proc/cpuinfo, read when None; a machine
    without it, e.g. macOS, counts as without)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text(errors="replace") if path.is_file() else ""
    flags = {word for line in cpuinfo.splitlines() if line.startswith("flags") for word in line.split()}
    return any(flag in flags for flag in BF16_CPU_FLAGS)
