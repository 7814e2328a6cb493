import torch

from draftsmith.runtime.hardware import native_bfloat16

ZEN4 = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512bw avx512_bf16 avx512_vnni\n"
SKYLAKE = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512bw avx512cd\n"  # emulated bfloat16 only
SAPPHIRE = "flags\t\t: avx512f amx_tile amx_bf16\nbugs\t\t: avx512_bf16\n"  # a bug line names no flag


def test_native_bfloat16_on_a_cpu_reads_the_flags_line():
    assert native_bfloat16("cpu", ZEN4)
    assert native_bfloat16(torch.device("cpu"), SAPPHIRE)
    assert not native_bfloat16("cpu", SKYLAKE)
    assert not native_bfloat16("cpu", "")  # no /proc/cpuinfo (macOS): float32
    assert not native_bfloat16("cpu", "bugs\t\t: avx512_bf16\n")  # only the flags line counts
    assert not native_bfloat16("meta")
