"""A real ``kode lsp`` process driven over its stdio pipes, as an editor runs it, by a
small synchronous client: every wait is bounded, and ``end`` leaves nothing running.

Raw JSON-RPC rather than pygls' client: the tests time ``exit`` to the process's end,
read every notification (``window/showMessage``), and answer the server's own requests
(``client/registerCapability``) without an event loop of their own.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from engine_windows import REPO, alive


class StdioWindow:
    """One ``kode lsp`` over pipes. Use as ``with StdioWindow(...) as window``."""

    def __init__(self, log: Path, argv: list[str] | None = None) -> None:
        """``argv``: the command (``kode lsp`` unless given), its stderr to ``log``."""
        self.log = log
        with log.open("wb") as err:
            self.proc = subprocess.Popen(
                argv or [sys.executable, "-m", "kode.cli.main", "lsp"],
                cwd=REPO,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        self.shown: list[str] = []
        self.partials: queue.Queue[dict[str, Any]] = queue.Queue()
        self._responses: dict[Any, dict[str, Any]] = {}
        self._arrived = threading.Condition()
        self._ids = itertools.count(1)
        self._write = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def __enter__(self) -> StdioWindow:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    # -- the wire ------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        assert self.proc.stdin is not None
        with self._write:
            self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
            self.proc.stdin.flush()

    def _read(self) -> None:
        stream = self.proc.stdout
        assert stream is not None
        while True:
            length = None
            while (line := stream.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if length is None:
                return  # the server closed its output
            message = json.loads(stream.read(length))
            method = message.get("method")
            if method is not None and "id" in message:  # the server asks: say yes
                with contextlib.suppress(OSError, ValueError):
                    self._send({"id": message["id"], "result": None})
            elif method == "window/showMessage":
                self.shown.append(message["params"]["message"])
            elif method == "kode/inlineCompletionPartial":
                self.partials.put(message["params"])
            elif method is None:
                with self._arrived:
                    self._responses[message["id"]] = message
                    self._arrived.notify_all()

    def together(self, *messages: dict[str, Any]) -> None:
        """Write ``messages`` (requests with their ``id``, notifications) in one write, as
        an editor does when it has several queued: the server reads them in one read."""
        frames = b""
        for message in messages:
            body = json.dumps({"jsonrpc": "2.0", **message}).encode()
            frames += b"Content-Length: %d\r\n\r\n" % len(body) + body
        assert self.proc.stdin is not None
        with self._write:
            self.proc.stdin.write(frames)
            self.proc.stdin.flush()

    def next_id(self) -> int:
        return next(self._ids)

    def ask(self, method: str, params: Any = None) -> int:
        n = next(self._ids)
        self._send({"id": n, "method": method, "params": params})
        return n

    def answer(self, n: int, timeout_s: float) -> dict[str, Any]:
        with self._arrived:
            if not self._arrived.wait_for(lambda: n in self._responses, timeout_s):
                tail = self.log.read_text(errors="replace").splitlines()[-20:]
                raise TimeoutError(
                    f"no answer to request {n} within {timeout_s} s; the server's log ends:\n"
                    + "\n".join(tail)
                )
            return self._responses.pop(n)

    def partial(self, n: int, timeout_s: float) -> dict[str, Any] | None:
        """The next ``kode/inlineCompletionPartial`` for request ``n`` (those of other
        requests, sent earlier, are dropped), or None if none came within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                params = self.partials.get(timeout=left)
            except queue.Empty:
                return None
            if params.get("requestId") == n:
                return params
        return None

    def request(self, method: str, params: Any, timeout_s: float) -> dict[str, Any]:
        return self.answer(self.ask(method, params), timeout_s)

    def notify(self, method: str, params: Any) -> None:
        self._send({"method": method, "params": params})

    # -- what an editor does -------------------------------------------------------------

    def initialize(self, root: Path | None, options: dict[str, Any], timeout_s: float) -> None:
        capabilities = {
            "workspace": {"didChangeWatchedFiles": {"dynamicRegistration": True}},
        }
        params = {
            "processId": os.getpid(),
            "rootUri": None if root is None else root.as_uri(),
            "capabilities": capabilities,
            "initializationOptions": options,
        }
        assert "result" in self.request("initialize", params, timeout_s)
        self.notify("initialized", {})

    def open(self, uri: str, text: str) -> None:
        document = {"uri": uri, "languageId": "python", "version": 1, "text": text}
        self.notify("textDocument/didOpen", {"textDocument": document})

    def complete_async(self, uri: str, line: int, character: int) -> int:
        return self.ask(
            "textDocument/inlineCompletion",
            {
                "textDocument": {"uri": uri},
                "position": {"line": line, "character": character},
                "context": {"triggerKind": 1},
            },
        )

    def complete(self, uri: str, line: int, character: int, timeout_s: float) -> dict[str, Any]:
        return self.answer(self.complete_async(uri, line, character), timeout_s)

    def created(self, *paths: Path) -> None:
        changes = [{"uri": p.as_uri(), "type": 1} for p in paths]  # FileChangeType.Created
        self.notify("workspace/didChangeWatchedFiles", {"changes": changes})

    def stats(self, timeout_s: float = 30.0) -> dict[str, Any]:
        reply = self.request("kode/stats", {}, timeout_s)
        result: dict[str, Any] = reply["result"]
        return result

    def children(self) -> list[int]:
        """The pids of this window's child processes (the index's parsing child), but
        not a shared engine it started: that one outlives windows by design (its idle
        time), and ``conftest.py`` stops it."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, IndexError):
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                    if int(fields[1]) != self.proc.pid or fields[0] == "Z":
                        continue
                    argv = (entry / "cmdline").read_bytes().split(b"\0")
                    if b"engine" not in argv or b"run" not in argv:
                        found.append(int(entry.name))
        return found

    def end(self, shutdown_s: float) -> float:
        """``shutdown`` (answered within ``shutdown_s``), then ``exit``: the seconds
        from ``exit`` until the process is gone."""
        assert "result" in self.request("shutdown", None, shutdown_s)
        self.notify("exit", None)
        sent = time.monotonic()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)
        return time.monotonic() - sent

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self._reader.join(5)


def gone_within(pids: list[int], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
