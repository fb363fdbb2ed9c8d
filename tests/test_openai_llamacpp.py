"""The OpenAI client against llama-cpp-python's own server (``python -m llama_cpp.server``).

Needs the server's extra dependencies (``llama-cpp-python[server]``: fastapi,
sse-starlette, pydantic-settings, starlette-context); skipped without them.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from fakes.serving import LocalFactory
from kode.backends.base import BackendKind, FinishReason, GenerationRequest
from kode.backends.remote.clients import OpenAIBackend
from kode.backends.router import RoutingBackend

pytestmark = pytest.mark.model

PROMPT = "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n<|fim_middle|>"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    pytest.importorskip("sse_starlette", reason="needs llama-cpp-python[server]")
    pytest.importorskip("fastapi", reason="needs llama-cpp-python[server]")
    pytest.importorskip("starlette_context", reason="needs llama-cpp-python[server]")
    pytest.importorskip("pydantic_settings", reason="needs llama-cpp-python[server]")
    from kode.backends import models

    model = models.resolve("small")
    port = free_port()
    log = tmp_path_factory.mktemp("llama") / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "llama_cpp.server", "--model", str(model),
                "--host", "127.0.0.1", "--port", str(port),
                "--n_ctx", "1024", "--n_threads", "1", "--n_threads_batch", "1",
                "--verbose", "false",
            ],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited:\n{log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/v1/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama_cpp.server did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


async def test_streams_completion_deltas(llama_server: str) -> None:
    backend = OpenAIBackend(llama_server, timeout_ms=60000, stop=["<|endoftext|>"])
    async with asyncio.timeout(60):
        generation = await backend.generate(GenerationRequest(PROMPT, 10))
        chunks = [chunk.text async for chunk in generation]
        assert await backend.health()
        await backend.aclose()
    assert "".join(chunks).strip()
    assert len(chunks) >= 2  # deltas, not one block
    stats = generation.stats
    assert stats.finish_reason in (FinishReason.LENGTH, FinishReason.END)
    assert 1 <= stats.completion_tokens <= 10
    assert stats.ttft_ms > 0


async def test_cancel_mid_stream_and_serve_again(llama_server: str) -> None:
    backend = OpenAIBackend(llama_server, timeout_ms=60000)
    async with asyncio.timeout(90):
        generation = await backend.generate(GenerationRequest(PROMPT, 300))
        seen = 0
        async for _ in generation:
            seen += 1
            if seen == 2:
                break
        await generation.cancel()
        assert generation.stats.finish_reason is FinishReason.CANCELLED
        assert generation.stats.completion_tokens < 300  # stopped, not run to its end
        again = await backend.generate(GenerationRequest(PROMPT, 4))
        assert [chunk.text async for chunk in again]
        await backend.aclose()


async def test_router_prefers_the_openai_server(llama_server: str) -> None:
    factory = LocalFactory()
    remote = OpenAIBackend(llama_server, timeout_ms=60000)
    router = RoutingBackend(factory, remote, BackendKind.AUTO, latency_budget_ms=30000)
    async with asyncio.timeout(60):
        generation = await router.generate(GenerationRequest(PROMPT, 4))
        text = "".join([chunk.text async for chunk in generation])
        await router.aclose()
    assert text
    assert generation.stats.route == "remote"
    assert factory.loads == 0
