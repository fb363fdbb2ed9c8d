"""Kode's version, and the defaults every way of running a model shares, in one place:
the editor settings (``completion/settings.py``), the CLI's options, the shared engine
and the backends read them from here (the backends cannot import the settings, which sit
above them)."""

from __future__ import annotations

import importlib.metadata


def _kode_version() -> str:
    try:
        return importlib.metadata.version("kode")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return "0+unknown"


# Kode's version (pyproject's ``version``): the language server reports it, the shared
# engine's names and handshake carry it.
KODE_VERSION = _kode_version()

# Tokens of context a model is loaded with: FIM prompts of the fitted windows (about 2.5k
# tokens at most) plus a fill, with room to spare; Qwen2.5-Coder takes 32k, which costs
# memory for nothing at the window sizes Kode uses.
CONTEXT_SIZE = 4096
# Memory for saved prompt states (KV snapshots of other windows and places) per engine.
KV_MEMORY_MB = 512
# An idle shared engine (no editor window connected) stops after this long.
ENGINE_IDLE_MINUTES = 30
# Generations the engine runs at once, decoded in one batch (docs/engine.md): two windows
# typing at the same time each decode in ~1.7 single steps instead of waiting for the
# other; a third waits. Each slot holds ``contextSize`` tokens of KV cache.
ENGINE_SLOTS = 2
