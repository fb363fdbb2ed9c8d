"""The Kode language server in the test's own event loop, fed raw bytes.

``Wire`` runs ``KodeServer``'s real reading loop (``lsp.framing``) and protocol over an
in-memory byte stream, so tests can send what no well-behaved client would (bad
framing, lone surrogates, requests after shutdown) and read every byte the server
writes back; its backend is a ``fakes.completion.FailingBackend`` unless given another.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from fakes.completion import FailingBackend
from kode.lsp.server import KodeServer, build_server

STEP_S = 5.0  # the most any one exchange may take
IDLE_S = 0.05  # the server's framing.IDLE_S, shortened


def frame(message: dict[str, Any] | bytes) -> bytes:
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def request(n: int, method: str, params: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": n, "method": method, "params": params}


def notification(method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params}


def did_open(uri: str, text: str, version: int = 1) -> dict[str, Any]:
    doc = {"uri": uri, "languageId": "python", "version": version, "text": text}
    return notification("textDocument/didOpen", {"textDocument": doc})


def inline(n: int, uri: str, line: int, character: int) -> dict[str, Any]:
    return request(
        n,
        "textDocument/inlineCompletion",
        {
            "textDocument": {"uri": uri},
            "position": {"line": line, "character": character},
            "context": {"triggerKind": 2},
        },
    )


class Wire:
    """One server, one client stream. Use as ``async with Wire(backend) as wire``."""

    def __init__(self, backend: FailingBackend | None = None, *, real: bool = False) -> None:
        """``real``: the server's own backend factory (settings decide), not ``backend``."""
        self.backend = backend or FailingBackend()
        self.server: KodeServer = build_server(None if real else self.backend)
        self.server.frame_idle_s = IDLE_S
        self.inbox: asyncio.Queue[bytes] = asyncio.Queue()
        self.received: list[dict[str, Any]] = []
        self._out = bytearray()
        self._arrived = asyncio.Event()
        self._task: asyncio.Future[None] | None = None

    async def __aenter__(self) -> Wire:
        self.server.protocol.set_writer(self)
        self.server._stop_event = threading.Event()
        self._task = asyncio.ensure_future(self.server._serve(self.inbox.get))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self.inbox.put_nowait(b"")  # end of stream
        async with asyncio.timeout(STEP_S):
            await self._task
            await self.server.engine.aclose()
            await self.server.pool.aclose()

    # The server's writer.
    def write(self, data: bytes) -> None:
        self._out += data
        while True:
            head = self._out.find(b"\r\n\r\n")
            if head < 0:
                return
            length = int(self._out[:head].split(b":")[1].split(b"\r\n")[0])
            if len(self._out) < head + 4 + length:
                return
            body = bytes(self._out[head + 4 : head + 4 + length])
            del self._out[: head + 4 + length]
            self.received.append(json.loads(body))
            self._arrived.set()

    def close(self) -> None:
        return None

    def send(self, *messages: dict[str, Any] | bytes, raw: bytes = b"") -> None:
        self.inbox.put_nowait(raw + b"".join(frame(m) for m in messages))

    async def initialize(self, options: dict[str, Any] | None = None) -> dict[str, Any]:
        self.send(request(0, "initialize", {"capabilities": {}, "initializationOptions": options}))
        reply = await self.response(0)
        self.send(notification("initialized", {}))
        return reply

    async def response(self, n: int | str) -> dict[str, Any]:
        return await self._wait(lambda m: m.get("id") == n and "method" not in m)

    async def messages(self, method: str, count: int = 1) -> list[dict[str, Any]]:
        def enough() -> list[dict[str, Any]] | None:
            found = [m for m in self.received if m.get("method") == method]
            return found if len(found) >= count else None

        async with asyncio.timeout(STEP_S):
            while (found := enough()) is None:
                self._arrived.clear()
                await self._arrived.wait()
        return found

    def shown(self) -> list[str]:
        return [
            m["params"]["message"] for m in self.received if m.get("method") == "window/showMessage"
        ]

    async def _wait(self, match: Any) -> dict[str, Any]:
        async with asyncio.timeout(STEP_S):
            while True:
                for message in self.received:
                    if match(message):
                        return message
                self._arrived.clear()
                await self._arrived.wait()
