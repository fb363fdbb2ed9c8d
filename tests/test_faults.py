"""Faulty upstreams: the client raises the right error quickly, the router falls back,
and ``kode serve`` in front of a faulty SGLang keeps serving. Nothing may hang.

The fake upstream is a raw asyncio socket server on 127.0.0.1 that picks its
behavior from the prompt text, so one server plays every fault.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fakes.serving import LocalFactory
from kode.backends.base import BackendKind, FinishReason, GenerationRequest
from kode.backends.errors import RemoteAuthError, RemoteBusyError, RemoteError, RemoteTimeout
from kode.backends.remote.clients import OpenAIBackend, SGLangBackend
from kode.backends.remote.sse import SSEDecoder
from kode.backends.router import RoutingBackend
from kode_servers import (
    FakeRequest,
    FakeUpstream,
    end_chunks,
    hang,
    send_chunk,
    send_status,
    sglang_event,
    sglang_ok,
    start_kode_serve,
    start_sse,
    wait_metrics,
)

TIMEOUT_MS = 500


async def fault_server(request: FakeRequest, writer: asyncio.StreamWriter) -> None:
    if request.path in ("/health", "/v1/models"):
        await send_status(writer, 200, {})
        return
    if request.path == "/abort_request":
        await send_status(writer, 200, {})
        return
    if request.path == "/v1/completions":
        await openai_ok(writer)
        return
    body = request.json()
    fault, rid = body["text"], body.get("rid", "")
    if fault == "ok":
        await sglang_ok(request, writer, ["a", "b", "c"])
    elif fault == "spec":
        await start_sse(writer)
        await send_chunk(writer, sglang_event("ab", rid, 4))
        finish = {"type": "stop", "matched": 151643}
        event = sglang_event("abcd", rid, 8, finish)
        await send_chunk(writer, event.replace(b'"cached_tokens": 2', b'"spec_verify_ct": 3'))
        await send_chunk(writer, b"data: [DONE]\n\n")
        await end_chunks(writer)
    elif fault == "incremental":
        await start_sse(writer)
        for n, piece in enumerate(["ab", "cd", "ef"], start=1):
            await send_chunk(writer, sglang_event(piece, rid, n))
        await send_chunk(writer, sglang_event("", rid, 3, {"type": "length", "length": 3}))
        await send_chunk(writer, b"data: [DONE]\n\n")
        await end_chunks(writer)
    elif fault == "slow":
        await start_sse(writer)
        text = ""
        for n in range(1, 200):
            text += f" w{n}"
            await send_chunk(writer, sglang_event(text, rid, n))
            await asyncio.sleep(0.05)
    elif fault == "kill":
        await start_sse(writer)
        await send_chunk(writer, sglang_event("a", rid, 1))
        await send_chunk(writer, sglang_event("ab", rid, 2))
        writer.transport.abort()
    elif fault == "hang":
        await hang(writer)
    elif fault == "hang-after-first":
        await start_sse(writer)
        await send_chunk(writer, sglang_event("a", rid, 1))
        await hang(writer)
    elif fault == "kill-early":
        await start_sse(writer)
        writer.transport.abort()
    elif fault in ("401", "429", "500", "503"):
        await send_status(writer, int(fault), {"error": {"message": f"fake {fault}"}})
    elif fault == "garbage":
        await start_sse(writer)
        await send_chunk(writer, b"\x00\xffnot an event\n\ndata: {broken json\n\n\xfe\xfe")
        await end_chunks(writer)
    elif fault == "not-http":
        writer.write(b"\x16\x03\x01 this is not HTTP at all\r\n\r\n")
        await writer.drain()
    elif fault == "cut":  # a clean end of the stream, but before the generation ended
        await start_sse(writer)
        await send_chunk(writer, sglang_event("a", rid, 1))
        await end_chunks(writer)
    elif fault == "server-abort":
        await start_sse(writer)
        finish = {"type": "abort", "message": "prompt too long"}
        await send_chunk(writer, sglang_event("", rid, 0, finish))
        await send_chunk(writer, b"data: [DONE]\n\n")
        await end_chunks(writer)


async def openai_ok(writer: asyncio.StreamWriter) -> None:
    await start_sse(writer)
    for piece in (" x", " = 1"):
        chunk = {"choices": [{"text": piece, "index": 0, "finish_reason": None}]}
        await send_chunk(writer, f"data: {json.dumps(chunk)}\n\n".encode())
    done = {"choices": [{"text": "", "index": 0, "finish_reason": "length"}]}
    usage = {
        "choices": [],
        "usage": {
            "prompt_tokens": 5,
            "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": 4},
        },
    }
    for chunk in (done, usage):
        await send_chunk(writer, f"data: {json.dumps(chunk)}\n\n".encode())
    await send_chunk(writer, b": keep-alive\n\ndata: [DONE]\n\n")
    await end_chunks(writer)


@pytest.fixture
async def fake() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream(fault_server) as server:
        yield server


def sglang(url: str, **kwargs: Any) -> SGLangBackend:
    return SGLangBackend(url, timeout_ms=TIMEOUT_MS, api_key="upstream-key", **kwargs)


async def collect(backend: SGLangBackend | OpenAIBackend, prompt: str) -> tuple[str, Any]:
    generation = await backend.generate(GenerationRequest(prompt, 16))
    text = "".join([chunk.text async for chunk in generation])
    return text, generation.stats


def aborts(fake: FakeUpstream) -> list[str]:
    return [r.json()["rid"] for r in fake.requests if r.path == "/abort_request"]


async def wait_for(condition: Any, within_s: float = 3.0) -> bool:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


# -- the client -----------------------------------------------------------------------


async def test_well_formed_streams(fake: FakeUpstream) -> None:
    backend = sglang(fake.url)
    async with asyncio.timeout(10):
        text, stats = await collect(backend, "ok")
        assert text == "abc"
        assert (stats.prompt_tokens, stats.reused_prompt_tokens, stats.completion_tokens) == (
            7,
            2,
            3,
        )
        assert stats.finish_reason is FinishReason.LENGTH
        assert stats.speculation.method == "none"

        text, stats = await collect(backend, "spec")
        assert text == "abcd"
        assert stats.finish_reason is FinishReason.END
        assert stats.speculation.method == "remote"
        assert (stats.speculation.steps, stats.speculation.accepted) == (3, 5)
        assert stats.speculation.accepted_mean == pytest.approx(8 / 3)

        text, _ = await collect(backend, "incremental")  # detected on the second chunk
        assert text == "abcdef"
        assert backend.incremental is True
        text, _ = await collect(backend, "incremental")
        assert text == "abcdef"
        await backend.aclose()

    request = fake.requests[0]
    assert request.headers["authorization"] == "Bearer upstream-key"
    body = request.json()
    assert body["stream"] is True
    assert len(body["rid"]) == 32
    assert body["sampling_params"] == {
        "max_new_tokens": 16,
        "temperature": 0.0,
        "top_p": 1.0,
        "skip_special_tokens": False,
    }
    assert aborts(fake) == []  # nothing to abort after a finished stream


async def test_openai_stream_with_usage(fake: FakeUpstream) -> None:
    backend = OpenAIBackend(fake.url, timeout_ms=TIMEOUT_MS, model="m", stop=["\n\n"])
    async with asyncio.timeout(10):
        text, stats = await collect(backend, "x")
        assert await backend.health()
        await backend.aclose()
    assert text == " x = 1"
    assert (stats.prompt_tokens, stats.completion_tokens, stats.reused_prompt_tokens) == (5, 2, 4)
    assert stats.finish_reason is FinishReason.LENGTH
    body = fake.requests[0].json()
    assert body["model"] == "m"
    assert body["stop"] == ["\n\n"]
    assert fake.requests[-1].path == "/v1/models"


async def test_injected_transport() -> None:
    """The client takes any httpx transport: here an in-memory one, no socket at all."""
    seen: list[httpx.Request] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        rid = json.loads(request.content)["rid"]
        body = sglang_event("x", rid, 1) + sglang_event("xy", rid, 2, {"type": "stop"})
        return httpx.Response(200, content=body + b"data: [DONE]\n\n")

    backend = sglang("http://sglang.invalid:30000", transport=httpx.MockTransport(handler))
    async with asyncio.timeout(5):
        text, stats = await collect(backend, "p")
        await backend.aclose()
    assert text == "xy"
    assert stats.finish_reason is FinishReason.END
    assert seen[0].url == "http://sglang.invalid:30000/generate"


@pytest.mark.parametrize(
    ("fault", "error", "message", "aborted"),
    [
        ("kill", RemoteError, "", True),
        ("hang", RemoteTimeout, "sent nothing for 500 ms", True),
        ("hang-after-first", RemoteTimeout, "sent nothing", True),
        ("401", RemoteAuthError, "HTTP 401: fake 401", False),
        ("429", RemoteBusyError, "HTTP 429", False),
        ("500", RemoteError, "HTTP 500", False),
        ("503", RemoteError, "HTTP 503", False),
        ("garbage", RemoteError, "", True),
        ("not-http", RemoteError, "", True),
        ("cut", RemoteError, "closed the stream before the generation ended", True),
        ("server-abort", RemoteError, "aborted the request: prompt too long", False),
    ],
)
async def test_faults_raise_the_right_error(
    fake: FakeUpstream, fault: str, error: type[Exception], message: str, aborted: bool
) -> None:
    backend = sglang(fake.url)
    async with asyncio.timeout(5):
        with pytest.raises(error, match=message or None) as info:
            await collect(backend, fault)
        await backend.aclose()
    if error is RemoteError:  # the fault itself, not a wait for the time-out
        assert not isinstance(info.value, RemoteAuthError | RemoteBusyError | RemoteTimeout)
    rid = fake.requests[0].json()["rid"]
    if aborted:  # the request may still run there: the abort was sent
        assert aborts(fake) == [rid]
    elif fault != "server-abort":
        assert aborts(fake) == []


async def test_unreachable_server_fails_fast() -> None:
    async with FakeUpstream(fault_server) as closed:
        url = closed.url
    backend = sglang(url)
    async with asyncio.timeout(5):
        with pytest.raises(RemoteError, match="cannot connect"):
            await collect(backend, "ok")
        assert not await backend.health(0.5)
        await backend.aclose()


async def test_cancel_closes_the_stream_and_aborts(fake: FakeUpstream) -> None:
    backend = sglang(fake.url)
    async with asyncio.timeout(10):
        generation = await backend.generate(GenerationRequest("slow", 500))
        seen = []
        async for chunk in generation:
            seen.append(chunk.text)
            if len(seen) == 2:
                break
        await generation.cancel()
        assert generation.stats.finish_reason is FinishReason.CANCELLED
        assert await wait_for(lambda: aborts(fake) == [generation.rid])
        # the stream's connection is gone: the fake's writer failed and its handler ended
        assert await wait_for(lambda: fake.open_connections == 0)
        await backend.aclose()
    assert backend.counters.aborts_sent == 1
    assert backend.counters.aborts_failed == 0


async def test_abort_failure_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    async def no_abort(request: FakeRequest, writer: asyncio.StreamWriter) -> None:
        if request.path == "/abort_request":
            await send_status(writer, 500, {"error": "no"})
        else:
            await fault_server(request, writer)

    async with FakeUpstream(no_abort) as server, asyncio.timeout(10):
        backend = sglang(server.url)
        generation = await backend.generate(GenerationRequest("slow", 500))
        async for _ in generation:
            break
        await generation.cancel()
        await backend.aclose()  # waits for the abort in flight
    assert backend.counters.aborts_failed == 1
    assert "HTTP 500" in caplog.text


# -- the router -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("kill-early", "remote failed (RemoteError"),
        ("hang", "remote timed out after 300 ms"),
        ("hang-after-first", "remote ok"),
        ("401", "remote failed (RemoteAuthError"),
        ("429", "remote failed (RemoteBusyError"),
        ("500", "remote failed (RemoteError: sglang server"),
        ("garbage", "remote failed"),
        ("not-http", "remote failed"),
    ],
)
async def test_router_falls_back_to_local(fake: FakeUpstream, fault: str, reason: str) -> None:
    factory = LocalFactory()
    # Only the hang waits out the budget; the other faults answer at once, and a budget
    # they could miss on a loaded machine (CI once took over 300 ms to get a 401) would
    # turn their "failed" into "timed out".
    budget = 300 if fault == "hang" else 3000
    router = RoutingBackend(
        factory,
        SGLangBackend(fake.url, timeout_ms=1000),
        BackendKind.AUTO,
        latency_budget_ms=budget,
    )
    error: Exception | None = None
    text = ""
    async with asyncio.timeout(5):
        generation = await router.generate(GenerationRequest(fault, 8))
        try:
            text = "".join([chunk.text async for chunk in generation])
        except RemoteError as exc:
            error = exc
        await router.aclose()
    assert generation.stats.route_reason.startswith(reason)
    if reason == "remote ok":  # the first token came in time: errors after it surface
        assert generation.stats.route == "remote"
        assert isinstance(error, RemoteTimeout)
        return
    assert text == "local text"
    assert generation.stats.route == "local"
    assert generation.stats.route_reason.endswith("fell back to local")


async def test_router_uses_a_healthy_remote(fake: FakeUpstream) -> None:
    factory = LocalFactory()
    router = RoutingBackend(factory, sglang(fake.url), BackendKind.AUTO, latency_budget_ms=2000)
    async with asyncio.timeout(5):
        generation = await router.generate(GenerationRequest("ok", 8))
        text = "".join([chunk.text async for chunk in generation])
        await router.aclose()
    assert text == "abc"
    assert generation.stats.route == "remote"
    assert factory.loads == 0


# -- kode serve in front of a faulty upstream -----------------------------------------


async def read_stream(
    client: httpx.AsyncClient, text: str, out: list[dict[str, Any]] | None = None, **extra: Any
) -> list[dict[str, Any]]:
    """The events of one streamed generation; `out`, when given, fills as they arrive."""
    body = {"text": text, "sampling_params": {"max_new_tokens": 8}, "stream": True, **extra}
    decoder = SSEDecoder()
    out = [] if out is None else out
    async with client.stream("POST", "/generate", json=body) as response:
        assert response.status_code == 200
        async for raw in response.aiter_bytes():
            out.extend({"done": True} if e.done else json.loads(e.data) for e in decoder.feed(raw))
    return out


async def test_kode_serve_keeps_serving_after_upstream_faults(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    args = ["--upstream", fake.url, "--upstream-timeout-ms", str(TIMEOUT_MS)]
    server = await asyncio.to_thread(start_kode_serve, args, tmp_path)
    try:
        async with (
            asyncio.timeout(60),
            httpx.AsyncClient(base_url=server.url, timeout=10) as client,
        ):
            for fault in ("kill", "hang", "401", "429", "500", "garbage", "not-http", "cut"):
                events = await read_stream(client, fault)
                assert events[-1] == {"done": True}, fault
                assert "error" in events[-2], (fault, events)
                assert (await client.get("/health")).status_code == 200
                ok = await read_stream(client, "ok")
                assert ok[-2]["text"] == "abc"
                assert ok[-2]["meta_info"]["finish_reason"]["type"] == "length"

            # a client that goes away: its upstream request is aborted too
            before = len(aborts(fake))
            body = {"text": "slow", "sampling_params": {"max_new_tokens": 100}, "stream": True}
            async with client.stream("POST", "/generate", json=body) as response:
                async for _ in response.aiter_bytes():
                    break
            assert await wait_for(lambda: len(aborts(fake)) == before + 1, within_s=5)

            # latest wins: a newer request for the document aborts the older one upstream
            def generated() -> int:
                return sum(r.path == "/generate" for r in fake.requests)

            started = generated()
            seen: list[dict[str, Any]] = []
            first = asyncio.create_task(
                read_stream(client, "slow", out=seen, document="file:///a.py")
            )
            assert await wait_for(lambda: generated() == started + 1)
            # streaming to its client: the server holds it as the document's generation
            assert await wait_for(lambda: len(seen) > 0)
            second = await read_stream(client, "ok", document="file:///a.py")
            older = await first
            assert second[-2]["text"] == "abc"
            assert older[-2]["meta_info"]["finish_reason"]["type"] == "abort"
            assert await wait_for(lambda: len(aborts(fake)) == before + 2, within_s=5)

            samples = await wait_metrics(
                client,
                lambda s: s["kode_jobs_in_flight"] == 0 and s["kode_generations_active"] == 0,
            )
            assert samples["kode_jobs_in_flight"] == 0
            assert samples["kode_generations_active"] == 0
            assert samples['kode_generations_aborted_total{cause="superseded"}'] == 1
            assert samples['kode_generations_aborted_total{cause="disconnect"}'] == 1
            assert samples['kode_generations_finished_total{reason="error"}'] == 8
    finally:
        server.stop()
    assert server.proc.returncode in (0, -15)  # uvicorn re-raises SIGTERM after shutting down
    log = server.log_text()
    assert "shut down" in log
    assert "Traceback" not in log
