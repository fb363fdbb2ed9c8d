"""Which backend serves a request, built from settings.

- ``backend: "local"``: the llama.cpp engine on this machine;
- ``backend: "remote"``: the server at ``remote.url`` (SGLang's native API or any
  OpenAI-compatible one, per ``remote.api``), errors surface;
- ``backend: "auto"``: that server within ``remote.latencyBudgetMs``, else the local
  engine (loaded only when first needed), behind a circuit breaker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from kode.backends.base import Backend, SpeculationMethod
from kode.backends.errors import BackendError, EngineSetupError, SettingsError
from kode.backends.remote.clients import OpenAIBackend, RemoteBackend, SGLangBackend
from kode.backends.router import RoutingBackend
from kode.completion.settings import (
    BackendKind,
    EngineMode,
    LocalEngine,
    RemoteApi,
    RemoteSettings,
    Settings,
)
from kode.completion.templates import TEMPLATES

log = logging.getLogger("kode.completion")

Notify = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class BackendKey:
    """Exactly the settings a backend is built from: the loader reads nothing else, and
    the pool (``BackendPool``) builds a new backend when, and only when, one of them
    changes (``draft_model`` is None unless ``speculation`` is ``draft``)."""

    backend: BackendKind
    local_engine: LocalEngine
    engine: EngineMode
    engine_idle_minutes: int
    model: str
    draft_model: str | None
    context_size: int
    threads: int
    kv_memory_mb: int
    chunk_memory_mb: int
    remote: RemoteSettings
    template: str

    @classmethod
    def from_settings(cls, settings: Settings) -> BackendKey:
        draft = settings.speculation is SpeculationMethod.DRAFT
        return cls(
            backend=settings.backend,
            local_engine=settings.local_engine,
            engine=settings.engine,
            engine_idle_minutes=settings.engine_idle_minutes,
            model=settings.model,
            draft_model=settings.draft_model if draft else None,
            context_size=settings.context_size,
            threads=settings.threads,
            kv_memory_mb=settings.kv_memory_mb,
            chunk_memory_mb=settings.chunk_memory_mb,
            remote=settings.remote,
            template=settings.template,
        )


async def load_backend(settings: Settings | BackendKey, notify: Notify | None = None) -> Backend:
    """The backend ``settings`` name; ``notify`` tells the user something once (the LSP
    server shows it with ``window/showMessage``), e.g. that the shared engine is not
    available and this window loads its own model."""
    key = settings if isinstance(settings, BackendKey) else BackendKey.from_settings(settings)
    if key.backend is BackendKind.LOCAL:
        return await load_local(key, notify)
    remote = build_remote(key)
    if key.backend is BackendKind.REMOTE:
        return remote

    async def local() -> Backend:
        return await load_local(key, notify)

    return RoutingBackend(
        local,
        remote,
        BackendKind.AUTO,
        latency_budget_ms=key.remote.latency_budget_ms,
    )


class BackendPool:
    """Builds the backend a settings object asks for, once, and swaps it when its
    ``BackendKey`` changes.

    The old backend is closed before the new one loads (two models would need twice
    the memory), under the lock. The keystroke that asked for the new one waits for that
    close, which cancels the old backend's generations and waits a bounded time for
    them (``LocalBackend.aclose``), not for their fills to run to their end."""

    def __init__(self, loader: Callable[[BackendKey], Awaitable[Backend]]) -> None:
        self._loader = loader
        self._key: BackendKey | None = None
        self._backend: Backend | None = None
        self._lock = asyncio.Lock()

    async def get(self, settings: Settings) -> Backend:
        key = BackendKey.from_settings(settings)
        async with self._lock:
            if self._backend is not None and key == self._key:
                return self._backend
            old, self._backend, self._key = self._backend, None, None
            if old is not None:
                await old.aclose()
            self._backend = await self._loader(key)
            self._key = key
            return self._backend

    @property
    def current(self) -> Backend | None:
        return self._backend

    async def aclose(self) -> None:
        async with self._lock:
            old, self._backend, self._key = self._backend, None, None
            if old is not None:
                await old.aclose()


async def load_local(settings: BackendKey, notify: Notify | None = None) -> Backend:
    """The local backend for ``settings.model``: llama.cpp (through the shared engine
    unless ``engine`` is ``inProcess``), or torch if asked for."""
    if settings.local_engine is LocalEngine.TORCH:
        try:
            from kode.backends.torch.backend import load_torch_backend
        except ImportError as exc:
            raise BackendError(
                f'localEngine "torch" needs PyTorch and transformers: pip install '
                f"'kode[torch]' ({exc})"
            ) from exc
        return await load_torch_backend(
            settings.model,
            settings.draft_model,
            n_ctx=settings.context_size,
            n_threads=settings.threads or None,
        )
    from kode.backends import models
    from kode.backends.llama.backend import LlamaBackend

    path = await asyncio.to_thread(models.resolve, settings.model)
    draft = None
    if settings.draft_model is not None:
        draft = await asyncio.to_thread(models.resolve, settings.draft_model)

    async def in_process() -> Backend:
        return await LlamaBackend.load(
            path,
            n_ctx=settings.context_size,
            n_threads=settings.threads or None,
            draft_path=draft,
            kv_memory_mb=settings.kv_memory_mb,
            chunk_memory_mb=settings.chunk_memory_mb,
        )

    if settings.engine is EngineMode.IN_PROCESS:
        return await in_process()
    return await load_shared(settings, path, draft, in_process, notify or _log_notice)


async def load_shared(
    settings: BackendKey,
    path: Path,
    draft: Path | None,
    in_process: Callable[[], Awaitable[Backend]],
    notify: Notify,
) -> Backend:
    """A client of the shared engine for ``path`` (started if none runs), or, if the
    engine cannot be used, ``in_process()`` after telling the user why."""
    from kode.backends.daemon.client import SharedEngineBackend
    from kode.backends.daemon.paths import EngineConfig, place_for
    from kode.backends.llama.runtime import LlamaModel

    config = EngineConfig(
        model=path,
        draft=draft,
        n_ctx=settings.context_size,
        threads=settings.threads,
        kv_memory_mb=settings.kv_memory_mb,
        chunk_memory_mb=settings.chunk_memory_mb,
    )
    try:
        place = await asyncio.to_thread(place_for, config)
    except EngineSetupError as exc:
        notify(f"Kode: {exc}; this window loads its own copy of the model")
        return await in_process()
    vocab = await asyncio.to_thread(LlamaModel, path, vocab_only=True)
    backend = SharedEngineBackend(
        config,
        place,
        vocab,
        idle_s=settings.engine_idle_minutes * 60.0,
        fallback=in_process,
        notify=notify,
    )
    await backend.start()
    return backend


def _log_notice(message: str) -> None:
    log.warning("%s", message)


def build_remote(settings: Settings | BackendKey) -> RemoteBackend:
    """The remote backend ``settings.remote`` describes (no connection is made yet)."""
    remote = settings.remote
    if not remote.url:
        raise SettingsError(
            f'backend "{settings.backend.value}" needs remote.url '
            '(e.g. "http://gpu-box:30000"); it is empty'
        )
    if not remote.url.startswith(("http://", "https://")):
        raise SettingsError(f"remote.url must start with http:// or https://, got {remote.url!r}")
    template = TEMPLATES.get(settings.template)
    stop = template.stop_texts if template is not None else ()
    if remote.api is RemoteApi.OPENAI:
        return OpenAIBackend(
            remote.url,
            api_key=remote.api_key,
            model=remote.model,
            timeout_ms=remote.timeout_ms,
            stop=stop,
        )
    return SGLangBackend(
        remote.url,
        api_key=remote.api_key,
        model=remote.model,
        timeout_ms=remote.timeout_ms,
        stop=stop,
    )
