"""Issue #14: nothing a client, a setting or a document does breaks the language server,
and the user is told once. Each numbered item of the issue has its regression test
here (item 4, the model cache, is in tests/unit/test_models.py); the server runs in
this event loop behind its real reading loop (``lsp_wire.Wire``), with a scripted
backend. One test drives the real ``kode lsp`` process over stdio. No model."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import threading
from typing import Any

import pytest
from fakes.completion import FailingBackend
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kode.backends.errors import ContextOverflow, RemoteError
from lsp_wire import (
    IDLE_S,
    Wire,
    did_open,
    frame,
    inline,
    notification,
    request,
)

QUIET = {"readAhead": False, "prefetch": False}
SECRET = "TOP_SECRET_CODE = 42"  # source that must never reach a log
URI = "file:///project/pkg/main.py"


def items(reply: dict[str, Any]) -> list[str]:
    assert "result" in reply, reply
    return [item["insertText"] for item in reply["result"]["items"]]


# Item 1: a lone surrogate in one document (or a URI) broke completions everywhere.


async def test_a_lone_surrogate_breaks_nothing_and_logs_no_code(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    backend = FailingBackend()
    async with Wire(backend) as wire:
        await wire.initialize(QUIET)
        bad = "file:///project/pkg/bad.py"
        odd = "file:///project/pkg/odd\ud800.py"
        wire.send(
            did_open(bad, f"{SECRET}\nname = '\ud800'\n"),
            did_open(odd, "x = 1\n"),
            did_open(URI, "import os\nvalue = "),
            inline(1, URI, 1, 8),
            inline(2, bad, 1, 9),
            inline(3, odd, 0, 4),
        )
        for n in (1, 2, 3):
            assert items(await wire.response(n)) == [" = 1"]
        assert len(backend.prompts) == 3
        assert "\ufffd" in backend.prompts[0]  # the bad document, pulled in as context
        doc = wire.server.engine.documents.get(bad)
        assert doc.line(1) == "name = '\ufffd'"  # same UTF-16 length: positions hold
        assert not wire.shown()
    assert SECRET not in caplog.text


async def test_an_unexpected_backend_error_is_named_without_its_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    error = UnicodeEncodeError("utf-8", f"<|repo_name|>{SECRET}", 3, 4, "surrogates")
    async with Wire(FailingBackend(error=error)) as wire:
        await wire.initialize(QUIET)
        wire.send(did_open(URI, SECRET + "\n"), inline(1, URI, 1, 0))
        reply = await wire.response(1)
    assert reply["error"]["code"] == -32803
    assert "UnicodeEncodeError" in reply["error"]["message"]
    assert SECRET not in json.dumps(wire.received)
    assert SECRET not in caplog.text


@pytest.mark.parametrize("log_prompts", [False, True])
async def test_pygls_logs_no_code_unless_log_prompts(
    caplog: pytest.LogCaptureFixture, log_prompts: bool
) -> None:
    caplog.set_level(logging.DEBUG)
    async with Wire(FailingBackend(chunks=[" " + SECRET])) as wire:
        await wire.initialize({**QUIET, "logPrompts": log_prompts})
        wire.send(did_open(URI, "x\n"), inline(1, URI, 1, 0))
        assert items(await wire.response(1)) == [" " + SECRET]
        wire.send(notification("textDocument/didOpen", {"textDocument": {"text": SECRET}}))
        wire.send(request(2, "kode/stats"))
        await wire.response(2)
    assert (SECRET in caplog.text) is log_prompts
    assert "Sending data" in caplog.text


def test_a_failed_run_does_not_put_the_prompt_into_its_error() -> None:
    from kode.backends.base import GenerationRequest
    from kode.backends.errors import BackendError
    from kode.backends.worker import Live, Steps, WorkerJob

    class Boom:
        def steps(self) -> Steps:
            SECRET.encode("ascii", errors="strict")
            "\ud800".encode()
            yield None

        def account(self) -> None:
            return None

    async def main() -> list[Any]:
        job = WorkerJob(GenerationRequest(prompt=SECRET, max_tokens=1), asyncio.get_running_loop())
        live = Live(job, Boom())
        live.advance()
        assert live.ended
        live.close()
        await asyncio.sleep(0)
        return [job.queue.get_nowait() for _ in range(job.queue.qsize())]

    first, end = asyncio.run(main())
    assert isinstance(first, BackendError)
    assert "UnicodeEncodeError" in str(first)
    assert SECRET not in str(first) and "ud800" not in str(first)
    assert end is None


# Item 2: settings with no bound (threads: 100000) killed the server.


async def test_threads_beyond_the_cores_are_refused_with_a_message() -> None:
    async with Wire() as wire:
        await wire.initialize({**QUIET, "threads": 100000})
        await wire.messages("window/showMessage")
        assert wire.server.engine.settings.threads == 0
        assert "threads: 100000 is more than the" in wire.shown()[0]


# Item 3: any framing error left the server deaf for good.


async def test_bad_framing_then_the_server_still_answers() -> None:
    async with Wire() as wire:
        await wire.initialize(QUIET)
        good = frame(request(1, "kode/stats"))
        body = json.dumps(request(2, "kode/stats", {"t": "café"}), ensure_ascii=False).encode()
        wire.send(
            raw=b"Content-Length: 99999999999\r\n\r\n{}"
            + b"Content-Length: abc\r\n\r\n"
            + good
            + b"Content-Length: %d\r\n\r\n" % len(body.decode())  # characters, not bytes
            + body
            + b"Content-Length: 10\r\n\r\n"  # too short
            + frame(request(3, "kode/stats"))[:-1]
        )
        await wire.response(1)
        await wire.response(2)
        wire.send(request(4, "kode/stats"))
        await wire.response(3)
        await wire.response(4)


async def test_malformed_json_with_an_id_is_answered_minus_32700() -> None:
    async with Wire() as wire:
        await wire.initialize(QUIET)
        wire.send(b'{"jsonrpc": "2.0", "id": 9, "method": "kode/stats", "params": {,}')
        reply = await wire.response(9)
        assert reply["error"]["code"] == -32700
        wire.send(request(10, "kode/stats"))
        assert "result" in await wire.response(10)
        wire.send({"id": 11, "method": "kode/stats"})  # no "jsonrpc": "2.0"
        assert (await wire.response(11))["error"]["code"] == -32600
        wire.send({"jsonrpc": "2.0", "id": 12, "method": "kode/stats"})  # no params: allowed
        assert "result" in await wire.response(12)


def test_the_real_stdio_server_resynchronises() -> None:
    """``kode lsp`` itself: a bad frame, then a good request, over a real pipe."""
    init = request(
        0, "initialize", {"capabilities": {}, "initializationOptions": {"enabled": False}}
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "kode.cli.main", "lsp"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    watchdog = threading.Timer(60, proc.kill)  # whatever happens, the process ends
    watchdog.start()
    assert proc.stdin is not None and proc.stdout is not None
    try:

        def send(data: bytes) -> None:
            assert proc.stdin is not None
            proc.stdin.write(data)
            proc.stdin.flush()

        send(frame(init))
        assert _read_frame(proc.stdout)["id"] == 0
        # Too short, and nothing after it: taken whole once the client is quiet.
        send(b"Content-Length: 12\r\n\r\n" + json.dumps(request(1, "kode/stats")).encode())
        assert "result" in _read_frame(proc.stdout)
        send(frame(request(2, "shutdown")))
        assert _read_frame(proc.stdout)["id"] == 2
        send(frame(notification("exit", None)))
        proc.stdin.close()
        assert proc.wait(30) == 0
        assert proc.stderr is not None
        assert b"LSP framing" in proc.stderr.read()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def _read_frame(stream: Any) -> dict[str, Any]:
    length = None
    while (line := stream.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    assert length is not None, "the server closed its output"
    message: dict[str, Any] = json.loads(stream.read(length))
    return message


# Item 5 and issue #11: errors during generation reach the editor, once.


@pytest.mark.parametrize("fail_after", [0, 2], ids=["before-any-token", "mid-stream"])
async def test_a_generation_error_is_told_once(fail_after: int) -> None:
    error = RemoteError("could not connect to http://10.9.9.9:30000")
    backend = FailingBackend(chunks=["a", "b", "c", "d"], error=error, fail_after=fail_after)
    async with Wire(backend) as wire:
        await wire.initialize(QUIET)
        wire.send(did_open(URI, "x"), inline(1, URI, 0, 1))
        first = await wire.response(1)
        assert first["error"]["code"] == -32803
        assert "could not connect" in first["error"]["message"]
        await wire.messages("window/showMessage")
        for n in (2, 3):  # every keystroke fails the same way: told already
            wire.send(inline(n, URI, 0, 1))
            assert items(await wire.response(n)) == []
        assert len(wire.shown()) == 1
        assert "could not connect" in wire.shown()[0]

        backend.error = ContextOverflow("prompt (600 tokens) + max_tokens exceeds 512")
        wire.send(inline(4, URI, 0, 1))  # a different failure is news
        assert (await wire.response(4))["error"]["code"] == -32803
        await wire.messages("window/showMessage", 2)

        backend.error = None
        wire.send(inline(5, URI, 0, 1))
        assert items(await wire.response(5)) == ["abcd"]
        backend.error = error  # failing again after working: told again
        other = "file:///project/pkg/other.py"  # (URI's answer is cached now)
        wire.send(did_open(other, "y"), inline(6, other, 0, 1))
        assert "error" in await wire.response(6)
        await wire.messages("window/showMessage", 3)


async def test_an_unreachable_remote_server_is_told_once() -> None:
    """The issue's probe: ``backend: "remote"`` with a server that cannot be reached
    answered silent empty lists. Port 9 (discard) on loopback refuses connections."""
    remote = {"url": "http://127.0.0.1:9", "timeoutMs": 2000}
    async with Wire(real=True) as wire:
        await wire.initialize({**QUIET, "backend": "remote", "remote": remote})
        wire.send(did_open(URI, "x = "), inline(1, URI, 0, 4))
        first = await wire.response(1)
        assert first["error"]["code"] == -32803, first
        await wire.messages("window/showMessage")
        assert "127.0.0.1:9" in wire.shown()[0]
        wire.send(inline(3, URI, 0, 4))
        assert items(await wire.response(3)) == []
        assert len(wire.shown()) == 1


async def test_context_that_cannot_fit_max_tokens_is_reported_at_once() -> None:
    backend = FailingBackend()
    async with Wire(backend) as wire:
        await wire.initialize({**QUIET, "contextSize": 512, "maxTokens": 2048})
        await wire.messages("window/showMessage")
        assert "maxTokens: 2048" in wire.shown()[0]
        wire.send(did_open(URI, "word " * 5000), inline(1, URI, 0, 5))
        assert items(await wire.response(1)) == [" = 1"]
        # The prompt was fitted into the window: 512 minus max_tokens minus overhead.
        assert backend.count_tokens(backend.prompts[0]) < 512 - 128


# Smaller items.


async def test_stats_do_not_show_the_remote_api_key() -> None:
    async with Wire() as wire:
        key = "sk-very-secret-key-123456"
        await wire.initialize({**QUIET, "remote": {"apiKey": key}})
        wire.send(request(1, "kode/stats"))
        reply = await wire.response(1)
        assert reply["result"]["settings"]["remote"]["apiKey"] == "(set)"
        assert key not in json.dumps(wire.received)


async def test_a_request_after_shutdown_is_invalid_request() -> None:
    async with Wire() as wire:
        await wire.initialize(QUIET)
        wire.send(request(1, "shutdown"))
        await wire.response(1)
        wire.send(request(2, "kode/stats"))
        assert (await wire.response(2))["error"]["code"] == -32600


async def test_a_negative_character_in_did_change_is_clamped_not_dropped() -> None:
    async with Wire() as wire:
        await wire.initialize(QUIET)
        change = {
            "textDocument": {"uri": URI, "version": 2},
            "contentChanges": [
                {
                    "range": {
                        "start": {"line": 0, "character": -1},
                        "end": {"line": 0, "character": 1},
                    },
                    "text": "Z",
                }
            ],
        }
        wire.send(did_open(URI, "abc"), notification("textDocument/didChange", change))
        wire.send(request(1, "kode/stats"))
        await wire.response(1)
        doc = wire.server.engine.documents.get(URI)
        assert (doc.text, doc.version) == ("Zbc", 2)


async def test_an_edit_that_cannot_be_read_is_told_not_dropped() -> None:
    async with Wire() as wire:
        await wire.initialize(QUIET)
        change = {
            "textDocument": {"uri": URI, "version": 2},
            "contentChanges": [{"range": {"start": "nowhere"}, "text": "Z"}],
        }
        wire.send(did_open(URI, "abc"), notification("textDocument/didChange", change))
        await wire.messages("window/showMessage")
        assert "could not be read" in wire.shown()[0]
        wire.send(inline(1, URI, 0, 1))  # no completion from text the editor no longer has
        assert (await wire.response(1))["error"]["code"] == -32602


# The fuzz test the issue asks for: random frames into the real reading loop and
# protocol; the server must answer a good request after every one of them.

_garbage = st.one_of(
    st.binary(max_size=60),
    st.builds(
        lambda n, body: b"Content-Length: %d\r\n\r\n" % n + body,
        st.integers(0, 200),
        st.binary(max_size=80),
    ),
    st.builds(
        lambda text: frame(did_open(URI, text)),
        st.text(alphabet=st.characters(codec=None), max_size=40),
    ),
    st.builds(
        lambda line, char, text: frame(
            notification(
                "textDocument/didChange",
                {
                    "textDocument": {"uri": URI, "version": 3},
                    "contentChanges": [
                        {
                            "range": {
                                "start": {"line": line, "character": char},
                                "end": {"line": line, "character": char + 1},
                            },
                            "text": text,
                        }
                    ],
                },
            )
        ),
        st.integers(-3, 5),
        st.integers(-3, 9),
        st.text(max_size=8),
    ),
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_garbage, max_size=5))
def test_fuzz_the_server_keeps_answering(garbage: list[bytes]) -> None:
    async def main() -> None:
        async with Wire() as wire:
            await wire.initialize(QUIET)
            wire.send(did_open(URI, "x = \n"), raw=b"".join(garbage))
            await asyncio.sleep(2 * IDLE_S)  # a quiet moment: whatever was cut is resolved
            wire.send(inline(77, URI, 0, 0), request(78, "kode/stats"))
            reply = await wire.response(77)
            assert "result" in reply or reply["error"]["code"] == -32602, reply
            assert "result" in await wire.response(78)

    asyncio.run(main())
