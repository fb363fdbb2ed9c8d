"""pass@1 on HumanEval infilling, through the same engine the language server uses.

Sets: ``single`` and ``multi`` (HumanEval single- and multi-line infilling: each task is
opened as the document ``prompt + "\\n" + suffix``, the hole an empty line, and completed
at the start of that line); ``span`` (random spans: the multi-line tasks' solutions cut at
two random characters, opened as ``prompt + suffix``, so the hole starts and ends
mid-line); ``file`` (mid-line holes cut from large standard-library modules, judged by
whether the fill restores the file); ``file-lines`` (the same files, each hole the rest
of one to four whole lines from a line's indentation: a cursor with nothing after it,
where fills may span lines). Each is completed by ``CompletionEngine.complete``
with the user's default settings: context window, FIM prompt, stop rules, trimming. The
program ``prompt + completion + separator + suffix + test + check(entry_point)`` then
runs in the sandbox (``bench/sandbox.py``); exit status 0 is a pass. Greedy decoding, so
one sample per task is pass@1.

Modes:

- ``engine``: what the editor would show once the place is prepared: the full window
  (``firstAnswerMs = 0``), every prompt token evaluated exactly (``movedSuffixDrift = 0``).
- ``moved``: the keystroke path. The cache first holds the prompt for the same document
  with the last ``MOVED_CHARS`` characters before the hole not yet typed; then they are
  typed and the engine completes with ``movedSuffixDrift`` at its default, so the
  cached suffix entries are moved, not evaluated again (``backends/kv_reuse.py``).
  The result's ``moved`` field says how many prompt tokens were moved (0: the shortcut
  did not apply and the prompt was evaluated exactly).
- ``spm``: ``engine`` with the suffix-first template (``qwen2.5-coder-spm``), to decide
  the prompt order from a measurement.
- ``raw``: the model's own output for the very same prompt (rebuilt with
  ``completion.context.gather`` + ``render`` exactly as the engine does, but never
  token-healed), up to its end token or ``max_tokens``, with no stop rules and no
  trimming: the difference to ``engine`` is what the stop rules are worth.
- ``heal``: ``engine`` with ``tokenHealing`` on; it differs only where the cursor
  follows a word character, and the difference to ``engine`` is what healing is worth.
- ``llama-server``: the same tasks through llama.cpp's ``/infill`` endpoint
  (``input_prefix`` / ``input_suffix``), when a ``llama-server`` binary is on ``PATH``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgspec
from kode.bench import charts, report, sandbox, tasks
from kode.bench.report import fmt, fmt_ratio, markdown_table
from kode.bench.tasks import HumanEvalTask

MODES = ("engine", "raw", "moved", "spm", "heal", "llama-server")
DEFAULT_MODES = ("engine", "raw", "llama-server")
MOVED_CHARS = 12  # characters typed between the cached prompt and the measured one
SETS = ("single", "multi")  # the default sets
ALL_SETS = ("single", "multi", "span", "file", "file-lines")


@dataclass(frozen=True, slots=True)
class Options:
    models: tuple[str, ...] = ("default",)
    sets: tuple[str, ...] = SETS
    tasks: int | None = 8  # per set; None: all
    max_tokens: int | None = None  # None: the settings' default
    modes: tuple[str, ...] = DEFAULT_MODES
    speculation: str = "auto"
    seed: int = 0
    timeout_s: float = 10.0
    out: Path = Path("results/quality")
    data_dir: Path | None = None
    settings: tuple[tuple[str, Any], ...] = ()  # more settings for every Kode mode (camelCase)


@dataclass(slots=True)
class Result:
    model: str
    set: str
    mode: str
    task_id: str
    verdict: str
    completion: str
    ms: float
    tokens: int | None = None
    error: str = ""
    moved: int | None = None  # mode moved: prompt tokens moved, not evaluated again

    @property
    def passed(self) -> bool:
        return self.verdict == sandbox.Verdict.PASSED


@dataclass(slots=True)
class Row:
    model: str
    set: str
    mode: str
    passed: int
    total: int
    timeouts: int
    errors: int
    median_ms: float | None

    @property
    def pass_at_1(self) -> float | None:
        return None if self.total == 0 else self.passed / self.total


def task_uri(task: HumanEvalTask) -> str:
    """A file URI per task (the file name shows in the prompt's ``<|file_sep|>`` line)."""
    name = re.sub(r"[^A-Za-z0-9_]+", "_", task.task_id).strip("_").lower()
    return f"file:///kode-bench/humaneval/{name}.py"


def document_text(task: HumanEvalTask) -> str:
    """The document the editor holds (for the line sets the hole is an empty line)."""
    return task.document()


def load_set(
    name: str, n: int | None, seed: int, folder: Path | None = None
) -> list[HumanEvalTask]:
    """A seeded sample of ``n`` tasks (all: ``None``) of set ``name`` (``ALL_SETS``)."""
    if name in tasks.HUMANEVAL_FILES:
        return tasks.sample(tasks.load_humaneval(tasks.humaneval_path(name, folder)), n, seed)
    if name == "span":
        source = tasks.load_humaneval(tasks.humaneval_path(tasks.SPAN_SOURCE, folder))
        return [tasks.random_span(t, seed) for t in tasks.sample(source, n, seed)]
    if name in ("file", "file-lines"):
        return tasks.file_span_tasks(
            tasks.stdlib_files(), 20 if n is None else n, seed, line_start=name == "file-lines"
        )
    raise ValueError(f"unknown set {name!r}; known: {', '.join(ALL_SETS)}")


def judge(task: HumanEvalTask, completion: str, limits: sandbox.Limits) -> str:
    """The verdict for ``completion`` (blocking: run it in a thread)."""
    if task.judge is tasks.Judge.EXACT:
        passed = task.restores(completion)
        return str(sandbox.Verdict.PASSED if passed else sandbox.Verdict.FAILED)
    return str(sandbox.run_program(task.program(completion), limits).verdict)


def summarize(results: Sequence[Result]) -> list[Row]:
    rows: list[Row] = []
    keys = dict.fromkeys((r.model, r.set, r.mode) for r in results)
    for model, set_, mode in keys:
        got = [r for r in results if (r.model, r.set, r.mode) == (model, set_, mode)]
        rows.append(
            Row(
                model=model,
                set=set_,
                mode=mode,
                passed=sum(r.passed for r in got),
                total=len(got),
                timeouts=sum(r.verdict == sandbox.Verdict.TIMEOUT for r in got),
                errors=sum(bool(r.error) for r in got),
                median_ms=report.median(r.ms for r in got if not r.error),
            )
        )
    return rows


def render_table(rows: Sequence[Row]) -> str:
    return markdown_table(
        ["model", "set", "mode", "pass@1", "timeouts", "errors", "median ms/task"],
        [
            [
                r.model,
                r.set,
                r.mode,
                fmt_ratio(r.passed, r.total),
                r.timeouts,
                r.errors,
                fmt(r.median_ms, 0),
            ]
            for r in rows
        ],
    )


def chart(rows: Sequence[Row], path: Path) -> None:
    groups = list(dict.fromkeys((r.set, r.mode) for r in rows))
    series = {}
    for model in dict.fromkeys(r.model for r in rows):
        got = {(r.set, r.mode): r.pass_at_1 for r in rows if r.model == model}
        series[model] = [100.0 * (got.get(g) or 0.0) for g in groups]
    with charts.figure(path, (max(6.0, 1.2 * len(groups) + 2), 4.0)) as ax:
        charts.grouped_bars(ax, [f"{s}\n{m}" for s, m in groups], series)
        ax.set_ylabel("pass@1 (%)")
        ax.set_ylim(0, 100)
        ax.set_title("HumanEval infilling pass@1")
        ax.legend()


# -- running ----------------------------------------------------------------------------


async def _raw(
    engine: Any, backend: Any, uri: str, offset: int, max_tokens: int
) -> tuple[str, int]:
    """The model's unfiltered output for the prompt the engine builds at ``offset``."""
    from kode.backends.base import GenerationRequest, Sampling
    from kode.completion import context as ctxmod
    from kode.completion.templates import render

    settings = engine.settings
    doc = engine.documents.get(uri)
    budget = ctxmod.Budget(settings.prefix_tokens, settings.suffix_tokens, settings.snippet_tokens)
    ctx = ctxmod.gather(
        doc,
        offset,
        backend.count_tokens,
        budget,
        others=engine.documents.others(uri) if settings.snippet_tokens else (),
        anchor=None,
    )
    repo = Path(ctxmod.uri_to_path(uri)).parent.name or "workspace"
    prompt = render(
        engine.template(), ctx.prefix, ctx.suffix, path=ctx.path, repo=repo, snippets=ctx.snippets
    )
    request = GenerationRequest(
        prompt=prompt,
        max_tokens=max_tokens,
        sampling=Sampling(settings.temperature, settings.top_p, settings.seed),
        speculation=settings.speculation,
        draft_sources=(ctx.suffix, *(s.text for s in ctx.snippets)),
    )
    generation = await backend.generate(request)
    text = ""
    async for chunk in generation:
        text += chunk.text
    stats = await generation.wait()
    return text, stats.completion_tokens


async def _moved(
    engine: Any, backend: Any, task: HumanEvalTask, settings: Any, max_tokens: int
) -> Any:
    """Complete ``task`` the way a keystroke does: the cache holds the prompt from
    ``MOVED_CHARS`` characters earlier, then those characters are typed."""
    uri = task_uri(task)
    cut = max(0, len(task.prompt) - MOVED_CHARS)
    engine.update_settings(settings)
    engine.documents.open(uri, task.prompt[:cut] + task.separator + task.suffix, 0, "python")
    await _raw(engine, backend, uri, cut, 1)  # leaves the earlier prompt in the cache
    engine.documents.close(uri)
    engine.documents.open(uri, document_text(task), 1, "python")
    position = engine.documents.get(uri).position_at(len(task.prompt))
    return await engine.complete(uri, position, max_tokens=max_tokens)


async def _one_model(
    options: Options,
    model: str,
    by_set: dict[str, list[HumanEvalTask]],
    server: Any,
    bar: Any,
    results: list[Result],
) -> None:
    from kode.completion.backend_factory import BackendPool, load_backend
    from kode.completion.engine import CompletionEngine
    from kode.completion.settings import parse

    # firstAnswerMs 0: pass@1 of the full window. With the latency budget on, once the
    # prefill speed is learned a slow machine answers from a short window (no other
    # files, a cut prefix): that is the latency benchmarks' subject, not this one's.
    # One process measures: the model loads here rather than in a shared engine.
    settings, problems = parse(
        {
            "model": model,
            "speculation": options.speculation,
            "firstAnswerMs": 0,
            "engine": "inProcess",
            **dict(options.settings),
        }
    )
    if problems:
        raise ValueError("; ".join(problems))
    moved_settings = settings
    # The full window, every token evaluated: what the editor shows once the place is
    # prepared. With ``firstAnswerMs`` a cold place's first answer comes from a window cut
    # to what evaluates within 1 s on a small CPU (the task's signature and docstring
    # gone): on the 40-task span set (1.5B, 2 cores) that scored 5/40, the full window 28/40.
    exact = msgspec.structs.replace(settings, moved_suffix_drift=0, first_answer_ms=0)
    spm = msgspec.structs.replace(exact, template="qwen2.5-coder-spm")
    healed = msgspec.structs.replace(exact, token_healing=True)
    settings = exact
    max_tokens = options.max_tokens or settings.max_tokens
    limits = sandbox.Limits(timeout_s=options.timeout_s, cpu_s=max(1, int(options.timeout_s)))
    pool = BackendPool(load_backend)
    engine = CompletionEngine(pool.get, settings)
    # The template is part of the backend's identity (BackendPool), so SPM runs as a
    # second pass rather than switching (and reloading) per task.
    passes = [
        (exact, [m for m in options.modes if m not in ("spm", "heal")]),
        (spm, [m for m in options.modes if m == "spm"]),
        (healed, [m for m in options.modes if m == "heal"]),
    ]
    try:
        for pass_settings, modes in passes:
            if not modes:
                continue
            engine.update_settings(pass_settings)
            backend = await engine.backend()
            for set_, chosen in by_set.items():
                for task in chosen:
                    for mode in modes:
                        if mode == "llama-server" and server is None:
                            continue
                        bar.set_postfix_str(f"{model} {task.task_id} {mode}", refresh=False)
                        result = await _one_task(
                            engine, backend, server, task, mode, moved_settings, max_tokens
                        )
                        if not result.error:
                            result.verdict = await asyncio.to_thread(
                                judge, task, result.completion, limits
                            )
                        result.model, result.set = model, set_
                        results.append(result)
                        _append_partial(options.out, result)
                        bar.update(1)
    finally:
        await engine.aclose()
        await pool.aclose()


def _append_partial(out: Path, result: Result) -> None:
    """Each result as it is judged (``results.partial.jsonl``): a run stopped early, or
    one that crashes, keeps what it measured."""
    report.append_jsonl(out / "results.partial.jsonl", [asdict(result)])


async def _one_task(
    engine: Any,
    backend: Any,
    server: Any,
    task: HumanEvalTask,
    mode: str,
    moved_settings: Any,
    max_tokens: int,
) -> Result:
    """One completion of ``task`` in ``mode`` (verdict still to be judged). The document
    is opened fresh and the engine holds no suggestion for it, so nothing is served
    from an earlier mode's work."""
    uri = task_uri(task)
    exact = engine.settings
    started = time.perf_counter()
    tokens: int | None = None
    moved: int | None = None
    completion, error = "", ""
    try:
        if mode == "moved":
            done = await _moved(engine, backend, task, moved_settings, max_tokens)
            completion, tokens = done.text, done.stats.completion_tokens
            moved = done.stats.moved_prompt_tokens
        elif mode == "llama-server":
            data = await server.infill(task.prompt, task.separator + task.suffix, max_tokens)
            completion = str(data.get("content", ""))
            tokens = (data.get("timings") or {}).get("predicted_n")
        else:
            engine.documents.open(uri, document_text(task), 0, "python")
            offset = len(task.prompt)
            if mode == "raw":
                completion, tokens = await _raw(engine, backend, uri, offset, max_tokens)
            else:  # engine, spm, heal
                position = engine.documents.get(uri).position_at(offset)
                done = await engine.complete(uri, position, max_tokens=max_tokens)
                completion, tokens = done.text, done.stats.completion_tokens
    except Exception as exc:  # one broken task must not end the run
        completion, error = "", f"{type(exc).__name__}: {exc}"
    finally:
        await engine.cancel(uri)  # no live suggestion may serve the next mode
        if uri in engine.documents:
            engine.documents.close(uri)
        engine.update_settings(exact)
    ms = (time.perf_counter() - started) * 1000.0
    verdict = "error" if error else "pending"
    return Result("", "", mode, task.task_id, verdict, completion, ms, tokens, error, moved)


async def measure(options: Options) -> tuple[list[Result], dict[str, str]]:
    from kode.backends import models

    chosen = {s: load_set(s, options.tasks, options.seed, options.data_dir) for s in options.sets}
    results: list[Result] = []
    (options.out / "results.partial.jsonl").unlink(missing_ok=True)
    facts = {"machine_before": report.machine_note()}
    binary = None
    if "llama-server" in options.modes:
        from kode.bench import llama_server

        binary = llama_server.find_binary()
    per_model = sum(len(v) for v in chosen.values())
    modes = [m for m in options.modes if m != "llama-server" or binary is not None]
    bar = report.progress(per_model * len(modes) * len(options.models), "quality")
    try:
        for model in options.models:
            async with contextlib.AsyncExitStack() as stack:
                server = None
                if binary is not None:
                    from kode.bench import llama_server

                    server = await stack.enter_async_context(
                        llama_server.serve(
                            binary,
                            models.resolve(model),
                            llama_server.Mode("llama-server/plain", ()),
                            log_dir=options.out / "llama-server",
                        )
                    )
                await _one_model(options, model, chosen, server, bar, results)
    finally:
        bar.close()
    facts["machine_after"] = report.machine_note()
    facts["llama_server"] = str(binary) if binary is not None else "not on PATH"
    return results, facts


def write_report(options: Options, results: list[Result], facts: dict[str, str]) -> tuple[str, str]:
    """The report's text and its table; the results and the chart written to ``out``."""
    out = report.prepare_out(options.out)
    rows = summarize(results)
    table = render_table(rows)
    sizes = "all" if options.tasks is None else f"{options.tasks} per set"
    text = (
        "# Completion quality: HumanEval infilling pass@1\n\n"
        f"- models: {', '.join(options.models)}; sets: {', '.join(options.sets)} ({sizes}, "
        f"seed {options.seed}); greedy; speculation `{options.speculation}`; settings: "
        + (report.settings_note(options.settings) or "defaults")
        + "\n"
        "- engine: `CompletionEngine.complete` (stop rules, trimming); raw: the same prompt, "
        "the model's output up to its end token; llama-server: its `/infill` endpoint\n"
        f"- sandbox: `python -I`, temp folder, {options.timeout_s:g} s timeout, rlimits\n"
        f"- llama-server: {facts.get('llama_server')}\n"
        f"{report.machine_line(facts)}\n\n" + table
    )
    report.write_jsonl(out / "results.jsonl", (asdict(r) for r in results))
    if rows:
        chart(rows, out / "pass_at_1.png")
    return text, table


def main(options: Options) -> int:
    results, facts = asyncio.run(measure(options))
    text, table = write_report(options, results, facts)
    report.publish(options.out, "report.md", text, table, "pass_at_1.png")
    return 0
