"""``kode bench context``'s measurements without a model: the workspace index alone
(``--latency-files``: build time, memory, retrieval per cursor over a real tree), the
retrieved snippets while the holes' lines are typed (``--keystrokes``), and whether the
renamed name reaches the prompt the engine fits (``--fitted``: the tokenizer only)."""

from __future__ import annotations

import functools
import itertools
import random
import re
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kode.bench import report
from kode.bench.context_holes import Prepared, collect, prepare

if TYPE_CHECKING:
    from kode.bench.context import Options

RETRIEVAL_TOKENS = 512  # the retrieval budget (``retrievalTokens``) unless told


def built_index(prepared: Prepared) -> Any:
    """The workspace index of a hole's renamed copy, built, its parsing child closed
    (nothing is re-indexed during a hole)."""
    from kode.completion.project.workspace import WorkspaceIndex

    index = WorkspaceIndex([prepared.root])
    index.build()
    index.close()
    return index


def _hole_retriever(prepared: Prepared) -> tuple[Any, Path]:
    """A retriever over the hole's built index, and the edited module's path."""
    from kode.completion.project.index_worker import read_text
    from kode.completion.project.retrieval import Retriever
    from kode.completion.project.workspace import IndexLimits

    limit = IndexLimits().max_file_bytes
    retriever = Retriever(built_index(prepared), functools.partial(read_text, max_bytes=limit))
    return retriever, (prepared.root / prepared.hole.module).resolve()


def typing_changes(snippets: Sequence[tuple[tuple[str, str], ...]]) -> tuple[int, int]:
    """For the snippets at the resting cursor (``snippets[0]``, what background
    preparation evaluates while the user reads) and after each keystroke: how many
    keystrokes changed them from the previous one, and how many saw other snippets than
    the prepared ones (each such keystroke must evaluate the prompt again from the first
    changed snippet on, or answer from a shorter window).

    >>> a, b = (("m.py", "x"),), (("m.py", "x"), ("n.py", "y"))
    >>> typing_changes([a, a, a, b, b])
    (1, 2)
    """
    changed = sum(1 for x, y in itertools.pairwise(snippets) if x != y)
    differs = sum(1 for x in snippets[1:] if x != snippets[0])
    return changed, differs


def measure_keystrokes(options: Options) -> dict[str, Any]:
    """Retype each hole's line, key by key, in its renamed workspace copy and count the
    keystrokes whose retrieved snippets differ from the line's start (``typing_changes``)."""
    keys = changed = differs = lines_changed = 0
    measure, budget = budget_measure(options.model, options.retrieval_tokens)
    for hole, root in collect(options.packages, options.holes, options.seed):
        with tempfile.TemporaryDirectory(prefix="kode-context-") as tmp:
            prepared = prepare(hole, root, Path(tmp), options.seed)
            retriever, path = _hole_retriever(prepared)
            before = prepared.document[: prepared.offset]
            after = prepared.document[prepared.offset :]
            seen: list[tuple[tuple[str, str], ...]] = []
            for i in range(len(prepared.expected) + 1):
                text = before + prepared.expected[:i] + after
                got = retriever.retrieve(path, text, prepared.offset + i, budget, measure=measure)
                seen.append(tuple((r.snippet.path, r.snippet.text) for r in got))
            c, d = typing_changes(seen)
            keys += len(seen) - 1
            changed += c
            differs += d
            lines_changed += bool(c)
    return {
        "measured in": _unit(measure),
        "keystrokes": keys,
        "keystrokes that changed the snippets": changed,
        "keystrokes whose snippets differ from the prepared ones": differs,
        "lines with any change": lines_changed,
    }


def budget_measure(model: str, retrieval_tokens: int) -> tuple[Any, int]:
    """How the engine counts the retrieval budget: ``model``'s tokens (its
    tokenizer only, no weights), else characters, 4 a token (no model installed)."""
    from kode.completion.project.outline import CHARS, Measure

    count = token_counter(model)
    if count is None:
        return CHARS, retrieval_tokens * 4
    return Measure.tokens(count), retrieval_tokens


def _unit(measure: Any) -> str:
    from kode.completion.project.outline import CHARS

    return "characters (4 a token)" if measure is CHARS else "model tokens"


@functools.cache
def token_counter(model: str) -> Any:
    """``model``'s token count (the tokenizer loaded without the weights), or None when
    the model is not installed."""
    try:
        from kode.backends import models
        from kode.backends.llama.runtime import LlamaModel

        path = models.resolve(model, auto_install=False)
        vocab = LlamaModel(path, vocab_only=True)
    except Exception:
        return None

    def count(text: str) -> int:
        return len(vocab.tokenize(text))

    return functools.lru_cache(maxsize=16384)(count)


def measure_fitted(options: Options) -> dict[str, Any]:
    """For each hole, the retrieval condition's prompt as the engine fits it (the sibling
    open, ``retrievalTokens`` of the model's tokens; no weights, no completion): does the
    renamed name reach it, and what the retrieved part holds."""
    from kode.completion import context as ctxmod
    from kode.completion.documents import Document
    from kode.completion.project.retrieval import Source
    from kode.completion.settings import parse
    from kode.completion.windows import prompt_budget

    count = token_counter(options.model)
    if count is None:
        return {"fitted": "the model's tokenizer is not installed"}
    measure, budget = budget_measure(options.model, options.retrieval_tokens)
    settings, problems = parse(
        {
            "retrievalTokens": options.retrieval_tokens,
            **({} if options.prefix_tokens is None else {"prefixTokens": options.prefix_tokens}),
        }
    )
    assert not problems, problems
    hits: list[str] = []
    misses: list[str] = []
    definitions = tokens = 0
    holes = collect(options.packages, options.holes, options.seed)
    for hole, root in holes:
        with tempfile.TemporaryDirectory(prefix="kode-context-") as tmp:
            prepared = prepare(hole, root, Path(tmp), options.seed)
            retriever, path = _hole_retriever(prepared)
            got = retriever.retrieve(
                path, prepared.document, prepared.offset, budget, measure=measure
            )
            sibling = prepared.sibling
            others = [] if sibling is None else [Document(sibling.as_uri(), sibling.read_text())]
            doc = Document(path.as_uri(), prepared.document)
            fit = prompt_budget(settings, options.max_tokens)
            opened = ctxmod.gather(doc, prepared.offset, count, fit, others=others).snippets
            ctx = ctxmod.gather(doc, prepared.offset, count, fit, others=others, retrieved=got)
            kept = ctx.snippets[len(opened) :]
            text = "".join(s.text for s in kept)
            (hits if re.search(rf"\b{re.escape(prepared.renamed)}\b", text) else misses).append(
                prepared.renamed
            )
            shown = {s.text for s in kept}
            definitions += sum(
                1 for r in got if r.source is Source.DEFINITION and r.snippet.text in shown
            )
            tokens += sum(count(s.text) + 8 for s in kept)
    return {
        "holes": len(holes),
        "renamed name in the fitted retrieved context": len(hits),
        "misses": ", ".join(misses),
        "definitions kept whole (all holes)": definitions,
        "retrieved tokens per hole (mean)": round(tokens / max(len(holes), 1), 1),
    }


def latency_tree() -> list[Path]:
    """A real tree: the standard library, then site-packages, walked as workspace folders
    (the index's ``max_files`` cuts it)."""
    roots = [Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"])]
    return [r for r in roots if r.is_dir()]


def measure_index(n_files: int, queries: int, seed: int, model: str = "default") -> dict[str, Any]:
    """Build an index of ``n_files`` real files, then time retrieval at ``queries``
    random cursors of random indexed Python files (no model; the budget counted in
    ``model``'s tokens, as the engine does, when its tokenizer is installed)."""
    import tracemalloc

    from kode.completion.project.index_worker import read_text
    from kode.completion.project.retrieval import Retriever
    from kode.completion.project.workspace import IndexLimits, WorkspaceIndex

    roots = latency_tree()
    tracemalloc.start()
    index = WorkspaceIndex(roots, IndexLimits(max_files=n_files))
    build_cpu = time.process_time()
    stats = index.build()
    build_cpu = time.process_time() - build_cpu
    child_mb = round(index.worker_peak_kb / 1024, 1)
    index.close()
    _, peak = tracemalloc.get_traced_memory()
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rng = random.Random(seed)
    files = sorted(p for root in roots for p in root.rglob("*.py") if index.entry(p) is not None)
    retriever = Retriever(index, lambda p: read_text(p, index.limits.max_file_bytes))
    measure, budget = budget_measure(model, RETRIEVAL_TOKENS)
    times: list[float] = []
    cpu: list[float] = []
    chars: list[float] = []
    for path in rng.sample(files, min(queries, len(files))):
        text = read_text(path, index.limits.max_file_bytes) or ""
        offset = rng.randrange(len(text) + 1)
        started, started_cpu = time.perf_counter(), time.thread_time()
        got = retriever.retrieve(path, text, offset, budget, measure=measure)
        times.append((time.perf_counter() - started) * 1000.0)
        cpu.append((time.thread_time() - started_cpu) * 1000.0)
        chars.append(float(sum(len(r.snippet.text) for r in got)))
    return {
        "files": stats.files,
        "words": stats.words,
        "postings": stats.postings,
        "build_s": round(stats.build_s, 2),
        "build_cpu_s in this process (traced)": round(build_cpu, 2),
        "truncated": stats.truncated,
        "skipped": [stats.skipped_ignored, stats.skipped_binary, stats.skipped_large],
        "approx_mb": round(stats.approx_bytes / 1e6, 1),
        "traced_mb": round(current / 1e6, 1),
        "traced_peak_mb": round(peak / 1e6, 1),
        "parsed in child / here": [stats.parsed_in_child, stats.parsed_here],
        "child_peak_rss_mb": child_mb,
        "queries": len(times),
        "wall_p50_ms": report.percentile(times, 50),
        "wall_p95_ms": report.percentile(times, 95),
        "wall_max_ms": max(times) if times else None,
        "cpu_p50_ms": report.percentile(cpu, 50),
        "cpu_p95_ms": report.percentile(cpu, 95),
        "cpu_max_ms": max(cpu) if cpu else None,
        "load_after": report.machine_note(),
        "measured in": _unit(measure),
        "mean_chars": report.mean(chars),
    }
