"""The llama.vim peer of the places replay (``bench/llama_vim.py``): what it sends, its
answer cache, what it draws, its ring of chunks, and its one-request-at-a-time typing."""

from __future__ import annotations

import asyncio
import json
import random

import httpx
from fakes.timing import until
from kode.bench import llama_vim
from kode.bench.llama_vim import Ask, LlamaVim, Ring, ask_at, from_cache, rendered


def test_ask_sends_256_lines_before_the_line_and_64_after() -> None:
    lines = [f"line{i}" for i in range(1000)]
    lines[500] = "    x = fo"
    ask = ask_at(lines, 500, 10)
    assert ask.prefix == "\n".join(lines[244:500]) + "\n"
    assert ask.middle == "    x = fo"
    assert ask.suffix == "\n" + "\n".join(lines[501:565]) + "\n"


def test_a_blank_line_is_asked_from_its_start() -> None:
    ask = ask_at(["a", "    ", "b"], 1, 4)
    assert (ask.middle, ask.suffix) == ("", "\nb\n")


def test_the_cache_answers_typing_into_an_earlier_answer() -> None:
    cache: dict[str, str] = {}
    earlier = Ask("p\n", "    x = ", "\n")
    cache[earlier.key] = "foo(1)"
    assert from_cache(cache, Ask("p\n", "    x = f", "\n")) == "oo(1)"
    assert from_cache(cache, Ask("p\n", "    x = fo", "\n")) == "o(1)"
    # Typed something else: no answer from the cache.
    assert from_cache({earlier.key: "foo(1)"}, Ask("p\n", "    x = b", "\n")) is None
    # More than 10 characters on: not looked for.
    assert (
        from_cache({earlier.key: "foo(1) + bar(22)"}, Ask("p\n", "    x = foo(1) + ba", "\n"))
        is None
    )


def test_what_is_drawn() -> None:
    lines = ["    x = ", "    y = 2"]
    assert rendered("foo\n\n", lines, 0, 8) == "foo"
    assert rendered("\n\n", lines, 0, 8) == ""
    # A repeat of the next line is not drawn.
    assert rendered("2", ["    y = ", "    y = 2"], 0, 8) == ""


def test_the_ring_takes_one_queued_chunk_per_step_and_keeps_16() -> None:
    ring = Ring(random.Random(0))
    for i in range(20):
        ring.pick("f.py", [f"chunk {i} line {j}" for j in range(10)], evict=True)
    assert len(ring.queued) == 16  # the oldest queued dropped
    steps = 0
    while ring.step():
        steps += 1
    assert steps == 16 and len(ring.chunks) == 16
    assert ring.extra()[0]["text"].startswith("chunk 4 line 0")
    # A chunk already held is not queued again.
    ring.pick("f.py", [f"chunk 19 line {j}" for j in range(10)], evict=True)
    assert ring.queued == []


def test_one_request_at_a_time_then_the_latest_text() -> None:
    """Keys typed while a request is in flight send nothing; when it is answered, the
    100 ms timer asks for the line as it is then."""
    asked: list[str] = []
    release = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        asked.append(body["prompt"])
        if len(asked) == 1:
            await release.wait()
        return httpx.Response(200, json={"content": "" if len(asked) == 1 else "rest"})

    async def main() -> list[llama_vim.Keystroke]:
        client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        vim = LlamaVim("http://peer", client, seed=0)
        lines = ["def f():", "    ", "    return 1"]

        async def answer_later() -> None:
            await until(lambda: lines[1] == "    abc")  # b and c typed while it is in flight
            release.set()

        opener = asyncio.ensure_future(answer_later())
        keys = await llama_vim.type_place(vim, "f.py", lines, 1, 4, "abc", "s", 30.0, 5.0)
        await opener
        await vim.aclose()
        await client.aclose()
        return keys

    keys = asyncio.run(main())
    # The first key asked; b and c came while it was in flight; then one ask for "abc".
    assert asked == ["    a", "    abc"]
    assert keys[0].outcome == "stale"  # typed on before its answer came
    assert keys[1].outcome == "pending"  # never asked
    assert keys[2].outcome == "shown" and keys[2].suggestion == "rest"
