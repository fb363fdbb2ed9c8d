"""Which backend serves a request, built from settings."""

from __future__ import annotations

import asyncio

from backends.base import Backend
from completion.settings import Settings


async def load_backend(settings: Settings) -> Backend:
    """The backend ``settings`` name (the local llama.cpp engine for now)."""
    from backends import models
    from backends.llama import LlamaBackend

    path = await asyncio.to_thread(models.resolve, settings.model)
    return await LlamaBackend.load(
        path, n_ctx=settings.context_size, n_threads=settings.threads or None
    )
