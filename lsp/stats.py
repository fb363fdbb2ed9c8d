"""``kode/stats``: what a window reports about itself, for status bars, the benchmarks
and bug reports. Counts, timings and settings only: never a path, a line of code or a
secret (the remote API key is shown only as set)."""

from __future__ import annotations

from typing import Any

import msgspec
from kode.backends.base import Backend, ChunkAssembly, EngineReport, KvMemoryReport
from kode.completion import settings as settings_mod
from kode.completion.engine import CompletionEngine
from kode.completion.suggestion import Completion


def stats_report(engine: CompletionEngine, backend: Backend | None) -> dict[str, Any]:
    """The answer to ``kode/stats`` for ``engine`` and its current ``backend``."""
    return {
        "backend": None if backend is None else backend.name,
        "model": None if backend is None else backend.model_name,
        "counters": None if backend is None else backend.counters.as_dict(),
        "engine": {
            "typedAheadHits": engine.typed_ahead_hits,
            "prefetches": engine.preparation.prefetches,
            "readAheads": engine.preparation.read_aheads,
            "prepared": engine.preparation.prepared,
            "preparing": engine.preparation.preparing,
            "shortAnswers": engine.short_answers,
            "keptSnippets": engine.kept_snippets,
            "cursorMoves": engine.cursor_moves,
            "prefillTokensPerS": engine.rate.value,
            "assembledAnswers": engine.windows.assembled,
            "assembledPreparations": engine.preparation.assembled,
            "regionsRead": engine.preparation.reader.regions,
            "tokensRead": engine.preparation.reader.tokens,
        },
        "lastCompletion": _last_completion(engine.last_answer),
        "kvMemory": backend.kv_memory if isinstance(backend, KvMemoryReport) else None,
        "chunkStore": backend.chunk_store if isinstance(backend, ChunkAssembly) else None,
        "engineProcess": _engine_process(backend),
        "settings": _redacted(engine.settings),
        "workspace": _index_stats(engine),
    }


def _last_completion(answer: Completion | None) -> dict[str, Any] | None:
    """The last non-empty answer, for status bars: ``answerMs`` from the request to the
    answer (0 for one typed ahead), and the generation that made it: its tokens, time to
    the first token, time in all, and ``tokensPerS``, the decode speed after the first
    token (null with fewer than two tokens: there is nothing to time)."""
    if answer is None:
        return None
    stats = answer.stats
    decode_ms = stats.total_ms - stats.ttft_ms
    speed = None
    if stats.completion_tokens >= 2 and decode_ms > 0:
        speed = round((stats.completion_tokens - 1) / decode_ms * 1000.0, 1)
    return {
        "answerMs": round(answer.total_ms, 1),
        "fromCache": answer.from_cache,
        "completionTokens": stats.completion_tokens,
        "ttftMs": round(stats.ttft_ms, 1),
        "generationMs": round(stats.total_ms, 1),
        "tokensPerS": speed,
        # the names monitor: dereferences it held to known members, picks under its mask
        "namesMonitor": {
            "fired": stats.monitor_fired,
            "picks": stats.monitor_picks,
            "ms": round(stats.monitor_ms, 1),
        },
    }


def _redacted(settings: settings_mod.Settings) -> dict[str, Any]:
    """Settings for ``kode/stats``: the remote API key is a secret, shown only as set."""
    out: dict[str, Any] = msgspec.to_builtins(settings)
    if out["remote"]["apiKey"]:
        out["remote"]["apiKey"] = "(set)"
    return out


def _engine_process(backend: Backend | None) -> dict[str, Any] | None:
    """Which process runs the model: the shared engine (pid, socket) or this one."""
    return backend.engine_info if isinstance(backend, EngineReport) else None


def _index_stats(engine: CompletionEngine) -> dict[str, Any] | None:
    """Counts only: the index never reports paths or text."""
    index = engine.workspace
    if index is None:
        return None
    stats = index.stats
    return {
        "files": stats.files,
        "words": stats.words,
        "postings": stats.postings,
        "approxBytes": stats.approx_bytes,
        "complete": stats.complete,
        "truncated": stats.truncated,
        "skipped": {
            "ignored": stats.skipped_ignored,
            "binary": stats.skipped_binary,
            "large": stats.skipped_large,
            "special": stats.skipped_special,  # FIFOs, sockets, devices: never opened
            "unreadable": stats.skipped_unreadable,
            "crashedParser": stats.crashed,
            "parseTimedOut": stats.timed_out,
        },
        "parsedInChild": stats.parsed_in_child,
        "parsedInServer": stats.parsed_here,
        "updates": stats.updates,
    }
