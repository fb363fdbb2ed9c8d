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
# The context sizes Kode accepts (settings, ``kode serve``): the longest is Qwen2.5-Coder's
# with YaRN; below the shortest no fitted window fits.
MIN_CONTEXT_SIZE, MAX_CONTEXT_SIZE = 512, 1 << 17
# Memory for saved prompt states (KV snapshots of other windows and places) per engine.
KV_MEMORY_MB = 512
MAX_KV_MEMORY_MB = 65_536
# Memory for chunks of open files read while the user reads, from which the full window
# at a fresh place is assembled (``backends/llama/kv_chunks.py``): the 1.5B's entries take
# about 240 MB per 1,000 lines of Python, the 0.5B's about 100 MB. 0: no assembly.
CHUNK_MEMORY_MB = 0
# An idle shared engine (no editor window connected) stops after this long.
ENGINE_IDLE_MINUTES = 30
# Generations the engine runs at once, decoded in one batch (docs/engine.md): two windows
# typing at the same time each decode in ~1.7 single steps instead of waiting for the
# other; a third waits. Each slot holds ``contextSize`` tokens of KV cache.
ENGINE_SLOTS = 2
