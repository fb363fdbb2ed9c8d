"""Test helpers for the remote backends and ``kode serve``.

- ``start_kode_serve``: the real ``kode serve`` as a subprocess on a free loopback port;
- ``FakeUpstream``: a tiny HTTP/1.1 server on loopback (raw asyncio sockets) whose
  answers a test scripts byte by byte: streams that die, hang, or send garbage.

The in-memory backends for routing tests are in ``fakes.serving``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kode.backends.base import GenerationRequest
from kode.serve.metrics import parse_text

REPO = Path(__file__).resolve().parents[1]


# -- kode serve as a subprocess -------------------------------------------------------


@dataclass
class ServeProcess:
    proc: subprocess.Popen[str]
    url: str
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def run_kode(args: Sequence[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """``kode ARGS`` to completion (for commands that exit)."""
    return subprocess.run(
        [sys.executable, "-m", "kode.cli.main", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_kode_serve(args: Sequence[str], log_dir: Path, *, timeout: float = 90.0) -> ServeProcess:
    """``kode serve --host 127.0.0.1 --port 0 ARGS``, once it listens; its log goes to a
    new file in ``log_dir`` (a pytest temporary folder, so that no run leaves it behind)."""
    log = Path(tempfile.mkstemp(prefix="kode-serve-", suffix=".log", dir=log_dir)[1])
    with log.open("w") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kode.cli.main",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                *args,
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        line = proc.stdout.readline()
        if not line:
            break
        match = re.search(r"listening on (http://\S+)", line)
        if match:
            return ServeProcess(proc, match.group(1), log)
    server = ServeProcess(proc, "", log)
    server.stop()
    raise RuntimeError(f"kode serve did not start:\n{server.log_text()[-3000:]}")


def write_keys(directory: Path, keys: dict[str, str]) -> Path:
    path = directory / "keys.txt"
    path.write_text(
        "# kode serve keys\n\n" + "".join(f"{name}:{key}\n" for name, key in keys.items())
    )
    return path


async def metrics(client: Any) -> dict[str, float]:
    """The server's /metrics samples (``client`` is an ``httpx.AsyncClient`` on it)."""
    response = await client.get("/metrics")
    assert response.status_code == 200
    return parse_text(response.text)


async def wait_metrics(
    client: Any, ready: Callable[[dict[str, float]], bool], within_s: float = 10.0
) -> dict[str, float]:
    """Poll /metrics until ``ready(samples)``; the last samples either way."""
    deadline = time.monotonic() + within_s
    while True:
        samples = await metrics(client)
        if ready(samples) or time.monotonic() > deadline:
            return samples
        await asyncio.sleep(0.05)


# -- a scriptable HTTP server ---------------------------------------------------------


@dataclass
class FakeRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body or b"null")


Handler = Callable[[FakeRequest, asyncio.StreamWriter], Awaitable[None]]


class FakeUpstream:
    """HTTP/1.1 on 127.0.0.1, one request per connection, answered by ``handler``."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[FakeRequest] = []
        self.url = ""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.open_connections = 0

    async def __aenter__(self) -> FakeUpstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()  # handlers see their connection gone and end
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=2)
        for task in list(self._tasks):
            task.cancel()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.open_connections += 1
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            request = FakeRequest(method, path, headers, body)
            self.requests.append(request)
            await self.handler(request, writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.open_connections -= 1
            self._tasks.discard(task)
            self._writers.discard(writer)
            writer.close()


async def hang(writer: asyncio.StreamWriter, seconds: float = 60.0) -> None:
    """Answer nothing more until ``seconds`` pass or the connection goes."""
    deadline = time.monotonic() + seconds
    while not writer.transport.is_closing() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


async def generate_text(backend: Any, prompt: str, max_tokens: int = 8) -> str:
    """Generate with ``backend`` and return the whole text (errors propagate)."""
    generation = await backend.generate(GenerationRequest(prompt, max_tokens))
    return "".join([chunk.text async for chunk in generation])


async def send_status(writer: asyncio.StreamWriter, status: int, body: Any) -> None:
    data = json.dumps(body).encode()
    writer.write(
        f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
        + data
    )
    await writer.drain()


async def start_sse(writer: asyncio.StreamWriter) -> None:
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    await writer.drain()


async def send_chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    await writer.drain()


async def end_chunks(writer: asyncio.StreamWriter) -> None:
    writer.write(b"0\r\n\r\n")
    await writer.drain()


def sglang_event(text: str, rid: str, n: int, finish: dict[str, Any] | None = None) -> bytes:
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": 7,
        "completion_tokens": n,
        "cached_tokens": 2,
    }
    return (
        b"data: "
        + json.dumps({"text": text, "output_ids": [n], "meta_info": meta}).encode()
        + b"\n\n"
    )


async def sglang_ok(
    request: FakeRequest, writer: asyncio.StreamWriter, words: Sequence[str]
) -> None:
    """A well-behaved SGLang stream: cumulative text, then a finish event and [DONE]."""
    rid = request.json()["rid"]
    await start_sse(writer)
    text = ""
    for n, word in enumerate(words, start=1):
        text += word
        await send_chunk(writer, sglang_event(text, rid, n))
    await send_chunk(writer, sglang_event(text, rid, len(words), {"type": "length", "length": 3}))
    await send_chunk(writer, b"data: [DONE]\n\n")
    await end_chunks(writer)
