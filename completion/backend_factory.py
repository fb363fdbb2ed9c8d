"""Which backend serves a request, built from settings.

- ``backend: "local"``: the llama.cpp engine on this machine;
- ``backend: "remote"``: the server at ``remote.url`` (SGLang's native API or any
  OpenAI-compatible one, per ``remote.api``), errors surface;
- ``backend: "auto"``: that server within ``remote.latencyBudgetMs``, else the local
  engine (loaded only when first needed), behind a circuit breaker.
"""

from __future__ import annotations

import asyncio

from kode.backends.base import Backend, SpeculationMethod
from kode.backends.errors import BackendError, SettingsError
from kode.backends.remote.clients import OpenAIBackend, RemoteBackend, SGLangBackend
from kode.backends.router import RoutingBackend
from kode.completion.settings import BackendKind, LocalEngine, RemoteApi, Settings
from kode.completion.templates import TEMPLATES


async def load_backend(settings: Settings) -> Backend:
    """The backend ``settings`` name."""
    if settings.backend is BackendKind.LOCAL:
        return await load_local(settings)
    remote = build_remote(settings)
    if settings.backend is BackendKind.REMOTE:
        return remote

    async def local() -> Backend:
        return await load_local(settings)

    return RoutingBackend(
        local,
        remote,
        BackendKind.AUTO,
        latency_budget_ms=settings.remote.latency_budget_ms,
    )


async def load_local(settings: Settings) -> Backend:
    """The local backend for ``settings.model``: llama.cpp, or torch if asked for."""
    if settings.local_engine is LocalEngine.TORCH:
        try:
            from kode.backends.torch.backend import load_torch_backend
        except ImportError as exc:
            raise BackendError(
                f'localEngine "torch" needs PyTorch and transformers: pip install '
                f"'kode[torch]' ({exc})"
            ) from exc
        draft_name = (
            settings.draft_model if settings.speculation is SpeculationMethod.DRAFT else None
        )
        return await load_torch_backend(
            settings.model,
            draft_name,
            n_ctx=settings.context_size,
            n_threads=settings.threads or None,
        )
    from kode.backends import models
    from kode.backends.llama.backend import LlamaBackend

    path = await asyncio.to_thread(models.resolve, settings.model)
    draft = None
    if settings.speculation is SpeculationMethod.DRAFT:
        draft = await asyncio.to_thread(models.resolve, settings.draft_model)
    return await LlamaBackend.load(
        path,
        n_ctx=settings.context_size,
        n_threads=settings.threads or None,
        draft_path=draft,
        kv_memory_mb=settings.kv_memory_mb,
    )


def build_remote(settings: Settings) -> RemoteBackend:
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
