"""``kode doctor``: why Kode is slow or broken on this machine, each problem with its fix.

kode doctor [--json] [--skip-model] [--verify]

The checks: Python and Kode's version; the llama.cpp build against this CPU's instruction
sets; the default models (installed, sha256 verified); the shared engine's folder and
its engines; the load on the machine; and a timed tiny completion (a fixed synthetic
prompt, no user code) against the speed Kode's development machine reaches.

What the machine is like is gathered once, in ``gather`` (the only part that reads
files, loads llama.cpp or runs a model); what to make of it is decided by the pure
``check_*`` functions, which take those facts as arguments (tests inject them).
Progress goes to stderr; stdout holds the report (``--json``: a list of
``{name, status, detail, fix}``). Exit status 1 when a check failed, else 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import enum
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kode.backends.llama import build_flags

# The reference figures: Kode's development machine (2 cores of an AVX-512 Xeon,
# Sapphire Rapids class; llama.cpp built with ``build_flags``), the 1.5B Q4_K_M (the
# ``default`` model), plain decoding on 2 threads (docs/benchmarks.md). Nothing scales
# them to another CPU: a run more than ``SLOW_FACTOR`` times slower is named, no more.
REFERENCE_MODEL = "default"
REFERENCE_DECODE_MS = (29.0, 32.0)  # ms per generated token
REFERENCE_PREFILL_TPS = 100.0  # prompt tokens per second
SLOW_FACTOR = 2.0
REFERENCE_TEXT = (
    "the development machine (2-core AVX-512 Xeon), 1.5B Q4_K_M: decode 29-32 ms/token, "
    "prefill about 100 tokens/s"
)

# The timed completion: a fixed synthetic prompt (no user code), greedy, no speculation.
TIMED_PROMPT_TOKENS_MAX = 32
WARMUP_PROMPT = "# warm-up\nx = 1\n"

# A process counts among the busy ones above this share of one core (sampled briefly).
BUSY_PROCESS_PERCENT = 5.0
CPU_SAMPLE_S = 0.5


class Status(enum.StrEnum):
    OK = "OK"
    WARN = "WARN"
    FAIL = "FAIL"


@dataclass(frozen=True, slots=True)
class Check:
    """One line of the report: what was checked, how it stands, and the fix (if any)."""

    name: str
    status: Status
    detail: str
    fix: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return {
            "name": self.name,
            "status": str(self.status),
            "detail": self.detail,
            "fix": self.fix,
        }


# -- the facts ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PythonFacts:
    version: tuple[int, int, int]
    executable: str
    kode_version: str


@dataclass(frozen=True, slots=True)
class BuildFacts:
    """llama-cpp-python as installed: its version and llama.cpp's system info string
    (``llama_print_system_info``), or why it could not be loaded; and the CPU's flags
    (None outside x86-64 Linux: not checked there)."""

    cpu_flags: frozenset[str] | None
    llama_version: str | None
    system_info: str | None
    error: str | None = None
    pinned: str = ""  # the llama-cpp-python version Kode requires (its metadata)


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """One default model as ``kode model info`` sees it (``models.info``)."""

    alias: str
    title: str
    path: str
    installed: bool
    size: int | None
    expected_size: int
    verified: bool
    parts_available: bool
    parts_problem: str | None


@dataclass(frozen=True, slots=True)
class EngineFacts:
    """One engine's lock and socket in the engine folder."""

    name: str
    running: bool  # some process holds its lock
    pid: int | None
    socket: str
    socket_present: bool
    obstacle: str | None  # what stands at the socket path that an engine cannot clear


@dataclass(frozen=True, slots=True)
class EnginesFacts:
    folder: str | None
    error: str | None  # the folder is unusable (``runtime_dir``'s refusal)
    engines: tuple[EngineFacts, ...] = ()


@dataclass(frozen=True, slots=True)
class BusyProcess:
    pid: int
    name: str
    cpu_percent: float  # of one core, over the sample


@dataclass(frozen=True, slots=True)
class LoadFacts:
    load1: float
    load5: float
    cpus: int
    top: tuple[BusyProcess, ...] = ()


@dataclass(frozen=True, slots=True)
class TimingFacts:
    """The timed tiny completion, or why it did not run."""

    model: str | None  # the alias timed
    threads: int = 0
    prompt_tokens: int = 0
    evaluated_tokens: int = 0
    prefill_ms: float = 0.0
    completion_tokens: int = 0
    decode_ms_per_token: float = 0.0
    load_s: float = 0.0
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Facts:
    python: PythonFacts
    build: BuildFacts
    models: tuple[ModelFacts, ...]
    engines: EnginesFacts
    load: LoadFacts
    timing: TimingFacts | None = None  # None: not timed (``--skip-model``)


# -- the judgements (pure) -----------------------------------------------------------------


def check_python(facts: PythonFacts) -> Check:
    version = ".".join(map(str, facts.version))
    detail = f"Python {version} ({facts.executable}); Kode {facts.kode_version}"
    if facts.version[:2] < (3, 11):
        return Check(
            "python",
            Status.FAIL,
            detail + "; Kode needs Python 3.11 or newer",
            "install Python 3.11+ and make the environment with it: "
            "python3.11 -m venv .venv && .venv/bin/pip install -e '.[models,structure]'",
        )
    return Check("python", Status.OK, detail)


def built_sets(system_info: str) -> list[str]:
    """The instruction sets a llama.cpp build reports as used (``NAME = 1``), in its order."""
    names = []
    for part in system_info.replace(":", "|").split("|"):
        name, _, value = part.partition("=")
        if value.strip() == "1" and name.strip() not in names:
            names.append(name.strip())
    return names


def cpu_sets(cpu_flags: frozenset[str]) -> list[str]:
    """The optional instruction sets ``build_flags`` builds for a CPU with these flags,
    named as llama.cpp's system info names them (``AVX512``, ``AVX512_VNNI``...)."""
    args = build_flags.cmake_args(cpu_flags)[len(build_flags.BASE) :]
    return [a.removeprefix("-DGGML_").removesuffix("=ON") for a in args]


def unused_sets(build: BuildFacts) -> list[str]:
    """The instruction sets this CPU has that the llama.cpp build does not use
    (``build_flags.unused``); empty when unknown."""
    if build.cpu_flags is None or build.system_info is None:
        return []
    return build_flags.unused(build.system_info, build.cpu_flags)


def check_build(build: BuildFacts, python: str) -> Check:
    name = "llama.cpp build"
    if build.error is not None or build.llama_version is None or build.system_info is None:
        return Check(
            name,
            Status.FAIL,
            f"llama-cpp-python cannot be loaded: {build.error}",
            build_flags.rebuild_command(python, build.llama_version or build.pinned),
        )
    used = built_sets(build.system_info)
    head = f"llama-cpp-python {build.llama_version}, built with {', '.join(used) or 'none'}"
    if build.cpu_flags is None:
        return Check(name, Status.OK, head + " (the CPU's sets are checked on x86-64 Linux only)")
    if not build_flags.cmake_args(build.cpu_flags):
        return Check(name, Status.OK, f"{head}; this CPU lacks AVX2: llama.cpp's defaults apply")
    cpu = f"this CPU: AVX2 baseline{''.join(', ' + s for s in cpu_sets(build.cpu_flags))}"
    missing = unused_sets(build)
    if not missing:
        return Check(name, Status.OK, f"{head}; {cpu}")
    gain = ""
    if "AVX512" in missing:
        gain = " (AVX-512 made prompt evaluation 1.4-1.5x faster on Kode's development machine)"
    return Check(
        name,
        Status.WARN,
        f"{head}; {cpu}: the build leaves {', '.join(missing)} unused{gain}",
        build_flags.rebuild_command(python, build.llama_version),
    )


def _mib(size: int) -> str:
    return f"{size / 2**20:,.0f} MiB"


def check_model(model: ModelFacts) -> Check:
    """The ``default`` model is needed (FAIL when absent or damaged); ``small`` only by
    ``speculation: draft`` and the benchmarks (WARN when absent)."""
    name = f"model {model.alias}"
    where = f"{model.title} at {model.path}"
    needed = model.alias == "default"
    if not model.installed:
        install = f"kode model install {model.alias}"
        if not model.parts_available:
            install = f"{model.parts_problem}; then: {install}"
        use = "" if needed else " (used by speculation: draft and the benchmarks)"
        return Check(
            name, Status.FAIL if needed else Status.WARN, f"{where}: not installed{use}", install
        )
    size = _mib(model.size or 0)
    if not model.verified:
        wrong = (
            "" if model.size == model.expected_size else f", expected {_mib(model.expected_size)}"
        )
        install = f"kode model install {model.alias} --force"
        if not model.parts_available:
            install = f"{model.parts_problem}; then: {install}"
        return Check(
            name,
            Status.FAIL,
            f"{where}: DAMAGED, {size}{wrong}, fails its sha256 check",
            install,
        )
    detail = f"{where}: {size}, sha256 verified"
    if not model.parts_available:
        return Check(
            name,
            Status.WARN,
            detail + "; its PyPI parts are gone, so it cannot be rebuilt if damaged",
            model.parts_problem,
        )
    return Check(name, Status.OK, detail)


def check_engines(facts: EnginesFacts) -> Check:
    name = "shared engine"
    if facts.error is not None or facts.folder is None:
        error = facts.error or "unknown"
        _, _, advice = error.rpartition("; ")
        return Check(
            name,
            Status.FAIL,
            error,
            advice or "set XDG_RUNTIME_DIR to a folder of yours that only you may enter",
        )
    blocked = [e for e in facts.engines if e.obstacle]
    if blocked:
        return Check(
            name,
            Status.FAIL,
            f"folder {facts.folder}: " + "; ".join(str(e.obstacle) for e in blocked),
            "; ".join(str(e.obstacle).rpartition("; ")[2] for e in blocked),
        )
    running = [e for e in facts.engines if e.running]
    stale = [e for e in facts.engines if not e.running and e.socket_present]
    if not running:
        extra = f" ({len(stale)} socket(s) of stopped engines, replaced on start)" if stale else ""
        return Check(
            name, Status.OK, f"folder {facts.folder}: no engine running (windows start one){extra}"
        )
    parts, fixes = [], []
    for engine in running:
        pid = "pid ?" if engine.pid is None else f"pid {engine.pid}"
        if engine.socket_present:
            parts.append(f"{engine.name} running, {pid}, socket {engine.socket}")
        else:
            parts.append(f"{engine.name} holds its lock ({pid}) but has no socket")
            fixes.append(
                f"wait if it is starting; else stop it: kill {engine.pid}"
                if engine.pid
                else "kode engine stop"
            )
    status = Status.WARN if fixes else Status.OK
    return Check(
        name, status, f"folder {facts.folder}: " + "; ".join(parts), "; ".join(fixes) or None
    )


def is_busy(load: LoadFacts) -> bool:
    """Busy when the 1-minute load takes at least half the cores (at least one):
    llama.cpp runs a thread on every core and each step waits for its slowest thread,
    so even one busy process on a 2-core machine slows every token."""
    return load.load1 >= max(1.0, load.cpus / 2)


def check_load(load: LoadFacts) -> Check:
    detail = f"load {load.load1:.2f} (1 min), {load.load5:.2f} (5 min) on {load.cpus} core(s)"
    if not is_busy(load):
        return Check("machine load", Status.OK, detail)
    top = [p for p in load.top if p.cpu_percent >= BUSY_PROCESS_PERCENT]
    what = (
        "busiest now: "
        + ", ".join(f"{p.name} (pid {p.pid}, {p.cpu_percent:.0f}% of a core)" for p in top)
        if top
        else "no single process stands out (many short ones?)"
    )
    return Check(
        "machine load",
        Status.WARN,
        f"{detail}: the machine is busy, so completions (and any timing) are slower",
        f"{what}; let them finish or stop them, then time again: kode doctor",
    )


def check_speed(timing: TimingFacts, *, missing: Sequence[str], busy: bool) -> Check:
    """The timed completion against the development machine's figures: named when more
    than ``SLOW_FACTOR`` times slower, with the likeliest cause as the fix (an install
    that misses this CPU's instruction sets, a busy machine)."""
    name = "timed completion"
    if timing.model is None:
        return Check(
            name, Status.WARN, "not timed: no verified model", "kode model install default"
        )
    if timing.error is not None:
        return Check(
            name,
            Status.FAIL,
            f"the {timing.model} model could not complete: {timing.error}",
            f"KODE_LLAMA_VERBOSE=1 kode doctor shows llama.cpp's own messages; "
            f"kode model install {timing.model} --force assembles the model file again",
        )
    prefill_tps = (
        timing.evaluated_tokens / (timing.prefill_ms / 1000.0) if timing.prefill_ms > 0 else 0.0
    )
    detail = (
        f"{timing.model} model, {timing.threads} thread(s), loaded in {timing.load_s:.1f} s: "
        f"prefill {prefill_tps:.0f} tokens/s ({timing.evaluated_tokens} tokens), decode "
        f"{timing.decode_ms_per_token:.1f} ms/token ({timing.completion_tokens} tokens)"
    )
    if timing.model != REFERENCE_MODEL:
        return Check(
            name,
            Status.OK,
            f"{detail}; not compared: the reference figures are the 1.5B's ({REFERENCE_TEXT})",
        )
    slow = []
    if timing.decode_ms_per_token > SLOW_FACTOR * REFERENCE_DECODE_MS[1]:
        slow.append(f"decode {timing.decode_ms_per_token / REFERENCE_DECODE_MS[1]:.1f}x slower")
    if 0 < prefill_tps < REFERENCE_PREFILL_TPS / SLOW_FACTOR:
        slow.append(f"prefill {REFERENCE_PREFILL_TPS / prefill_tps:.1f}x slower")
    if not slow:
        return Check(name, Status.OK, f"{detail}; reference: {REFERENCE_TEXT}")
    causes = []
    if missing:
        causes.append(f"rebuild llama.cpp with {', '.join(missing)} (see 'llama.cpp build')")
    if busy:
        causes.append("the machine is busy (see 'machine load')")
    if not causes:
        causes.append(
            "this CPU is slower than the development machine's; the 0.5B is faster "
            '(settings: "model": "small"; kode complete --model small)'
        )
    return Check(
        name,
        Status.WARN,
        f"{detail}: {' and '.join(slow)} than {REFERENCE_TEXT}",
        "; ".join(causes),
    )


def judge(facts: Facts) -> list[Check]:
    """Every check, in the report's order."""
    checks = [check_python(facts.python), check_build(facts.build, facts.python.executable)]
    checks += [check_model(m) for m in facts.models]
    checks += [check_engines(facts.engines), check_load(facts.load)]
    if facts.timing is not None:
        checks.append(
            check_speed(facts.timing, missing=unused_sets(facts.build), busy=is_busy(facts.load))
        )
    return checks


def exit_code(checks: Sequence[Check]) -> int:
    return 1 if any(c.status is Status.FAIL for c in checks) else 0


def render(checks: Sequence[Check]) -> str:
    """One line per check, its fix indented below."""
    lines = []
    for check in checks:
        lines.append(f"{check.status.value:<4}  {check.name}: {check.detail}")
        if check.fix:
            lines.append(f"      fix: {check.fix}")
    return "\n".join(lines)


# -- gathering the facts (reads the machine) -------------------------------------------------


def _say(text: str) -> None:
    print(f"kode doctor: {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """The doctor says it itself: the library's own warning would repeat it."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def gather_python() -> PythonFacts:
    from kode.backends.defaults import KODE_VERSION

    v = sys.version_info
    return PythonFacts((v.major, v.minor, v.micro), sys.executable, KODE_VERSION)


def gather_build() -> BuildFacts:
    flags = build_flags.cpu_flags_here()
    pinned = _pinned_llama()
    try:
        import llama_cpp
        from kode.backends.llama import library

        with _quiet(library.__name__):
            library.init_library()
        info = llama_cpp.llama_print_system_info().decode(errors="replace")
        return BuildFacts(flags, str(llama_cpp.__version__), info, pinned=pinned)
    except Exception as exc:  # a broken install: said, not raised
        return BuildFacts(flags, None, None, f"{type(exc).__name__}: {exc}", pinned)


def _pinned_llama() -> str:
    """The llama-cpp-python version Kode's metadata requires (``==X``), else empty."""
    import importlib.metadata as md

    try:
        requires = md.requires("kode") or []
    except md.PackageNotFoundError:
        return ""
    for line in requires:
        name, sep, version = line.partition("==")
        if sep and name.strip() == "llama-cpp-python" and ";" not in version:
            return version.strip()
    return ""


def gather_models(verify: bool) -> tuple[ModelFacts, ...]:
    from kode.backends import models

    out = []
    for row in models.info(verify=verify):
        spec = models.DEFAULT_MODELS[row.alias]
        out.append(
            ModelFacts(
                alias=row.alias,
                title=row.title,
                path=str(row.path),
                installed=row.installed,
                size=row.size,
                expected_size=spec.size,
                verified=row.verified,
                parts_available=row.parts_available,
                parts_problem=row.problem,
            )
        )
    return tuple(out)


def gather_engines() -> EnginesFacts:
    from kode.backends.daemon import paths
    from kode.backends.errors import EngineSetupError

    try:
        folder = paths.runtime_dir()
    except (EngineSetupError, OSError) as exc:
        return EnginesFacts(None, str(exc))
    engines = []
    for lock in sorted(folder.glob("kode-*.lock")):
        socket = lock.with_suffix(".sock")
        running = paths.lock_is_held(lock)
        engines.append(
            EngineFacts(
                name=lock.stem,
                running=running,
                pid=paths.holder_pid(lock) if running else None,
                socket=str(socket),
                socket_present=socket.is_socket(),
                obstacle=paths.socket_obstacle(socket),
            )
        )
    return EnginesFacts(str(folder), None, tuple(engines))


def _cpu_ticks() -> dict[int, tuple[str, int]]:
    """Each process's name and CPU time so far (clock ticks), from /proc."""
    ticks = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        name = text[text.find("(") + 1 : text.rfind(")")]
        fields = text[text.rfind(")") + 2 :].split()
        with contextlib.suppress(IndexError, ValueError):
            ticks[int(entry.name)] = (name, int(fields[11]) + int(fields[12]))  # utime, stime
    return ticks


def top_processes(interval_s: float = CPU_SAMPLE_S, count: int = 3) -> tuple[BusyProcess, ...]:
    """The processes that used the most CPU over ``interval_s`` (this one left out)."""
    if not Path("/proc/self/stat").exists():
        return ()
    before = _cpu_ticks()
    time.sleep(interval_s)
    after = _cpu_ticks()
    hz = os.sysconf("SC_CLK_TCK")
    found = []
    for pid, (name, now) in after.items():
        if pid == os.getpid() or pid not in before:
            continue
        used = (now - before[pid][1]) / hz / interval_s * 100.0
        if used > 0:
            found.append(BusyProcess(pid, name, used))
    found.sort(key=lambda p: p.cpu_percent, reverse=True)
    return tuple(
        BusyProcess(p.pid, _command_line(p.pid, p.name), p.cpu_percent) for p in found[:count]
    )


def _command_line(pid: int, name: str, limit: int = 80) -> str:
    """The process's command line, shortened (its name when unreadable: a kernel thread)."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return name
    line = " ".join(w.decode(errors="replace") for w in words if w)
    return name if not line else line if len(line) <= limit else line[: limit - 1] + "…"


def gather_load() -> LoadFacts:
    load1, load5, _ = os.getloadavg()
    cpus = os.cpu_count() or 1
    return LoadFacts(load1, load5, cpus, top_processes())


def _timed_model(models: Sequence[ModelFacts]) -> str | None:
    """The model to time: the default (which the reference figures are for), else small."""
    for alias in (REFERENCE_MODEL, "small"):
        if any(m.alias == alias and m.installed and m.verified for m in models):
            return alias
    return None


async def _time_completion(alias: str) -> TimingFacts:
    from kode.backends import models
    from kode.backends.base import (
        PREFILL_PROBE,
        GenerationRequest,
        GenerationStats,
        SpeculationMethod,
    )
    from kode.backends.llama.backend import LlamaBackend
    from kode.backends.speculative import CostCurve
    from kode.backends.system import usable_cores

    path = models.resolve(alias, auto_install=False)
    start = time.perf_counter()
    # A given cost curve: the timing is of plain decoding, the batch curve is not needed.
    backend = await LlamaBackend.load(path, n_ctx=2048, curve=CostCurve({1: 1.0}))
    load_s = time.perf_counter() - start
    try:

        async def run(prompt: str, max_tokens: int) -> GenerationStats:
            request = GenerationRequest(
                prompt=prompt, max_tokens=max_tokens, speculation=SpeculationMethod.NONE
            )
            generation = await backend.generate(request)
            async for _ in generation:
                pass
            return await generation.wait()

        await run(WARMUP_PROMPT, 2)  # the weights paged in, the threads started
        stats = await run(PREFILL_PROBE, TIMED_PROMPT_TOKENS_MAX)
    finally:
        await backend.aclose()
    return TimingFacts(
        model=alias,
        threads=usable_cores(),
        prompt_tokens=stats.prompt_tokens,
        evaluated_tokens=stats.evaluated_prompt_tokens,
        prefill_ms=stats.prefill_ms,
        completion_tokens=stats.completion_tokens,
        decode_ms_per_token=stats.ms_per_token,
        load_s=load_s,
    )


def gather_timing(models: Sequence[ModelFacts]) -> TimingFacts:
    alias = _timed_model(models)
    if alias is None:
        return TimingFacts(model=None)
    try:
        return asyncio.run(_time_completion(alias))
    except Exception as exc:  # a model that cannot run: said, not raised
        return TimingFacts(model=alias, error=f"{type(exc).__name__}: {exc}")


def gather(
    *, skip_model: bool = False, verify: bool = False, say: Callable[[str], None] = _say
) -> Facts:
    say("Python and Kode")
    python = gather_python()
    say("the llama.cpp build and this CPU's instruction sets")
    build = gather_build()
    say("the default models" + (" (hashing them whole)" if verify else ""))
    models = gather_models(verify)
    say("the shared engine's folder")
    engines = gather_engines()
    say("the load on the machine")
    load = gather_load()
    timing = None
    if not skip_model:
        say("timing a tiny completion (a synthetic prompt; --skip-model skips this)")
        timing = gather_timing(models)
    return Facts(python, build, models, engines, load, timing)


# -- the command -----------------------------------------------------------------------------


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "doctor", help="check this machine's setup and speed; each problem with its fix"
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list of the checks")
    parser.add_argument(
        "--skip-model", action="store_true", help="do not load a model to time a completion"
    )
    parser.add_argument("--verify", action="store_true", help="hash the model files whole (slow)")
    parser.set_defaults(func=_doctor)


def _doctor(args: argparse.Namespace) -> int:
    checks = judge(gather(skip_model=args.skip_model, verify=args.verify))
    if args.json:
        print(json.dumps([c.as_dict() for c in checks], indent=2))
    else:
        print(render(checks))
    return exit_code(checks)
