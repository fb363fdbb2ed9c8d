"""``kode bench quality``'s pure parts and its sandbox: programs judged, sets loaded,
figures summed, the raw mode's prompt. No model (a fake backend)."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from pathlib import Path

from kode.backends.base import GenerationRequest, GenerationStats, TokenChunk
from kode.backends.worker import BackendCounters
from kode.bench import quality, sandbox, tasks
from kode.bench.tasks import HumanEvalTask

# -- sandbox -------------------------------------------------------------------------------


def test_sandbox_passes_a_good_program() -> None:
    outcome = sandbox.run_program("assert sum([1, 2]) == 3\n")
    assert outcome.passed
    assert outcome.verdict is sandbox.Verdict.PASSED


def test_sandbox_fails_a_bad_program() -> None:
    outcome = sandbox.run_program("def f(:\n")  # a syntax error
    assert outcome.verdict is sandbox.Verdict.FAILED
    assert "SyntaxError" in outcome.stderr_tail
    assert sandbox.run_program("assert 1 == 2\n").verdict is sandbox.Verdict.FAILED


def test_sandbox_times_out_an_infinite_loop() -> None:
    outcome = sandbox.run_program("while True:\n    pass\n", sandbox.Limits(timeout_s=1.0, cpu_s=5))
    assert outcome.verdict is sandbox.Verdict.TIMEOUT
    assert outcome.returncode is None  # ended by the wall clock, before its CPU limit


def test_sandbox_caps_cpu_and_memory() -> None:
    cpu = sandbox.run_program("while True:\n    pass\n", sandbox.Limits(timeout_s=10.0, cpu_s=1))
    assert cpu.verdict is sandbox.Verdict.TIMEOUT
    assert cpu.returncode in (-signal.SIGXCPU, -signal.SIGKILL)  # its CPU limit, not the clock
    memory = sandbox.run_program("x = bytearray(4 << 30)\n")
    assert memory.verdict is sandbox.Verdict.FAILED
    assert "MemoryError" in memory.stderr_tail


def test_sandbox_is_isolated(tmp_path: Path) -> None:
    here = str(Path.cwd())
    program = f"import os, sys\nassert os.getcwd() != {here!r}\nassert sys.flags.isolated\n"
    assert sandbox.run_program(program).passed


def test_canonical_solutions_pass_through_the_harness() -> None:
    for which in ("single", "multi"):
        found = tasks.sample(tasks.load_humaneval(tasks.humaneval_path(which)), 3, 0)
        for task in found:
            solution = task.canonical_solution.removesuffix("\n")
            assert sandbox.run_program(task.program(solution)).passed, task.task_id
            assert not sandbox.run_program(task.program("")).passed or task.task_id


def test_quality_program_and_document() -> None:
    task = HumanEvalTask(
        "T/0",
        "def f(x):\n",
        "    return y\n",
        "    y = x + 1\n",
        "def check(c):\n    assert c(1) == 2\n",
        "f",
    )
    assert quality.document_text(task) == "def f(x):\n\n    return y\n"
    assert sandbox.run_program(task.program("    y = x + 1")).passed
    assert not sandbox.run_program(task.program("    y = x")).passed
    assert quality.task_uri(task) == "file:///kode-bench/humaneval/t_0.py"


def test_random_spans_start_and_end_anywhere_and_their_solutions_pass() -> None:
    found = quality.load_set("span", 6, 0)
    assert [t.task_id for t in found] == [t.task_id for t in quality.load_set("span", 6, 0)]
    source = tasks.sample(tasks.load_humaneval(tasks.humaneval_path("multi")), 6, 0)
    for task, whole in zip(found, source, strict=True):
        assert task.task_id.startswith(whole.task_id + "/S")
        assert task.separator == "" and task.canonical_solution.strip()
        # Cutting moves text between prompt, hole and suffix; it never adds or loses any.
        body = whole.canonical_solution
        if whole.suffix.startswith("\n"):  # the set's suffix brings the line break back
            body = body.removesuffix("\n")
        assert task.prompt + task.canonical_solution + task.suffix == (
            whole.prompt + body + whole.suffix
        )
        assert quality.document_text(task) == task.prompt + task.suffix
        assert sandbox.run_program(task.program(task.canonical_solution)).passed, task.task_id
    assert not sandbox.run_program(found[0].program("")).passed
    # Spans are cut inside lines: some of these holes start mid-line.
    assert any(t.prompt.split("\n")[-1].strip() for t in found)


def test_quality_summary() -> None:
    results = [
        quality.Result("m", "single", "engine", "a", "passed", "x", 10.0, 12, shown_tokens=3),
        quality.Result("m", "single", "engine", "b", "timeout", "x", 30.0, 2, shown_tokens=4),
        quality.Result("m", "single", "raw", "a", "failed", "x", 20.0),
    ]
    results[0].engine_ms, results[0].decode_ms = 1500.0, 1000.0
    rows = quality.summarize(results)
    assert [(r.mode, r.passed, r.total, r.timeouts) for r in rows] == [
        ("engine", 1, 2, 1),
        ("raw", 0, 1, 0),
    ]
    # generated 12 + 2, shown 3 + 4, never shown 9 + 0 (not -2)
    first = rows[0]
    assert (first.generated, first.shown, first.unshown, first.engine_s) == (14, 7, 9, 1.5)
    table = quality.render_table(rows)
    assert "| m | single | engine | 1/2 (50%) | 1 | 0 | 20 | 14 | 7 | 9 | 1.5 | 1.0 |" in table


class _OneLineGeneration:
    def __init__(self) -> None:
        self.stats = GenerationStats(completion_tokens=1)

    async def __aiter__(self) -> AsyncIterator[TokenChunk]:
        yield TokenChunk("    y = x + 1\n", (1,))

    async def cancel(self) -> None:
        return None

    async def wait(self) -> GenerationStats:
        return self.stats


class _PromptRecordingBackend:
    """Records the prompts it is asked to continue."""

    name = "fake"
    model_name = "fake"

    def __init__(self) -> None:
        self.prompts: list[str] = []
        self.counters = BackendCounters()

    def count_tokens(self, text: str) -> int:
        return len(text) // 3 + 1

    async def generate(self, request: GenerationRequest) -> _OneLineGeneration:
        self.prompts.append(request.prompt)
        return _OneLineGeneration()

    async def health(self, timeout_s: float = 1.0) -> bool:
        return True

    async def aclose(self) -> None:
        return None


async def test_raw_mode_sends_the_engines_prompt() -> None:
    from kode.completion.engine import CompletionEngine
    from kode.completion.settings import parse

    backend = _PromptRecordingBackend()

    async def factory(_settings: object) -> _PromptRecordingBackend:
        return backend

    settings, problems = parse({"maxTokens": 16})
    assert not problems
    engine = CompletionEngine(factory, settings)
    task = HumanEvalTask("T/1", "def f(x):\n", "    return y\n", "", "", "f")
    uri = quality.task_uri(task)
    engine.documents.open(uri, quality.document_text(task), 0, "python")
    offset = len(task.prompt)
    done = await engine.complete(uri, engine.documents.get(uri).position_at(offset))
    raw, tokens = await quality._raw(engine, backend, uri, offset, 16)
    assert backend.prompts[0] == backend.prompts[1]
    assert (
        "<|fim_prefix|>def f(x):\n<|fim_suffix|>\n    return y\n<|fim_middle|>"
        in (backend.prompts[0])
    )
    assert (done.text, raw, tokens) == ("    y = x + 1", "    y = x + 1\n", 1)
