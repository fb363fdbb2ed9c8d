"""llama.vim's way on the places replay: the peer of ``kode bench latency --scenario
places`` when a ``llama-server`` binary is found (``bench/llama_server.py``).

What llama.vim does (its ``autoload/llama.vim``, defaults; facts, not its code):

- **Every keystroke in insert mode** asks ``/infill`` with the 256 lines before the
  cursor's line (``input_prefix``), the cursor line up to the cursor (``prompt``), the
  rest of the line and the 64 lines after (``input_suffix``), the ring of extra chunks
  (``input_extra``), ``n_predict`` 256, ``t_max_predict_ms`` 1500, ``cache_prompt``.
- **One request at a time**: while one is in flight, a keystroke re-arms a 100 ms timer
  instead of sending; when it fires and nothing is in flight, it asks for the text as it
  is then. Nothing is cancelled.
- **A cache of answers**: an ask whose prefix, line and suffix were answered before, or
  that only typed up to 10 more characters of such an answer, is shown at once from it.
- **The ring of extra context**: chunks of half of 64 lines are picked when a buffer is
  entered or left (only from unmodified buffers), and, when the cursor is more than 32
  lines from where chunks were last picked, from beyond the prefix (up to 1,024 lines
  above) and below the suffix; up to 16 are kept. Every second, in normal mode or once
  the cursor has rested for 3 s, one queued chunk joins the ring and a request with
  ``n_predict`` 0 evaluates the ring on the server (its KV cache keeps it).
- The server: ``--cache-reuse 256`` (reuse cached chunks at shifted positions), batch
  1,024 (``--fim-qwen-*-default`` presets), one slot.

The replay types the same places, lines and cadence as Kode's; "shown" is an answer with
text, as llama.vim renders it (trailing blank lines dropped, a repeat of the line's
suffix or of the next line dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kode.bench.latency import Keystroke, mark_matches

N_PREFIX = 256
N_SUFFIX = 64
N_PREDICT = 256
T_MAX_PREDICT_MS = 1500
CHUNK_LINES = 64
RING_CHUNKS = 16
RING_SCOPE = 1024
RING_UPDATE_S = 1.0
REST_S = 3.0
TIMER_S = 0.1
CACHE_BACK = 10
SERVER_ARGS = ("--cache-reuse", "256", "--batch-size", "1024", "--ubatch-size", "1024")


@dataclass(frozen=True, slots=True)
class Ask:
    """What llama.vim sends for a cursor at (``y``, ``x``) of ``lines``."""

    prefix: str
    middle: str
    suffix: str

    @property
    def key(self) -> str:
        return _hash(self.prefix, self.middle, self.suffix)


def _hash(prefix: str, middle: str, suffix: str) -> str:
    return hashlib.sha256(f"{prefix}\x00{middle}\x00{suffix}".encode()).hexdigest()


def ask_at(lines: Sequence[str], y: int, x: int) -> Ask:
    """The local context llama.vim sends (0-based ``y``; a blank line counts from its
    start, as llama.vim does)."""
    line = lines[y]
    before, after = line[:x], line[x:]
    if not line.strip():
        before, after = "", ""
    prefix = "\n".join(lines[max(0, y - N_PREFIX) : y]) + "\n"
    suffix = after + "\n" + "\n".join(lines[y + 1 : y + 1 + N_SUFFIX]) + "\n"
    return Ask(prefix, before, suffix)


def from_cache(cache: dict[str, str], ask: Ask) -> str | None:
    """The cached answer for ``ask``, or for the same place up to ``CACHE_BACK``
    characters earlier whose answer starts with what was typed since (the rest of it)."""
    if ask.key in cache:
        return cache[ask.key]
    for i in range(1, CACHE_BACK + 1):
        if i > len(ask.middle):
            break
        removed = ask.middle[-i:]
        earlier = _hash(ask.prefix, ask.middle[:-i], ask.suffix)
        if earlier in cache:
            content = cache[earlier]
            if not content or not content.startswith(removed):
                return None
            cache[ask.key] = content[i:]
            return content[i:]
    return None


def rendered(content: str, lines: Sequence[str], y: int, x: int) -> str:
    """What llama.vim would draw of ``content`` at (``y``, ``x``): empty when it shows
    nothing (trailing blank lines dropped; a repeat of the line's rest or of the next
    non-blank line dropped)."""
    parts = content.split("\n")
    while parts and parts[-1] == "":
        parts.pop()
    if not parts:
        return ""
    line = lines[y]
    if len(parts) == 1 and parts[0] == line[x:]:
        return ""
    below = next((s for s in lines[y + 1 :] if s.strip()), None)
    if len(parts) == 1 and below is not None and line[:x] + parts[0] == below:
        return ""
    return "\n".join(parts) if any(p.strip() for p in parts) else ""


def pick_chunk(text: Sequence[str], rng: random.Random) -> list[str] | None:
    """A chunk of half ``CHUNK_LINES`` lines from ``text`` (all of it when short); None
    for fewer than 3 lines."""
    if len(text) < 3:
        return None
    if len(text) + 1 < CHUNK_LINES:
        return list(text)
    start = rng.randint(0, max(0, len(text) - CHUNK_LINES // 2))
    return list(text[start : min(start + CHUNK_LINES // 2 + 1, len(text))])


def _similar(a: Sequence[str], b: Sequence[str]) -> float:
    common = sum(1 for line in a if line in b)
    return 2.0 * common / (len(a) + len(b))


@dataclass(slots=True)
class Ring:
    """The extra-context chunks: queued, then moved into the ring once a second."""

    rng: random.Random
    queued: list[tuple[str, list[str]]] = field(default_factory=list)
    chunks: list[tuple[str, list[str]]] = field(default_factory=list)

    def pick(self, filename: str, text: Sequence[str], *, evict: bool) -> None:
        chunk = pick_chunk(text, self.rng)
        if chunk is None or any(c == chunk for _, c in self.queued + self.chunks):
            return
        for group in (self.queued, self.chunks):
            for i in range(len(group) - 1, -1, -1):
                if _similar(group[i][1], chunk) > 0.9:
                    if not evict:
                        return
                    del group[i]
        if len(self.queued) == 16:
            del self.queued[0]
        self.queued.append((filename, chunk))

    def step(self) -> bool:
        """Move one queued chunk into the ring; whether there was one."""
        if not self.queued:
            return False
        if len(self.chunks) == RING_CHUNKS:
            del self.chunks[0]
        self.chunks.append(self.queued.pop(0))
        return True

    def extra(self) -> list[dict[str, str]]:
        return [{"filename": name, "text": "\n".join(c) + "\n"} for name, c in self.chunks]


class LlamaVim:
    """One editor with llama.vim against one ``llama-server`` (``url``)."""

    def __init__(self, url: str, client: Any, seed: int) -> None:
        self.url = url
        self.client = client  # httpx.AsyncClient
        self.ring = Ring(random.Random(seed))
        self.cache: dict[str, str] = {}
        self.in_flight: asyncio.Task[None] | None = None
        self.ring_jobs: set[asyncio.Future[dict[str, Any]]] = set()
        self.last_move = time.perf_counter()
        self.insert_mode = False
        self.pick_y = -9999
        self.stats: dict[str, int] = {"asks": 0, "cacheHits": 0, "ringUpdates": 0}

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        reply = await self.client.post(f"{self.url}/infill", json=body)
        reply.raise_for_status()
        data: dict[str, Any] = reply.json()
        return data

    async def ring_loop(self) -> None:
        """Every second: in normal mode or after a 3 s rest, one queued chunk joins the
        ring and the server evaluates the ring (``n_predict`` 0)."""
        while True:
            await asyncio.sleep(RING_UPDATE_S)
            rested = time.perf_counter() - self.last_move >= REST_S
            if (self.insert_mode and not rested) or not self.ring.step():
                continue
            self.stats["ringUpdates"] += 1
            body = {
                "input_prefix": "",
                "input_suffix": "",
                "input_extra": self.ring.extra(),
                "prompt": "",
                "n_predict": 0,
                "temperature": 0.0,
                "samplers": [],
                "cache_prompt": True,
                "t_max_prompt_ms": 1,
                "t_max_predict_ms": 1,
                "response_fields": [""],
            }
            job = asyncio.ensure_future(self._post(body))
            self.ring_jobs.add(job)
            job.add_done_callback(self.ring_jobs.discard)

    def enter(self, filename: str, lines: Sequence[str], y: int, *, modified: bool) -> None:
        """BufEnter (and the previous buffer's BufLeave, done by the caller)."""
        if not modified:
            lo, hi = max(0, y - CHUNK_LINES // 2), min(len(lines), y + CHUNK_LINES // 2 + 1)
            self.ring.pick(filename, lines[lo:hi], evict=True)

    def moved(self) -> None:
        self.last_move = time.perf_counter()

    def ask(
        self, filename: str, lines: Sequence[str], y: int, x: int, key: Keystroke
    ) -> asyncio.Task[None] | None:
        """llama.vim's FIM for the cursor now: from the cache at once, else a request
        (the caller only calls this when none is in flight)."""
        ask = ask_at(lines, y, x)
        cached = from_cache(self.cache, ask)
        if cached is not None:
            self.stats["cacheHits"] += 1
            self._show(key, cached, lines, y, x)
            return None
        self.stats["asks"] += 1
        body = {
            "input_prefix": ask.prefix,
            "input_suffix": ask.suffix,
            "input_extra": self.ring.extra(),
            "prompt": ask.middle,
            "n_predict": N_PREDICT,
            "n_indent": len(ask.middle) - len(ask.middle.lstrip()),
            "top_k": 40,
            "top_p": 0.99,
            "stream": False,
            "samplers": ["top_k", "top_p", "infill"],
            "cache_prompt": True,
            "t_max_prompt_ms": 500,
            "t_max_predict_ms": T_MAX_PREDICT_MS,
        }
        snapshot = list(lines)

        async def run() -> None:
            data = await self._post(body)
            content = str(data.get("content") or "")
            self.cache[ask.key] = content
            key.stats = {
                "promptN": (data.get("timings") or {}).get("prompt_n"),
                "tokensCached": data.get("tokens_cached"),
            }
            if lines[y] != snapshot[y]:
                # Typed on meanwhile: the next ask takes it from the cache if it still
                # fits what was typed (``from_cache``), as llama.vim does.
                if key.answered is None:
                    key.answered, key.outcome = time.perf_counter(), "stale"
                return
            self._show(key, content, snapshot, y, x)

        task = asyncio.ensure_future(run())
        self.in_flight = task
        # Chunks from beyond the local context when the cursor moved far.
        if abs(y - self.pick_y) > 32:
            self.ring.pick(
                filename, lines[max(0, y - RING_SCOPE) : max(0, y - N_PREFIX)], evict=False
            )
            lo = min(len(lines), y + N_SUFFIX)
            self.ring.pick(filename, lines[lo : min(len(lines), lo + CHUNK_LINES)], evict=False)
            self.pick_y = y
        return task

    @staticmethod
    def _show(key: Keystroke, content: str, lines: Sequence[str], y: int, x: int) -> None:
        now = time.perf_counter()
        text = rendered(content, lines, y, x)
        if key.answered is None:
            key.answered = now
            key.suggestion = text
            key.outcome = "shown" if text else "empty"

    async def aclose(self) -> None:
        for job in [self.in_flight, *self.ring_jobs]:
            if job is not None and not job.done():
                job.cancel()
                with contextlib.suppress(BaseException):
                    await job


async def type_place(
    vim: LlamaVim,
    filename: str,
    lines: list[str],
    y: int,
    indent: int,
    body: str,
    script: str,
    cadence_ms: float,
    settle_s: float,
) -> list[Keystroke]:
    """Type ``body`` after ``indent`` characters of line ``y``, one key per
    ``cadence_ms``, asking as llama.vim does; wait up to ``settle_s`` for the last
    answer."""
    vim.insert_mode = True
    keys: list[Keystroke] = []
    dirty: Keystroke | None = None
    x = indent
    start = time.perf_counter()

    async def flush_when_free() -> None:
        # llama.vim's 100 ms timer: re-armed while a request is in flight.
        nonlocal dirty
        while True:
            await asyncio.sleep(TIMER_S)
            if vim.in_flight is not None and not vim.in_flight.done():
                continue
            if dirty is not None:
                key, dirty = dirty, None
                vim.ask(filename, lines, y, x, key)  # x: the cursor after the last key
            return

    timer: asyncio.Task[None] | None = None
    for i, ch in enumerate(body):
        delay = start + i * cadence_ms / 1000.0 - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if keys:
            keys[-1].next_key = time.perf_counter()
        lines[y] = lines[y][:x] + ch + lines[y][x:]
        x += 1
        vim.moved()
        key = Keystroke(script, i, ch, sent=time.perf_counter())
        keys.append(key)
        if vim.in_flight is not None and not vim.in_flight.done():
            dirty = key
            if timer is None or timer.done():
                timer = asyncio.ensure_future(flush_when_free())
        else:
            dirty = None
            vim.ask(filename, lines, y, x, key)
    deadline = time.perf_counter() + settle_s
    while time.perf_counter() < deadline:
        busy = vim.in_flight is not None and not vim.in_flight.done()
        if not busy and (timer is None or timer.done()):
            break
        await asyncio.sleep(0.05)
    if timer is not None and not timer.done():
        timer.cancel()
    vim.insert_mode = False
    mark_matches(keys, body)
    return keys


async def replay(
    binary: Path,
    model: Path,
    files: Sequence[Path],
    texts: Sequence[str],
    places: Sequence[Any],
    *,
    pause_s: float,
    cadence_ms: float,
    settle_s: float,
    seed: int,
    log_dir: Path,
) -> tuple[list[Any], dict[str, Any]]:
    """The places of one round (``bench/places.plan_places``) typed with llama.vim
    against a fresh ``llama-server``; the segments as Kode's replay makes them."""
    from kode.bench import llama_server
    from kode.bench.places import Segment, blank

    buffers: dict[int, list[str]] = {}
    modified: set[int] = set()
    segments: list[Segment] = []
    mode = llama_server.Mode("llama-vim", SERVER_ARGS)
    async with llama_server.serve(binary, model, mode, log_dir=log_dir, n_ctx=8192) as server:
        vim = LlamaVim(server.url, server.client, seed)
        ring = asyncio.ensure_future(vim.ring_loop())
        try:
            previous: int | None = None
            cursor: dict[int, int] = {}
            for place in places:
                name = files[place.file].name
                if place.file not in buffers:
                    text = blank(texts[place.file], places, place.file)
                    buffers[place.file] = text.split("\n")
                lines = buffers[place.file]
                if previous is not None and previous != place.file:
                    # BufLeave of the buffer left: only an unmodified one gives a chunk.
                    vim.enter(
                        files[previous].name,
                        buffers[previous],
                        cursor[previous],
                        modified=previous in modified,
                    )
                if previous != place.file:
                    vim.enter(name, lines, place.line, modified=place.file in modified)
                previous = place.file
                cursor[place.file] = place.line
                vim.moved()  # the cursor is put on the line (normal mode), then rests
                await asyncio.sleep(pause_s)
                script = f"{place.kind}:{name}:{place.line + 1}"
                keys = await type_place(
                    vim,
                    name,
                    lines,
                    place.line,
                    place.indent,
                    place.body,
                    script,
                    cadence_ms,
                    settle_s,
                )
                modified.add(place.file)
                segments.append(Segment(place, keys))
        finally:
            ring.cancel()
            with contextlib.suppress(BaseException):
                await ring
            await vim.aclose()
    return segments, dict(vim.stats)
