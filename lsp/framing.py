"""LSP base-protocol framing that survives a misbehaving client.

pygls' reader (``pygls.io_.run_async``) trusts every ``Content-Length``: a value that
is too short, too long, non-numeric or missing leaves it waiting for a header that
never comes, deaf for good, and ``Content-Length: 99999999999`` ends the process with
``MemoryError``. A client that once counts characters instead of bytes (``café``) is
enough. ``FrameParser`` is the same framing, pure and resynchronising:

- header lines are found anywhere in a line (``...}Content-Length: 52``, the tail of a
  cut body glued to the next header), case-insensitively, each at most
  ``MAX_HEADER_LINE`` bytes; a length that is not a number, or above ``MAX_BODY``, is
  refused with a log line and the parser looks for the next header;
- a body that is not one JSON value is retried with the bytes up to the next header
  (the length was too short), and a body holding one JSON value and more is cut after
  the value, the rest going back to the header scan (the length was too long);
- a body still incomplete when the client has gone quiet (``idle()``) is taken as is;
- what still does not parse is a ``ParseError``, answered -32700 when a request id can
  be read from it (JSON-RPC wants an answer; a cut body rarely loses its id, which
  comes first in every client we know).

``serve`` runs it over an async byte source (stdin through a thread, or a TCP stream).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger("kode.lsp.framing")

MAX_HEADER_LINE = 8 << 10
# The largest body accepted: didOpen of a 50 MB generated file is the largest real one
# we have seen clients send; nothing legitimate comes near this.
MAX_BODY = 256 << 20
# A body still short of its Content-Length after this long without a byte is taken as
# it is (the length was too long and the client waits for the answer).
IDLE_S = 0.5
_READ_SIZE = 1 << 16

_LENGTH = re.compile(rb"content-length[ \t]*:[ \t]*([^\r\n]*)", re.IGNORECASE)
_HEADER = re.compile(rb"^[A-Za-z][A-Za-z0-9-]*[ \t]*:")
_PLAIN = json.JSONDecoder()
_ID = re.compile(r'"id"\s*:\s*(-?\d{1,18}|"(?:[^"\\]|\\.){0,200}")')


@dataclass(frozen=True, slots=True)
class Message:
    """One well-framed JSON value, decoded."""

    value: Any


@dataclass(frozen=True, slots=True)
class ParseError:
    """A body that is not JSON; ``request_id`` if one could be read from it."""

    request_id: int | str | None
    reason: str


@dataclass(frozen=True, slots=True)
class Rejected:
    """The decoder's hook refused a well-formed message (already answered by it)."""

    error: Exception


Event = Message | ParseError | Rejected


class FrameParser:
    """Bytes in, ``Message`` / ``ParseError`` / ``Rejected`` out; never raises, never
    holds more than ``max_body`` plus one read of bytes.

    ``decoder``: the JSON decoder to use (pygls structures messages with an
    ``object_hook``); only its ``JSONDecodeError`` counts as a framing problem.
    """

    def __init__(
        self,
        decoder: json.JSONDecoder | None = None,
        *,
        max_body: int = MAX_BODY,
        max_header_line: int = MAX_HEADER_LINE,
    ) -> None:
        self._decoder = decoder or json.JSONDecoder()
        self._max_body = max_body
        self._max_header = max_header_line
        self._buf = bytearray()
        self._length: int | None = None  # from the header block being read
        self._body: int | None = None  # reading a body of this many bytes
        self._held: bytes | None = None  # a body that did not parse, waiting for its rest
        self._scanned = 0  # how much of a short body was searched for a next header
        self.problems = 0  # framing problems met (for tests and the log)

    @property
    def waiting(self) -> bool:
        """True while part of a message is buffered: call ``idle()`` after a quiet spell."""
        if self._body is not None or self._held is not None:
            return True
        return self._buf.lstrip().startswith(b"{")  # a body that came without its header

    def feed(self, data: bytes) -> Iterator[Event]:
        """Events for what ``data`` completes. Lazy, so that a message is decoded (and
        the decoder's hook runs) only after the ones before it were handled: consume
        them all before the next call."""
        self._buf += data
        return self._drain()

    def idle(self) -> Iterator[Event]:
        """The client went quiet: take what is buffered as the message it meant."""
        if self._held is not None:
            body, self._held = self._held + bytes(self._buf), None
            self._buf.clear()
            yield self._last_try(body)
        elif self._body is not None:
            body = bytes(self._buf)
            self._problem(
                f"Content-Length said {self._body} bytes but {len(body)} came; "
                "taking those as the message"
            )
            self._buf.clear()
            self._body, self._scanned = None, 0
            yield from self._decode(body, retry=False)
        elif self._buf.lstrip().startswith(b"{"):
            body = bytes(self._buf)
            self._buf.clear()
            self._length = None
            self._problem("a message came without a Content-Length header")
            yield self._last_try(body)
        yield from self._drain()

    def _drain(self) -> Iterator[Event]:
        while True:
            if self._held is not None:
                at = _find_length(self._buf)
                if at is None:
                    return
                body, self._held = self._held + bytes(self._buf[:at]), None
                del self._buf[:at]
                yield self._last_try(body)
            elif self._body is not None:
                if len(self._buf) < self._body:
                    early = self._early_end()
                    if early is None:
                        return
                    yield early
                    continue
                body = bytes(self._buf[: self._body])
                del self._buf[: self._body]
                self._body, self._scanned = None, 0
                yield from self._decode(body, retry=True)
            else:
                end = self._buf.find(b"\n")
                if end < 0:
                    if len(self._buf) > self._max_header:
                        self._problem(f"a header line longer than {self._max_header} bytes")
                        del self._buf[: len(self._buf) - 64]  # a header may start in the tail
                    return
                line = bytes(self._buf[: end + 1])
                del self._buf[: end + 1]
                yield from self._header(line)

    def _header(self, line: bytes) -> list[Event]:
        if not line.strip():
            if self._length is not None:
                self._body, self._length = self._length, None
            return []
        match = None
        for match in _LENGTH.finditer(line):  # noqa: B007 - the last one counts
            pass
        if match is None:
            if not _HEADER.match(line):
                self._problem(f"dropped {len(line)} bytes that are not an LSP header")
            return []
        events: list[Event] = []
        junk = line[: match.start()].strip()
        if junk.startswith(b"{"):  # a body without its header, glued to the next one
            self._problem("a message came without a Content-Length header")
            events.append(self._last_try(junk))
        elif junk:
            self._problem(f"dropped {len(junk)} bytes before a Content-Length header")
        value = match.group(1).strip()
        self._length = None
        if not value.isdigit():
            self._problem(f"Content-Length is not a number: {_show(value)}")
        elif int(value) > self._max_body:
            self._problem(f"Content-Length {int(value)} is above the {self._max_body}-byte limit")
        else:
            self._length = int(value)
        return events

    def _early_end(self) -> Event | None:
        """While a body is short of its length: if a header follows what parses as one
        whole message, the length was too long; take the message now rather than
        swallow the next ones. (A ``Content-Length:`` inside the body's text is inside
        a JSON string, so the bytes before it never parse.)"""
        start = max(0, self._scanned - 20)
        self._scanned = len(self._buf)
        match = _LENGTH.search(self._buf, start)
        if match is None or not self._buf[: match.start()].strip():
            return None
        head = bytes(self._buf[: match.start()])
        try:  # a plain decoder: the real one's hook may answer the message
            _PLAIN.raw_decode(head.decode("utf-8", errors="surrogateescape").strip())
        except ValueError:
            return None
        expected, self._body, self._scanned = self._body, None, 0
        del self._buf[: match.start()]
        self._problem(f"Content-Length said {expected} bytes, the message had {len(head)}")
        events = self._decode(head, retry=False)
        return events[0]

    def _decode(self, body: bytes, *, retry: bool) -> list[Event]:
        """Events for one framed body; on a parse failure with ``retry`` the body is
        held until the next header shows where it really ends."""
        text = body.decode("utf-8", errors="surrogateescape")
        stripped = text.lstrip()
        try:
            value, end = self._decoder.raw_decode(stripped)
        except json.JSONDecodeError as exc:
            if retry:
                self._held = body
                return []
            return [ParseError(_sniff_id(text), exc.msg)]
        except Exception as exc:  # the decoder's object_hook refused the message
            return [Rejected(exc)]
        rest = stripped[end:]
        if rest.strip():
            # The length was too long: the rest is the start of the next message.
            extra = rest.encode("utf-8", errors="surrogateescape")
            self._problem(f"Content-Length was {len(extra)} bytes too long; resynchronised")
            self._buf[:0] = extra
        return [Message(value)]

    def _last_try(self, body: bytes) -> Event:
        events = self._decode(body, retry=False)
        if isinstance(events[0], Message):
            self._problem("a Content-Length did not match its body; resynchronised")
        else:
            self._problem("a message could not be read as JSON")
        return events[0]

    def _problem(self, what: str) -> None:
        self.problems += 1
        log.warning("LSP framing: %s", what)


def _find_length(buf: bytearray) -> int | None:
    match = _LENGTH.search(buf)
    return None if match is None else match.start()


def _show(value: bytes) -> str:
    return repr(value[:32].decode("ascii", errors="replace"))


def _sniff_id(text: str | bytes) -> int | str | None:
    """The request id in a body that is not valid JSON, if it can be read."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    match = _ID.search(text)
    if match is None:
        return None
    raw = match.group(1)
    if raw.startswith('"'):
        try:
            value: str = json.loads(raw)
        except ValueError:
            return None
        return value
    return int(raw)


class Handler(Protocol):
    """What ``serve`` hands events to (``KodeProtocol``)."""

    def handle_event(self, event: Event) -> None: ...


async def serve(
    read: Callable[[], Awaitable[bytes]],
    handler: Handler,
    parser: FrameParser,
    *,
    stopped: Callable[[], bool] = lambda: False,
    idle_s: float = IDLE_S,
) -> None:
    """Read chunks (``b""`` at the end) into ``parser`` and hand its events on, until
    the stream ends or ``stopped()``."""
    pending: asyncio.Future[bytes] | None = None
    try:
        while not stopped():
            if pending is None:
                pending = asyncio.ensure_future(read())
            done, _ = await asyncio.wait({pending}, timeout=idle_s if parser.waiting else None)
            events: Iterator[Event]
            if not done:
                events = parser.idle()
            else:
                chunk = pending.result()
                pending = None
                if not chunk:
                    for event in parser.idle():
                        handler.handle_event(event)
                    log.info("LSP client closed the stream")
                    return
                events = parser.feed(chunk)
            for event in events:
                handler.handle_event(event)
    finally:
        if pending is not None and not pending.done():
            pending.cancel()


def stdin_reader(stream: Any, executor: Any = None) -> Callable[[], Awaitable[bytes]]:
    """Chunks of a binary file object, read on a thread (``read1``: what is there)."""

    async def read() -> bytes:
        loop = asyncio.get_running_loop()
        data: bytes = await loop.run_in_executor(executor, stream.read1, _READ_SIZE)
        return data

    return read


def stream_reader(reader: asyncio.StreamReader) -> Callable[[], Awaitable[bytes]]:
    async def read() -> bytes:
        return await reader.read(_READ_SIZE)

    return read
