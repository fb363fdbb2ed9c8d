"""The CMake flags that build llama.cpp (llama-cpp-python) for the CPU of this machine.

Run before installing, with any Python 3 (standard library only)::

    CMAKE_ARGS="$(python3 backends/llama/build_flags.py)" \\
        .venv/bin/pip install -e '.[models,structure]'

llama.cpp's default "native" build compiles for every instruction set the CPU lists, and
on some virtual machines (ours among them) that includes AMX tiles the kernel does not
enable: the first decode dies with SIGILL. A build for AVX2 alone runs on any x86-64 CPU
since 2013 but leaves AVX-512 unused where the CPU has it, and with it llama.cpp's
AVX-512 kernels for repacked Q4_K weights: measured on the 2-core development machine
(Sapphire Rapids class), the 1.5B's prompt evaluation ran 1.4-1.5x faster (63-67 -> 94-97
tokens/s) and decoding at the same speed (docs/benchmarks.md). So the flags name each
instruction set this CPU lists, never AMX, and nothing the CPU lacks (a build is for the
machine it is built on; a wheel copied to an older CPU would die with SIGILL).

Outside x86-64 Linux nothing is printed: llama.cpp's own defaults apply there.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Iterable
from pathlib import Path

# Always on for x86-64: what every CPU since Haswell (2013) has.
BASE = ("-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON")

# ggml option -> the /proc/cpuinfo flags it compiles for (ggml-cpu's CMake: GGML_AVX512 is
# -mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw). The AVX-512 extensions need the
# AVX-512 foundation too.
_AVX512 = ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")
OPTIONAL: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("GGML_AVX_VNNI", ("avx_vnni",)),
    ("GGML_AVX512", _AVX512),
    ("GGML_AVX512_VBMI", (*_AVX512, "avx512vbmi")),
    ("GGML_AVX512_VNNI", (*_AVX512, "avx512_vnni")),
    ("GGML_AVX512_BF16", (*_AVX512, "avx512_bf16")),
)


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The instruction-set flags of the first processor in a /proc/cpuinfo text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def cmake_args(flags: Iterable[str]) -> list[str]:
    """The CMake arguments for an x86-64 CPU with these flags: the AVX2 baseline plus each
    optional set the CPU has all the flags of. Empty without AVX2 (an older CPU: llama.cpp
    decides)."""
    have = frozenset(flags)
    if not {"avx2", "fma", "f16c"} <= have:
        return []
    extra = [f"-D{option}=ON" for option, needs in OPTIONAL if set(needs) <= have]
    return [*BASE, *extra]


def _x86_linux() -> bool:
    return sys.platform == "linux" and platform.machine().lower() in ("x86_64", "amd64")


def cpu_flags_here() -> frozenset[str] | None:
    """This machine's CPU flags; None outside x86-64 Linux or without /proc/cpuinfo."""
    if not _x86_linux():
        return None
    try:
        return cpu_flags(Path("/proc/cpuinfo").read_text(errors="replace"))
    except OSError:
        return None


def unused(system_info: str, flags: Iterable[str]) -> list[str]:
    """The optional instruction sets ``cmake_args`` would build for a CPU with ``flags``
    that a llama.cpp build does not use, named as its system info names them
    (``llama_print_system_info``: ``"CPU : AVX2 = 1 | AVX512 = 1 | ..."``)."""
    built = set()
    for part in system_info.replace(":", "|").split("|"):
        name, _, value = part.partition("=")
        if value.strip() == "1":
            built.add(name.strip())
    wanted = (a.removeprefix("-DGGML_").removesuffix("=ON") for a in cmake_args(flags)[len(BASE) :])
    return [name for name in wanted if name not in built]


def rebuild_command(python: str, llama_version: str) -> str:
    """The command that rebuilds llama-cpp-python (``llama_version``, if known) for this
    machine's CPU with ``python``'s pip.

    >>> rebuild_command("py", "0.3.36")  # doctest: +NORMALIZE_WHITESPACE
    'CMAKE_ARGS="$(py -m kode.backends.llama.build_flags)" py -m pip install
     --force-reinstall --no-deps --no-cache-dir llama-cpp-python==0.3.36'
    """
    pin = f"=={llama_version}" if llama_version else ""
    return (
        f'CMAKE_ARGS="$({python} -m kode.backends.llama.build_flags)" {python} -m pip install '
        f"--force-reinstall --no-deps --no-cache-dir llama-cpp-python{pin}"
    )


def for_this_machine() -> list[str]:
    if not _x86_linux():
        return []
    flags = cpu_flags_here()
    return list(BASE) if flags is None else cmake_args(flags)  # unreadable: the baseline


def main() -> None:
    print(" ".join(for_this_machine()))


if __name__ == "__main__":
    main()
