"""User settings, parsed once into frozen msgspec structs.

Editors send camelCase JSON (``initializationOptions`` and
``workspace/didChangeConfiguration``), either the settings object itself or wrapped
as ``{"kode": {...}}``. A bad value is reported and that one setting falls back to
its default; the others still apply.
"""

from __future__ import annotations

import enum
import re
from typing import Annotated, Any

import msgspec
from kode.backends.base import SpeculationMethod
from kode.completion.stops import MultilineMode


class BackendKind(enum.StrEnum):
    LOCAL = "local"
    REMOTE = "remote"
    AUTO = "auto"


_Positive = Annotated[int, msgspec.Meta(ge=1)]
_NonNegative = Annotated[int, msgspec.Meta(ge=0)]


class LocalEngine(enum.StrEnum):
    LLAMA_CPP = "llama.cpp"  # GGUF through llama-cpp-python (the default)
    TORCH = "torch"  # transformers + PyTorch (pip install 'kode[torch]'); bf16 on a GPU


class RemoteApi(enum.StrEnum):
    SGLANG = "sglang"  # native POST /generate (SSE) + /abort_request
    OPENAI = "openai"  # POST /v1/completions (vLLM, TGI, llama.cpp server, kode serve)


class RemoteSettings(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    """A remote completion server (SGLang, or anything OpenAI-compatible)."""

    url: str = ""  # e.g. http://gpu-box:30000 ; empty: no remote configured
    api: RemoteApi = RemoteApi.SGLANG
    api_key: str = ""  # sent as a bearer token
    model: str = ""  # model name for the OpenAI API
    timeout_ms: Annotated[int, msgspec.Meta(ge=1)] = 5000
    latency_budget_ms: Annotated[int, msgspec.Meta(ge=1)] = 1500  # auto: fall back past this


class Settings(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    """Every setting, with its default. The table in ``editors/README.md`` mirrors it."""

    enabled: bool = True
    backend: BackendKind = BackendKind.LOCAL
    local_engine: LocalEngine = LocalEngine.LLAMA_CPP
    model: str = "default"  # "default" (1.5B), "small" (0.5B), a GGUF path or hf:OWNER/REPO/FILE
    draft_model: str = "small"  # used by speculation = draft
    template: str = "qwen2.5-coder"
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=2048)] = 128
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=2.0)] = 0.0
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] = 1.0
    seed: int | None = None
    speculation: SpeculationMethod = SpeculationMethod.AUTO
    multiline: MultilineMode = MultilineMode.AUTO
    max_lines: _Positive = 32
    prefix_tokens: _Positive = 1024
    suffix_tokens: _NonNegative = 64
    # llama.cpp: after a keystroke, reuse the cached suffix at its new position while at
    # most this many edited tokens went unseen by it (kode bench quality, mode `moved`);
    # 0: re-evaluate the suffix on every keystroke.
    moved_suffix_drift: _NonNegative = 32
    snippet_tokens: _NonNegative = 512
    # Project context (completion/retrieval.py): definitions, module outlines and similar
    # code from the workspace folders' files, after the open documents; 0: off.
    retrieval_tokens: _NonNegative = 512
    workspace_index: bool = True  # index the workspace folders (needed for retrieval)
    index_max_files: _Positive = 20000
    index_max_file_bytes: _Positive = 1_000_000  # larger files are not indexed
    context_size: Annotated[int, msgspec.Meta(ge=512)] = 4096
    threads: _NonNegative = 0  # 0: every core
    log_prompts: bool = False  # never log source code unless asked to
    partial_completions: bool = False  # send kode/inlineCompletionPartial while text grows
    time_budget_ms: _NonNegative = 0  # 0: no budget; else answer with what is ready by then
    prefetch: bool = True  # after a suggestion is accepted, start the next one
    read_ahead: bool = True  # local engine: evaluate a newly opened document's prompt early
    remote: RemoteSettings = RemoteSettings()


DEFAULT = Settings()

_PATH = re.compile(r"at `\$\.([A-Za-z0-9_.]+)`")


def parse(raw: Any) -> tuple[Settings, list[str]]:
    """Settings from editor JSON, and one message per rejected setting.

    >>> parse({"maxTokens": 64, "speculation": "warp"})
    (Settings(... max_tokens=64 ...), ["speculation: Invalid enum value 'warp'"])
    """
    if raw is None or raw == []:  # Lua encodes an empty table as []
        return DEFAULT, []
    if isinstance(raw, dict) and isinstance(raw.get("kode"), dict):
        raw = raw["kode"]
    if not isinstance(raw, dict):
        return DEFAULT, [f"settings must be an object, got {type(raw).__name__}"]
    values: dict[str, Any] = dict(raw)
    problems: list[str] = []
    for _ in range(_count_leaves(values) + 1):
        try:
            return msgspec.convert(values, Settings), problems
        except msgspec.ValidationError as exc:
            message = str(exc)
            match = _PATH.search(message)
            path = match.group(1).split(".") if match else []
            unknown = _unknown_key(message)
            if unknown is not None:
                path = [*path, unknown]
            if not path or not _drop(values, path):
                return DEFAULT, [*problems, message]
            name = ".".join(path)
            if unknown is not None:
                problems.append(f"{name}: unknown setting, ignored")
            else:
                problems.append(f"{name}: {message.split(' - at ')[0]}; using the default")
    return DEFAULT, problems


def _count_leaves(value: Any) -> int:
    if isinstance(value, dict):
        return sum(_count_leaves(v) for v in value.values()) + 1
    return 1


def _drop(values: dict[str, Any], path: list[str]) -> bool:
    """Remove ``path`` from nested dicts (copying the dicts on the way); False if absent."""
    node = values
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            return False
        node[key] = node = dict(child)
    if path[-1] not in node:
        return False
    del node[path[-1]]
    return True


def _unknown_key(message: str) -> str | None:
    match = re.search(r"unknown field `([^`]+)`", message)
    return match.group(1) if match else None


def to_json(settings: Settings) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(settings)
    return out
