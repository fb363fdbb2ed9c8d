"""The CMake flags chosen for llama.cpp from a CPU's flags, and the warning when a build
leaves some unused."""

from __future__ import annotations

import logging

import pytest
from kode.backends.llama import build_flags

HASWELL = "fpu vme sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2"
# A Sapphire Rapids guest, as this project's development machine lists it (abridged).
SAPPHIRE = (
    HASWELL + " avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx512_bf16 avx512vbmi"
    " avx512_vbmi2 avx512_vnni avx512_bitalg avx512_vpopcntdq avx_vnni amx_bf16 amx_tile"
    " amx_int8 avx512_fp16"
)


def cpuinfo(flags: str) -> str:
    block = f"processor\t: 0\nmodel name\t: a CPU\nflags\t\t: {flags}\nbugs\t\t: spectre_v1\n"
    return block + "\n" + block.replace(": 0", ": 1")


SAPPHIRE_INFO = cpuinfo(SAPPHIRE)


def test_a_cpu_with_avx2_only_gets_the_baseline() -> None:
    args = build_flags.cmake_args(build_flags.cpu_flags(cpuinfo(HASWELL)))
    assert args == list(build_flags.BASE)
    assert "-DGGML_NATIVE=OFF" in args and "-DGGML_AVX2=ON" in args


def test_an_avx512_cpu_gets_its_sets_and_never_amx() -> None:
    args = build_flags.cmake_args(build_flags.cpu_flags(cpuinfo(SAPPHIRE)))
    assert args[: len(build_flags.BASE)] == list(build_flags.BASE)
    assert args[len(build_flags.BASE) :] == [
        "-DGGML_AVX_VNNI=ON",
        "-DGGML_AVX512=ON",
        "-DGGML_AVX512_VBMI=ON",
        "-DGGML_AVX512_VNNI=ON",
        "-DGGML_AVX512_BF16=ON",
    ]
    assert not any("AMX" in a or "NATIVE=ON" in a for a in args)


def test_an_extension_needs_the_whole_avx512_foundation() -> None:
    # avx512_vnni listed without avx512bw (never seen on real parts, but a guest's CPUID
    # can mask anything): neither AVX-512 nor its extension is compiled in.
    flags = build_flags.cpu_flags(cpuinfo(HASWELL + " avx512f avx512cd avx512vl avx512_vnni"))
    assert build_flags.cmake_args(flags) == list(build_flags.BASE)


def test_a_cpu_without_avx2_is_left_to_llama_cpp() -> None:
    assert build_flags.cmake_args(build_flags.cpu_flags(cpuinfo("fpu sse sse2 avx"))) == []
    assert build_flags.cpu_flags("processor\t: 0\n") == frozenset()


def test_unused_sets_are_read_from_the_builds_system_info() -> None:
    flags = build_flags.cpu_flags(cpuinfo(SAPPHIRE))
    avx2_build = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | OPENMP = 1 | "
    assert build_flags.unused(avx2_build, flags) == [
        "AVX_VNNI",
        "AVX512",
        "AVX512_VBMI",
        "AVX512_VNNI",
        "AVX512_BF16",
    ]
    full = avx2_build + "AVX_VNNI = 1 | AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | "
    assert build_flags.unused(full + "AVX512_BF16 = 1 |", flags) == []
    # A set named but off ("= 0") is unused; a CPU without the sets wants none of them.
    assert build_flags.unused(full + "AVX512_BF16 = 0 |", flags) == ["AVX512_BF16"]
    assert build_flags.unused(avx2_build, build_flags.cpu_flags(cpuinfo(HASWELL))) == []


def test_a_build_without_the_cpus_avx512_warns_once_with_the_rebuild_command(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import llama_cpp
    from kode.backends.llama import library

    monkeypatch.setattr(build_flags, "cpu_flags_here", lambda: build_flags.cpu_flags(SAPPHIRE_INFO))
    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: b"CPU : AVX2 = 1 | FMA = 1 |")
    with caplog.at_level(logging.WARNING, logger="kode.backends.llama.library"):
        library._say_unused_instructions()
    (record,) = caplog.records
    assert "without AVX_VNNI, AVX512, AVX512_VBMI, AVX512_VNNI, AVX512_BF16" in record.message
    assert "-m kode.backends.llama.build_flags" in record.message
    assert f"llama-cpp-python=={llama_cpp.__version__}" in record.message

    caplog.clear()
    monkeypatch.setattr(
        build_flags, "cpu_flags_here", lambda: build_flags.cpu_flags(cpuinfo(HASWELL))
    )
    library._say_unused_instructions()
    assert caplog.records == []
