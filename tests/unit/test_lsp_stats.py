"""`kode/stats` `lastCompletion`: what the status bars show is the last answer the user
got, not the backend's last generation (found in the real VS Code: after an answer of
13 s, the status bar said `176 ms · 10000 tok/s`, the numbers of a one-token background
preparation). The server runs in this event loop (``lsp_wire.Wire``) with a scripted
backend. No model."""

from __future__ import annotations

from typing import Any

from fakes.completion import LatencyTimedBackend
from lsp_wire import Wire, did_open, inline, request

QUIET = {"readAhead": False, "prefetch": False}
URI = "file:///project/circle.py"


async def last_completion(wire: Wire, n: int) -> Any:
    wire.send(request(n, "kode/stats"))
    return (await wire.response(n))["result"]["lastCompletion"]


async def test_the_last_answer_and_its_decode_speed_after_the_first_token() -> None:
    backend = LatencyTimedBackend(chunks=["radius", " *", " radius"] + [" "] * 8)
    async with Wire(backend) as wire:
        await wire.initialize(QUIET)
        assert await last_completion(wire, 1) is None
        wire.send(
            did_open(URI, "def area(radius):\n    return math.pi * \n"), inline(2, URI, 1, 21)
        )
        assert (await wire.response(2))["result"]["items"]
        last = await last_completion(wire, 3)
        assert last["completionTokens"] == 11 and last["ttftMs"] == 100.0
        assert last["generationMs"] == 1100.0 and last["answerMs"] > 0
        assert last["tokensPerS"] == 10.0  # 10 tokens after the first, in 1000 ms
        assert last["fromCache"] is False
        # A one-token answer has no decode time to speak of: no speed, not 10000 tok/s.
        backend.chunks, backend.ttft_ms, backend.total_ms = ["radius"], 175.9, 176.0
        wire.send(
            did_open("file:///project/b.py", "x = \n"), inline(4, "file:///project/b.py", 0, 4)
        )
        assert (await wire.response(4))["result"]["items"]
        last = await last_completion(wire, 5)
        assert last["completionTokens"] == 1 and last["tokensPerS"] is None
        # An empty answer is not a completion the user saw: the last one stays.
        backend.chunks = []
        wire.send(
            did_open("file:///project/c.py", "y = \n"), inline(6, "file:///project/c.py", 0, 4)
        )
        assert (await wire.response(6))["result"]["items"] == []
        assert (await last_completion(wire, 7))["generationMs"] == 176.0
