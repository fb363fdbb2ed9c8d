"""What a window and the shared engine say to each other over the Unix socket.

Every message is a msgspec struct encoded as MessagePack and framed by a 4-byte
big-endian length (``backends/framing.py``). The window speaks first::

    window                                  engine
    Hello(protocol, version, fingerprint) ->
                                         <- Welcome(pid, model, ...)  or  Refused(message)
    Generate(id, request)                ->
                                         <- Chunk(id, text, tokens) ...
                                         <- End(id, stats, kv_memory)  or  Failed(id, ...)
    Cancel(id)                           ->  (the End that follows says ``cancelled``)
                                         <- Heartbeat(progress)  every second while the
                                            window has work in the engine
    Status()                             -> <- StatusReply(info)
    Stop()                               ->  (the engine ends its generations and exits)

``Generate`` carries a whole ``GenerationRequest`` (moved-suffix drift, draft sources,
priority, ...): the window keeps the completion engine (documents, prompts, stop rules,
typed-ahead), the engine only turns prompts into tokens. The first frame of each side is
decoded leniently (unknown fields ignored), so a window and an engine of different
protocol versions always get to say so in words instead of failing to decode.
"""

from __future__ import annotations

import asyncio
import enum
from typing import Any

import msgspec
from kode.backends import framing
from kode.backends.base import GenerationRequest, GenerationStats
from kode.backends.errors import (
    BackendError,
    ContextOverflow,
    EngineError,
    EngineSetupError,
    KodeError,
    ModelError,
)

# Bump on any change to the messages below.
# 3: GenerationRequest.names, the monitor counters in stats; 4: Names.unmade; 5: chunk
# assembly (GenerationRequest.assemble, read_chunks; End.chunks).
PROTOCOL_VERSION = 5
# A frame larger than this is refused (a prompt is at most a few hundred kB).
MAX_FRAME = 64 << 20


class Hello(msgspec.Struct, tag="hello", kw_only=True):
    protocol: int
    kode_version: str
    fingerprint: str
    pid: int
    window: bool = True  # an editor window keeps the engine alive; a status query does not


class Welcome(msgspec.Struct, tag="welcome", kw_only=True):
    protocol: int
    kode_version: str
    pid: int
    socket: str
    engine: str  # e.g. "llama.cpp"
    model: str
    prefill_tokens_per_s: float | None = None  # measured on earlier windows' prompts


class Refused(msgspec.Struct, tag="refused", kw_only=True):
    message: str


class Generate(msgspec.Struct, tag="generate", kw_only=True):
    id: int
    request: GenerationRequest


class Cancel(msgspec.Struct, tag="cancel", kw_only=True):
    id: int


class Chunk(msgspec.Struct, tag="chunk", kw_only=True):
    id: int
    text: str
    token_ids: tuple[int, ...]


class End(msgspec.Struct, tag="end", kw_only=True):
    id: int
    stats: GenerationStats
    kv_memory: dict[str, int] | None = None
    chunks: dict[str, int] | None = None  # the chunk store (``ChunkAssembly.chunk_store``)
    decode_calls: int = 0  # target model calls it made, prompt batches included


class Heartbeat(msgspec.Struct, tag="heartbeat", kw_only=True):
    """The engine is alive; ``progress`` grows while it works (model calls, generations
    served), so a window that hears it standing still for long knows the engine hangs."""

    progress: int


class ErrorKind(enum.StrEnum):
    """Which of Kode's errors a ``Failed`` stands for, so the window raises the same one."""

    BACKEND = "backend"
    CONTEXT_OVERFLOW = "contextOverflow"
    MODEL = "model"
    ENGINE = "engine"


class Failed(msgspec.Struct, tag="failed", kw_only=True):
    id: int
    kind: ErrorKind
    message: str


class Status(msgspec.Struct, tag="status", kw_only=True):
    pass


class StatusReply(msgspec.Struct, tag="statusReply", kw_only=True):
    info: dict[str, Any]


class Stop(msgspec.Struct, tag="stop", kw_only=True):
    pass


WindowMessage = Generate | Cancel | Status | Stop
EngineMessage = Chunk | End | Failed | Heartbeat | StatusReply | Welcome | Refused


class _Greeting(msgspec.Struct):
    """The part of a first frame every protocol version keeps: its version."""

    protocol: int = 0
    kode_version: str = "?"


_encoder = msgspec.msgpack.Encoder()
_window_decoder = msgspec.msgpack.Decoder(WindowMessage)
_engine_decoder = msgspec.msgpack.Decoder(EngineMessage)
_hello_decoder = msgspec.msgpack.Decoder(Hello)
_greeting_decoder = msgspec.msgpack.Decoder(_Greeting)


def encode(message: msgspec.Struct) -> bytes:
    """``message`` as one frame: its length, then its MessagePack bytes."""
    payload = _encoder.encode(message)
    if len(payload) > MAX_FRAME:
        raise EngineError(f"a message of {len(payload)} bytes is larger than {MAX_FRAME}")
    return framing.frame(payload)


async def read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """The next frame's payload; None at a clean end of stream (between frames).

    Raises ``EngineError`` for a frame cut short or one larger than ``MAX_FRAME``.
    """
    try:
        head = await reader.readexactly(framing.HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise EngineError("the connection ended inside a frame header") from None
    size = framing.length(head)
    if size > MAX_FRAME:
        raise EngineError(f"a frame of {size} bytes is larger than {MAX_FRAME}")
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        raise EngineError("the connection ended inside a frame") from None


def _decode(decoder: msgspec.msgpack.Decoder[Any], payload: bytes) -> Any:
    try:
        return decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise EngineError(f"malformed message from the other side ({exc})") from None


def decode_window(payload: bytes) -> WindowMessage:
    """A message from a window (after its ``Hello``)."""
    message: WindowMessage = _decode(_window_decoder, payload)
    return message


def decode_engine(payload: bytes) -> EngineMessage:
    """A message from the engine."""
    message: EngineMessage = _decode(_engine_decoder, payload)
    return message


def version_mismatch(ours: int, theirs: int, their_version: str, who: str) -> str:
    """The words for two protocol versions that cannot talk."""
    return (
        f"the Kode {who} speaks engine protocol {theirs} (Kode {their_version}) and this one "
        f"speaks {ours}: restart the editor windows after upgrading Kode, or stop the old "
        "engine with `kode engine stop`"
    )


def decode_hello(payload: bytes) -> Hello:
    """A window's first frame. Raises ``EngineSetupError`` with the reason, in words, for
    another protocol version or something that is no hello at all."""
    greeting = _decode(_greeting_decoder, payload)
    if greeting.protocol != PROTOCOL_VERSION:
        raise EngineSetupError(
            version_mismatch(PROTOCOL_VERSION, greeting.protocol, greeting.kode_version, "window")
        )
    hello: Hello = _decode(_hello_decoder, payload)
    return hello


def check_welcome(message: EngineMessage) -> Welcome:
    """The engine's answer to a hello, or ``EngineSetupError`` saying why it refused."""
    if isinstance(message, Refused):
        raise EngineSetupError(f"the Kode engine refused this window: {message.message}")
    if not isinstance(message, Welcome):
        raise EngineError(f"the Kode engine answered the hello with {type(message).__name__}")
    if message.protocol != PROTOCOL_VERSION:
        raise EngineSetupError(
            version_mismatch(PROTOCOL_VERSION, message.protocol, message.kode_version, "engine")
        )
    return message


def failure(request_id: int, exc: BaseException) -> Failed:
    """The ``Failed`` message for ``exc`` (its words as ``describe`` would give them)."""
    if isinstance(exc, ContextOverflow):
        kind = ErrorKind.CONTEXT_OVERFLOW
    elif isinstance(exc, ModelError):
        kind = ErrorKind.MODEL
    elif isinstance(exc, EngineError):
        kind = ErrorKind.ENGINE
    else:
        kind = ErrorKind.BACKEND
    message = str(exc) if isinstance(exc, KodeError) else type(exc).__name__
    return Failed(id=request_id, kind=kind, message=message)


def raised(failed: Failed) -> KodeError:
    """The error a ``Failed`` stands for, to raise in the window."""
    kinds: dict[ErrorKind, type[KodeError]] = {
        ErrorKind.CONTEXT_OVERFLOW: ContextOverflow,
        ErrorKind.MODEL: ModelError,
        ErrorKind.ENGINE: EngineError,
        ErrorKind.BACKEND: BackendError,
    }
    return kinds[failed.kind](failed.message)
