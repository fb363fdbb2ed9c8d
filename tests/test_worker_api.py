"""What SGLang's router asks of a worker (``serve/worker_api.py``), in process: no model.

The same endpoints against the real router: tests/test_router_e2e.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx
from fakes.serving import BrokenLocal, FakeLocal, GatedEndLocal
from kode.backends.base import GenerationRequest
from kode.backends.remote.clients import SGLangBackend
from kode.serve.app import ServeConfig, build_app
from kode.serve.auth import KeyRing
from kode.serve.service import CompletionService, Workers
from kode_servers import (
    FakeRequest,
    FakeUpstream,
    hang,
    send_chunk,
    send_status,
    sglang_event,
)


def worker_client(
    backend: FakeLocal, name: str = "w0", keys: KeyRing | None = None
) -> tuple[CompletionService, Any]:
    service = CompletionService(Workers([backend], serial=True), max_per_key=4)
    app = build_app(service, ServeConfig(keys=keys, name=name, context_tokens=2048))
    transport = httpx.ASGITransport(app=app)
    return service, httpx.AsyncClient(transport=transport, base_url="http://worker")


async def test_server_and_model_info_as_sglang_answers_them() -> None:
    service, client = worker_client(FakeLocal())
    try:
        async with client:
            for path in ("/server_info", "/get_server_info"):
                reply = await client.get(path)
                assert reply.status_code == 200
                assert reply.headers["x-kode-worker"] == "w0"
                info = reply.json()
                assert info["model_path"] == "fake-local-model"
                assert info["dp_size"] == 1
                assert info["max_running_requests"] == 1  # one local context
                assert info["max_total_num_tokens"] == 2048
                assert info["kode_worker"] == "w0"
            for path in ("/model_info", "/get_model_info"):
                reply = await client.get(path)
                assert reply.json()["model_path"] == "fake-local-model"
                assert reply.json()["is_generation"] is True
            assert (await client.get("/health")).headers["x-kode-worker"] == "w0"
    finally:
        await service.aclose()


async def test_load_counts_running_and_waiting_jobs() -> None:
    backend = GatedEndLocal()
    service, client = worker_client(backend)
    try:
        async with client, asyncio.timeout(10):
            assert (await client.get("/get_load")).json() == [
                {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}
            ]
            first = service.start("alice", GenerationRequest("p", 8))
            service.start("bob", GenerationRequest("q", 8))
            async with contextlib.aclosing(first.stream()) as events:
                async for event in events:
                    if event is not None:
                        break  # the first runs (and yielded its text); the second waits
            (load,) = (await client.get("/get_load")).json()
            assert (load["num_reqs"], load["num_waiting_reqs"]) == (2, 1)
            assert load["num_tokens"] == 2  # the running one's two tokens (prompt: 0 here)
            backend.gate.set()
    finally:
        await service.aclose()


async def test_an_aborted_generation_counts_the_tokens_it_made() -> None:
    backend = GatedEndLocal()
    service, client = worker_client(backend)
    try:
        async with client, asyncio.timeout(10):
            job = service.start("alice", GenerationRequest("p", 8), document="file:///a.py")
            async with contextlib.aclosing(job.stream()) as events:
                async for event in events:
                    if event is not None:
                        break
            service.start("alice", GenerationRequest("p2", 8), document="file:///a.py")
            assert job.task is not None
            await asyncio.wait([job.task])
            await asyncio.sleep(0)  # its done callback settles it
            metrics = service.metrics
            assert metrics.aborted.get("superseded") == 1
            assert metrics.aborted_tokens.get() == 2
            backend.gate.set()
    finally:
        await service.aclose()


async def test_generate_names_the_engine_in_meta_info() -> None:
    service, client = worker_client(FakeLocal(chunks=["x"]))
    try:
        async with client, asyncio.timeout(10):
            reply = await client.post("/generate", json={"text": "p", "stream": False})
            assert reply.status_code == 200
            assert reply.headers["x-kode-worker"] == "w0"
            assert reply.json()["meta_info"]["kode_worker"] == "w0"
    finally:
        await service.aclose()


async def test_health_generate_makes_a_token_or_says_why_not() -> None:
    backend = FakeLocal(chunks=["x"])
    service, client = worker_client(backend)
    try:
        async with client, asyncio.timeout(10):
            reply = await client.get("/health_generate")
            assert reply.status_code == 200
            assert backend.requests[0].max_tokens == 1
            assert service.metrics.finished.get("stop") == 1  # ended, not aborted
            assert not service.metrics.aborted.values
    finally:
        await service.aclose()
    service, client = worker_client(BrokenLocal())
    try:
        async with client, asyncio.timeout(10):
            reply = await client.get("/health_generate")
            assert reply.status_code == 503
            assert "the engine is gone" in reply.json()["error"]
    finally:
        await service.aclose()


async def test_with_keys_only_health_generate_takes_one() -> None:
    """It spends the engine's time; what the router reads at registration does not."""
    backend = FakeLocal(chunks=["x"])
    keys = KeyRing.parse("alice:alice-key-0123456789abcdef\n")
    service, client = worker_client(backend, keys=keys)
    try:
        async with client, asyncio.timeout(10):
            assert (await client.get("/health_generate")).status_code == 401
            assert backend.requests == []
            for path in ("/server_info", "/model_info", "/get_load", "/health"):
                assert (await client.get(path)).status_code == 200, path
            key = {"Authorization": "Bearer alice-key-0123456789abcdef"}
            assert (await client.get("/health_generate", headers=key)).status_code == 200
    finally:
        await service.aclose()


async def router_like(request: FakeRequest, writer: asyncio.StreamWriter) -> None:
    """A router: streams /generate (naming its worker), has no /abort_request."""
    if request.path == "/abort_request":
        await send_status(writer, 404, {})
        return
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Kode-Worker: worker-7\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    await send_chunk(writer, sglang_event("a", request.json()["rid"], 1))
    await hang(writer)  # until the client closes the stream


async def test_an_upstream_without_abort_request_is_aborted_by_closing() -> None:
    async with FakeUpstream(router_like) as fake, asyncio.timeout(10):
        backend = SGLangBackend(fake.url, timeout_ms=5000)
        try:
            for _ in range(3):
                generation = await backend.generate(GenerationRequest("p", 8))
                async with contextlib.aclosing(aiter(generation)) as chunks:
                    assert (await anext(chunks)).text == "a"
                assert generation.stats.worker == "worker-7"
                await generation.cancel()
                while not backend.counters.aborts_failed:
                    await asyncio.sleep(0.01)  # until the first abort's 404 came back
            assert backend.counters.aborts_sent == backend.counters.aborts_failed == 1
            assert not backend.sends_aborts
        finally:
            await backend.aclose()
        assert [r.path for r in fake.requests].count("/abort_request") == 1
        assert [r.path for r in fake.requests].count("/generate") == 3
