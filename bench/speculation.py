"""Speculative decoding against plain greedy decoding and against the peers, same prompts.

One process, one loaded backend. For each prompt every method runs back to back, the
order rotated by one per prompt, so a slow patch of the machine (another process, the
thermal state, the page cache) lands on every method alike. Speed is decode time per
token after the first (``GenerationStats.ms_per_token``): the prompt is the same for all
methods and its KV entries are reused after the first run, so prefill is left out.

Methods: Kode's ``none`` (plain greedy), ``ngram``, ``lookahead``, ``draft``, ``auto``;
``pld``, llama-cpp-python's ``Llama(draft_model=LlamaPromptLookupDecoding(...))`` (what a
user of that library would pick); ``llama-server``, llama.cpp's own server in each of its
speculative modes when a binary is on ``PATH``.

Lossless check: each output's token ids are compared with plain greedy's. At the first
difference, if plain decoding's top-2 logit gap (``LocalBackend.logit_gaps``)
there is below ``near_tie`` (1e-3), it is a near tie (batched and single-row kernels may
flip such an argmax) and counted apart from real divergences.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kode.bench import charts, harness, peers, report, tasks
from kode.bench.report import fmt, fmt_ratio, markdown_table

if TYPE_CHECKING:
    from kode.backends.llama.backend import LlamaBackend
    from kode.backends.local import LocalBackend

KODE_METHODS = ("none", "ngram", "lookahead", "draft", "auto")
PEER_PLD = "pld"
PEER_SERVER = "llama-server"
ALL_METHODS = (*KODE_METHODS, PEER_PLD, PEER_SERVER)
PLAIN = "none"
WORKLOADS = ("humaneval", "edit")
PLD_NAME = "llama-cpp-python/pld"


@dataclass(frozen=True, slots=True)
class Options:
    model: str = "default"
    draft_model: str = "small"
    tasks: int = 4  # per workload
    max_tokens: int = 64
    methods: tuple[str, ...] = ALL_METHODS
    workloads: tuple[str, ...] = WORKLOADS
    seed: int = 0
    out: Path = Path("results/speculation")
    near_tie: float = 1e-3
    pld_tokens: int = 10  # LlamaPromptLookupDecoding(num_pred_tokens=...)
    threads: int | None = None


@dataclass(frozen=True, slots=True)
class Prompt:
    workload: str
    task_id: str
    text: str
    draft_sources: tuple[str, ...] = ()


@dataclass(slots=True)
class Run:
    """One method on one prompt."""

    workload: str
    task_id: str
    method: str
    tokens: list[int]
    ms_per_token: float | None  # decode time per token after the first
    ttft_ms: float | None
    total_ms: float
    ran_as: str = ""  # the method the backend reports it used
    steps: int | None = None
    drafted: int | None = None
    accepted: int | None = None
    accepted_mean: float | None = None
    divergence: int | None = None  # first index differing from plain greedy
    gap: float | None = None  # plain's top-2 logit gap there, when known
    verdict: str = ""  # identical | near-tie | diverged | unknown | (plain)
    ceiling: float | None = None  # plain runs: the n-gram oracle ceiling (oracle_ceiling)


@dataclass(slots=True)
class Row:
    """One table row: a method on a workload."""

    workload: str
    method: str
    runs: int
    ms_per_token: float | None
    speedup: float | None
    pairs: int
    accepted_mean: float | None
    identical: int
    near_ties: int
    diverged: int
    unknown: int
    ran_as: str
    compared: int = field(default=0)


# -- prompts ----------------------------------------------------------------------------


def humaneval_prompts(n: int, seed: int, data_dir: Path | None = None) -> list[Prompt]:
    from kode.completion.templates import QWEN25_CODER, render

    rows = tasks.load_humaneval(tasks.humaneval_path("multi", data_dir))
    return [
        Prompt("humaneval", t.task_id, render(QWEN25_CODER, t.prompt, t.suffix), (t.suffix,))
        for t in tasks.sample(rows, n, seed)
    ]


def edit_prompts(n: int, seed: int, root: Path = tasks.REPO_ROOT) -> list[Prompt]:
    from kode.completion.templates import QWEN25_CODER, render

    return [
        Prompt("edit", t.task_id, render(QWEN25_CODER, t.prefix, t.suffix), (t.suffix,))
        for t in tasks.edit_tasks(tasks.source_files(root), n, seed, root)
    ]


# -- analysis (pure) --------------------------------------------------------------------


def classify(runs: list[Run], gaps: Callable[[str], list[float] | None], near_tie: float) -> None:
    """Fill ``divergence``/``gap``/``verdict`` of every run against the plain run of the
    same prompt. ``gaps(task_id)`` gives plain decoding's top-2 logit gaps (or None)."""
    plain = {(r.workload, r.task_id): r for r in runs if r.method == PLAIN}
    for run in runs:
        if run.method == PLAIN:
            run.verdict = "(plain)"
            continue
        base = plain.get((run.workload, run.task_id))
        if base is None:
            run.verdict = "unknown"
            continue
        at = report.first_divergence(base.tokens, run.tokens)
        run.divergence = at
        if at is None:
            run.verdict = "identical"
            continue
        known = gaps(run.task_id)
        if known is not None and at < len(known):
            run.gap = known[at]
            run.verdict = "near-tie" if known[at] < near_tie else "diverged"
        else:
            run.verdict = "unknown"


def oracle_ceiling(
    prompt: Sequence[int],
    output: Sequence[int],
    propose: Callable[[list[int]], list[list[int]]],
    cost: Callable[[int], float],
    max_draft: int,
) -> float | None:
    """The best speedup any draft-length policy could get from these drafts on this cost
    curve: an oracle that knows the output drafts exactly the part of a candidate that
    will be accepted, never more, and decodes plainly where that does not pay.

    Each step decodes ``[root, d1..dk]`` (cost ``cost(k + 1)`` single steps) and yields
    ``k + 1`` tokens when all k drafts are right; plain decoding yields one token per step.
    ``propose(context)`` gives the drafter's candidates for ``prompt + output[:i + 1]``.
    The minimum total cost over all policies is a dynamic programme from the end. The first
    output token comes from the prompt pass, as in the measured runs, so ``len(output) - 1``
    tokens are decoded; None when that is zero.

    Example: the output ``[5, 6, 7, 8]`` after the prompt ``[5, 6, 7, 8, 5]``: at every
    step the drafter repeats what followed the last occurrence. One 3-row batch ``[5, 6, 7]``
    (cost 1.8) yields the three tokens ``6 7 8`` plain decoding needs three steps for.
        >>> def propose(ctx):
        ...     i = len(ctx) - 1 - ctx[::-1][1:].index(ctx[-1])  # last earlier occurrence
        ...     return [ctx[i:i + 8]]
        >>> curve = {1: 1.0, 2: 1.6, 3: 1.8, 4: 2.0}
        >>> round(oracle_ceiling([5, 6, 7, 8], [5, 6, 7, 8], propose, curve.__getitem__, 8), 3)
        1.667
    """
    steps = len(output) - 1
    if steps <= 0:
        return None
    agree = []
    for i in range(steps):
        context = [*prompt, *output[: i + 1]]
        truth = output[i + 1 :]
        best = 0
        for cand in propose(context):
            n = 0
            while n < min(len(cand), len(truth), max_draft) and cand[n] == truth[n]:
                n += 1
            best = max(best, n)
        agree.append(best)
    # least[i]: minimal cost to produce output[i + 1:] with output[i] as the root.
    least = [0.0] * (steps + 1)
    for i in range(steps - 1, -1, -1):
        drafts = range(1, min(agree[i], steps - 1 - i) + 1)
        least[i] = min([1.0 + least[i + 1], *(cost(k + 1) + least[i + k + 1] for k in drafts)])
    return steps / least[0]


def ngram_ceiling(
    backend: LocalBackend[Any], prompt: list[int], output: list[int], sources: Sequence[str]
) -> float | None:
    """``oracle_ceiling`` for Kode's n-gram drafter (fed as the backend feeds it) on the
    backend's calibrated cost curve, up to its policy's longest draft."""
    from kode.backends.speculative import NgramDrafter

    template = backend.learning.drafter
    drafter = NgramDrafter(min_n=template.min_n, max_n=template.max_n)
    for text in sources:
        if text:
            drafter.add_source(backend.engine.tokenize(text, special=False))
    kmax = backend.learning.policy.max_draft
    return oracle_ceiling(
        prompt, output, lambda ctx: drafter.propose(ctx, kmax, 3), backend.curve.cost, kmax
    )


def ceiling_table(runs: Sequence[Run]) -> str:
    """Per workload: the median n-gram oracle ceiling next to ``auto``'s median speedup."""
    body = []
    for workload in dict.fromkeys(r.workload for r in runs):
        ceilings = [r.ceiling for r in runs if r.workload == workload and r.ceiling]
        if not ceilings:
            continue
        median, best = report.median(ceilings), max(ceilings)
        body.append([workload, len(ceilings), fmt(median, 2, "x"), fmt(best, 2, "x")])
    if not body:
        return ""
    headers = ["workload", "prompts", "median n-gram oracle ceiling", "best prompt"]
    return markdown_table(headers, body)


def summarize(runs: list[Run], methods: Sequence[str]) -> list[Row]:
    rows: list[Row] = []
    for workload in dict.fromkeys(r.workload for r in runs):
        mine = [r for r in runs if r.workload == workload]
        base = {r.task_id: r.ms_per_token for r in mine if r.method == PLAIN and r.ms_per_token}
        for method in methods:
            got = [r for r in mine if r.method == method]
            if not got:
                continue
            other = {r.task_id: r.ms_per_token for r in got if r.ms_per_token}
            ratios = report.pairwise_speedups(base, other)
            means = [r.accepted_mean for r in got if r.accepted_mean is not None]
            verdicts = [r.verdict for r in got]
            rows.append(
                Row(
                    workload=workload,
                    method=method,
                    runs=len(got),
                    ms_per_token=report.median(other.values()),
                    speedup=report.median(ratios),
                    pairs=len(ratios),
                    accepted_mean=report.mean(means),
                    identical=verdicts.count("identical"),
                    near_ties=verdicts.count("near-tie"),
                    diverged=verdicts.count("diverged"),
                    unknown=verdicts.count("unknown"),
                    ran_as=",".join(sorted({r.ran_as for r in got if r.ran_as})) or report.UNKNOWN,
                    compared=len([v for v in verdicts if v != "(plain)"]),
                )
            )
    return rows


def render_table(rows: Sequence[Row]) -> str:
    headers = [
        "workload",
        "method",
        "ran as",
        "runs",
        "median ms/token",
        "median speedup (pairs)",
        "mean accepted length",
        "identical to plain",
        "near ties",
        "diverged",
        "gap unknown",
    ]
    body = [
        [
            r.workload,
            r.method,
            r.ran_as,
            r.runs,
            fmt(r.ms_per_token),
            f"{fmt(r.speedup, 2, 'x')} ({r.pairs})" if r.method != PLAIN else "1.00x",
            fmt(r.accepted_mean, 2),
            fmt_ratio(r.identical, r.compared) if r.method != PLAIN else report.UNKNOWN,
            r.near_ties if r.method != PLAIN else report.UNKNOWN,
            r.diverged if r.method != PLAIN else report.UNKNOWN,
            r.unknown if r.method != PLAIN else report.UNKNOWN,
        ]
        for r in rows
    ]
    return markdown_table(headers, body)


def chart(rows: Sequence[Row], path: Path, title: str) -> None:
    methods = list(dict.fromkeys(r.method for r in rows))
    series = {}
    for workload in dict.fromkeys(r.workload for r in rows):
        got = {r.method: r.speedup for r in rows if r.workload == workload}
        series[workload] = [1.0 if m == PLAIN else (got.get(m) or 0.0) for m in methods]
    with charts.figure(path, (max(6.0, 1.1 * len(methods) + 2), 4.0)) as ax:
        charts.grouped_bars(ax, methods, series, rotation=20, ha="right")
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_ylabel("median speedup over plain greedy (pairwise)")
        ax.set_title(title)
        ax.legend()


# -- running ----------------------------------------------------------------------------


async def load_backend(model: Path, draft: Path | None, threads: int | None) -> LlamaBackend:
    from kode.backends.llama.backend import LlamaBackend

    return await LlamaBackend.load(model, n_threads=threads, draft_path=draft)


async def run_kode(backend: Any, prompt: Prompt, method: str, max_tokens: int) -> Run:
    from kode.backends.base import GenerationRequest, SpeculationMethod

    request = GenerationRequest(
        prompt=prompt.text,
        max_tokens=max_tokens,
        speculation=SpeculationMethod(method),
        draft_sources=prompt.draft_sources,
    )
    generation = await backend.generate(request)
    tokens: list[int] = []
    async for chunk in generation:
        tokens.extend(chunk.token_ids)
    stats = await generation.wait()
    spec = stats.speculation
    return Run(
        workload=prompt.workload,
        task_id=prompt.task_id,
        method=method,
        tokens=tokens,
        ms_per_token=stats.ms_per_token if stats.completion_tokens >= 2 else None,
        ttft_ms=stats.ttft_ms,
        total_ms=stats.total_ms,
        ran_as=spec.method,
        steps=spec.steps,
        drafted=spec.drafted,
        accepted=spec.accepted,
        accepted_mean=spec.accepted_mean if spec.steps else None,
    )


def _server_run(
    prompt: Prompt, name: str, data: dict[str, Any], is_stop: Callable[[int], bool]
) -> Run:
    raw = [int(t) for t in data.get("tokens") or []]
    tokens: list[int] = []
    for t in raw:
        if is_stop(t):
            break
        tokens.append(t)
    timings = data.get("timings") or {}
    n = int(timings.get("predicted_n") or len(tokens))
    drafted = timings.get("draft_n")
    accepted = timings.get("draft_n_accepted")
    mean_len = None
    if isinstance(accepted, int) and n > accepted:
        mean_len = n / (n - accepted)
    per = timings.get("predicted_per_token_ms")
    return Run(
        workload=prompt.workload,
        task_id=prompt.task_id,
        method=name,
        tokens=tokens,
        ms_per_token=float(per) if per else None,
        ttft_ms=float(timings.get("prompt_ms") or 0.0),
        total_ms=float(timings.get("prompt_ms") or 0.0) + float(timings.get("predicted_ms") or 0.0),
        ran_as=name.split("/", 1)[-1],
        drafted=int(drafted) if isinstance(drafted, int) else None,
        accepted=int(accepted) if isinstance(accepted, int) else None,
        accepted_mean=mean_len,
    )


async def measure(options: Options) -> tuple[list[Run], dict[str, Any]]:
    """Run every method on every prompt; the runs and facts about the setup."""
    from kode.backends import models
    from kode.completion.templates import QWEN25_CODER, render

    prompts: list[Prompt] = []
    if "humaneval" in options.workloads:
        prompts += humaneval_prompts(options.tasks, options.seed)
    if "edit" in options.workloads:
        prompts += edit_prompts(options.tasks, options.seed)
    kode_methods = [m for m in options.methods if m in KODE_METHODS]
    if PLAIN not in kode_methods:
        kode_methods.insert(0, PLAIN)  # the baseline every ratio needs
    model_path = models.resolve(options.model)
    draft_path = models.resolve(options.draft_model) if "draft" in options.methods else None
    backend = await load_backend(model_path, draft_path, options.threads)
    facts: dict[str, Any] = {
        "model": str(model_path),
        "draft_model": None if draft_path is None else str(draft_path),
        "prompts": len(prompts),
        "max_tokens": options.max_tokens,
        "seed": options.seed,
        "machine_before": report.machine_note(),
    }
    runs: list[Run] = []
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(backend.aclose)
        is_stop: Callable[[int], bool] = backend.model.is_stop
        token_ids = {p.task_id: backend.model.tokenize(p.text) for p in prompts}
        pld: peers.PldPeer | None = None
        if PEER_PLD in options.methods and prompts:
            longest = max(len(t) for t in token_ids.values())
            n_ctx = -(-(longest + options.max_tokens + options.pld_tokens + 16) // 256) * 256
            from kode.backends.system import usable_cores

            pld = await peers.on_llama_thread(
                peers.PldPeer,
                model_path,
                n_ctx,
                options.pld_tokens,
                options.threads or usable_cores(),
            )
            stack.callback(pld.close)
            facts["pld_n_ctx"] = n_ctx
        servers: list[Any] = []
        if PEER_SERVER in options.methods:
            servers = await peers.start_servers(
                stack,
                model_path,
                lambda: draft_path or models.resolve(options.draft_model),
                options.out / "llama-server",
                facts,
            )

        # Warm up every method (loads a draft model, pages weights in) on a tiny prompt.
        warm = Prompt("warmup", "warmup", render(QWEN25_CODER, "def add(a, b):\n    return", "\n"))
        for method in kode_methods:
            await run_kode(backend, warm, method, 8)
        if pld is not None:
            await peers.on_llama_thread(pld.generate, backend.model.tokenize(warm.text), 8, is_stop)
        for server in servers:
            await server.completion(backend.model.tokenize(warm.text), 8)

        entries: list[str] = [*kode_methods]
        if pld is not None:
            entries.append(PLD_NAME)
        entries.extend(s.mode.name for s in servers)
        by_name = {s.mode.name: s for s in servers}
        bar = report.progress(len(prompts) * len(entries), "speculation")
        try:
            for index, prompt in enumerate(prompts):
                for entry in harness.rotated(entries, index):
                    bar.set_postfix_str(f"{prompt.task_id} {entry}", refresh=False)
                    if entry in KODE_METHODS:
                        run = await run_kode(backend, prompt, entry, options.max_tokens)
                    elif entry == PLD_NAME and pld is not None:
                        toks, per, ttft, total = await peers.on_llama_thread(
                            pld.generate, token_ids[prompt.task_id], options.max_tokens, is_stop
                        )
                        run = Run(prompt.workload, prompt.task_id, PLD_NAME, toks, per, ttft, total)
                    else:
                        data = await by_name[entry].completion(
                            token_ids[prompt.task_id], options.max_tokens
                        )
                        run = _server_run(prompt, entry, data, is_stop)
                    runs.append(run)
                    bar.update(1)
        finally:
            bar.close()

        gap_cache: dict[str, list[float] | None] = {}
        texts = {p.task_id: p.text for p in prompts}
        plain_tokens = {r.task_id: r.tokens for r in runs if r.method == PLAIN}
        needs = {
            r.task_id
            for r in runs
            if r.method != PLAIN
            and report.first_divergence(plain_tokens.get(r.task_id, []), r.tokens) is not None
        }
        for task_id in sorted(needs):
            gaps = await backend.logit_gaps(texts[task_id], plain_tokens.get(task_id, []))
            gap_cache[task_id] = gaps
        classify(runs, lambda task_id: gap_cache.get(task_id), options.near_tie)
        facts["curve"] = {n: round(ms, 1) for n, ms in backend.curve.ms_by_rows.items()}
        sources = {p.task_id: p.draft_sources for p in prompts}
        for run in runs:
            if run.method == PLAIN:
                run.ceiling = ngram_ceiling(
                    backend, token_ids[run.task_id], run.tokens, sources[run.task_id]
                )
    facts["machine_after"] = report.machine_note()
    return runs, facts


def write_report(options: Options, runs: list[Run], facts: dict[str, Any]) -> tuple[str, str]:
    """The report's text and the table printed; the runs and the chart written to ``out``."""
    methods = [m for m in KODE_METHODS if any(r.method == m for r in runs)]
    methods += list(dict.fromkeys(r.method for r in runs if r.method not in KODE_METHODS))
    rows = summarize(runs, methods)
    out = report.prepare_out(options.out)
    table = render_table(rows)
    gaps_note = "near ties judged with the backend's `logit_gaps`"
    text = (
        "# Speculative decoding benchmark\n\n"
        f"- model: `{facts['model']}`; draft model: `{facts.get('draft_model')}`\n"
        f"- prompts: {facts['prompts']} ({', '.join(options.workloads)}; "
        f"{options.tasks} per workload, seed {options.seed}); max tokens {options.max_tokens}; "
        "greedy\n"
        f"- llama-server: `{facts.get('llama_server')}`\n"
        f"- speed: decode ms per token after the first; speedup: median over prompts of "
        f"plain ms/token / method ms/token on the same prompt (pairs in brackets)\n"
        f"- lossless check: token ids against plain greedy; {gaps_note} "
        f"(near tie: gap < {options.near_tie:g})\n"
        "- `ran as`: the method the backend reports it used (`none` = decoded plainly); "
        "rows that ran as `none` all decode plainly, so their spread around 1.00x is this "
        "run's noise floor\n"
        f"{report.machine_line(facts)}\n\n" + table
    )
    ceilings = ceiling_table(runs)
    if ceilings:
        text += (
            "\n\n## What n-gram drafting could reach on this machine\n\n"
            f"Target batch cost, ms by rows (calibrated at load): `{facts.get('curve')}`. "
            "The ceiling is the speedup of an oracle that drafts, at every step, exactly "
            "the part of Kode's best n-gram candidate that plain greedy decoding goes on "
            "to produce (never a wasted row), and decodes plainly where a batch would not "
            "pay: no draft-length policy over these drafts can beat it on this cost curve.\n\n"
            + ceilings
        )
        table += "\n\n" + ceilings
    report.write_jsonl(out / "runs.jsonl", (asdict(r) for r in runs))
    if rows:
        chart(rows, out / "speedup.png", f"Speculation speedup ({Path(facts['model']).name})")
    return text, table


def main(options: Options) -> int:
    runs, facts = asyncio.run(measure(options))
    text, table = write_report(options, runs, facts)
    report.publish(options.out, "report.md", text, table, "speedup.png")
    return 0
