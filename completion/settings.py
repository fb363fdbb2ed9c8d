"""User settings, parsed once into frozen msgspec structs.

Editors send camelCase JSON (``initializationOptions`` and
``workspace/didChangeConfiguration``), either the settings object itself or wrapped
as ``{"kode": {...}}``. A bad value is reported and that one setting falls back to
its default; the others still apply.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, TypeVar

import msgspec
from kode.backends.base import BackendKind as BackendKind  # re-exported: the `backend` setting
from kode.backends.base import SpeculationMethod
from kode.backends.defaults import (
    CHUNK_MEMORY_MB,
    CONTEXT_SIZE,
    ENGINE_IDLE_MINUTES,
    KV_MEMORY_MB,
    MAX_CONTEXT_SIZE,
    MAX_KV_MEMORY_MB,
    MIN_CONTEXT_SIZE,
)
from kode.backends.system import usable_cores
from kode.completion.stops import MultilineMode

# Every number has bounds: a value past them is reported and its default used. The
# upper bounds are far above any useful value and far below the ones that break
# things (``threads: 100000`` aborted the process with std::bad_alloc).
_TOKENS = MAX_CONTEXT_SIZE  # Qwen2.5-Coder's longest context, with YaRN: 131072
_Tokens = Annotated[int, msgspec.Meta(ge=0, le=_TOKENS)]
_Ms = Annotated[int, msgspec.Meta(ge=0, le=600_000)]  # ten minutes


class LocalEngine(enum.StrEnum):
    LLAMA_CPP = "llama.cpp"  # GGUF through llama-cpp-python (the default)
    TORCH = "torch"  # transformers + PyTorch (pip install 'kode[torch]'); bf16 on a GPU


class EngineMode(enum.StrEnum):
    SHARED = "shared"  # one engine process per user and model, shared by every window
    IN_PROCESS = "inProcess"  # this window loads its own copy of the model


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
    timeout_ms: Annotated[int, msgspec.Meta(ge=1, le=600_000)] = 5000
    latency_budget_ms: Annotated[int, msgspec.Meta(ge=1, le=600_000)] = 1500  # auto: fall back


class Settings(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    """Every setting, with its default. The table in ``editors/README.md`` mirrors it."""

    enabled: bool = True
    backend: BackendKind = BackendKind.LOCAL
    local_engine: LocalEngine = LocalEngine.LLAMA_CPP
    # llama.cpp: every window talks to one engine process per user and model (started by
    # the first window, `kode engine status|stop`), or loads the model itself.
    engine: EngineMode = EngineMode.SHARED
    # The shared engine exits this long after its last window closed (0: at once).
    engine_idle_minutes: Annotated[int, msgspec.Meta(ge=0, le=7 * 24 * 60)] = ENGINE_IDLE_MINUTES
    model: str = "default"  # "default" (1.5B), "small" (0.5B), a GGUF path or hf:OWNER/REPO/FILE
    draft_model: str = "small"  # used by speculation = draft
    template: str = "qwen2.5-coder"
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=2048)] = 128
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=2.0)] = 0.0
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] = 1.0
    seed: Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)] | None = None  # llama.cpp: uint32
    speculation: SpeculationMethod = SpeculationMethod.AUTO
    multiline: MultilineMode = MultilineMode.AUTO
    # Stop generating where the code says the fill is done (completion/stops.py,
    # completion/structure.py), not only where the model ends it; false: as before.
    structural_stops: bool = True
    # Local engine: a cursor inside a word backs the prompt off to a token boundary and
    # constrains the first generated token(s) to spell the removed text (token healing).
    # Off by default: +1 task of 14 mid-word on one sample, a suspected loss on another
    # (docs/benchmarks.md); not shown to gain.
    token_healing: bool = False
    # Local engine, Python: after `receiver.` whose members are known (a module, a class,
    # self), the next name must be one of them; where __init__ makes an attribute, the names
    # the class uses and makes nowhere else weigh more (the names monitor, backends/monitor.py).
    names_monitor: bool = True
    max_lines: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 32
    prefix_tokens: Annotated[int, msgspec.Meta(ge=1, le=_TOKENS)] = 1024
    suffix_tokens: _Tokens = 64
    # llama.cpp: after a keystroke, reuse the cached suffix at its new position while at
    # most this many edited tokens went unseen by it (kode bench quality, mode `moved`);
    # 0: re-evaluate the suffix on every keystroke.
    moved_suffix_drift: _Tokens = 32
    snippet_tokens: _Tokens = 512
    # Project context (completion/project/retrieval.py): definitions, module outlines and similar
    # code from the workspace folders' files, after the open documents; 0: off.
    retrieval_tokens: _Tokens = 512
    workspace_index: bool = True  # index the workspace folders (needed for retrieval)
    index_max_files: Annotated[int, msgspec.Meta(ge=1, le=10_000_000)] = 20000
    # larger files are not indexed
    index_max_file_bytes: Annotated[int, msgspec.Meta(ge=1, le=1 << 30)] = 1_000_000
    context_size: Annotated[int, msgspec.Meta(ge=MIN_CONTEXT_SIZE, le=_TOKENS)] = CONTEXT_SIZE
    threads: Annotated[int, msgspec.Meta(ge=0)] = 0  # 0: every core; at most usable_cores()
    log_prompts: bool = False  # never log source code unless asked to
    partial_completions: bool = False  # send kode/inlineCompletionPartial while text grows
    time_budget_ms: _Ms = 0  # 0: no budget; else answer with what is ready by then
    # Start a suggestion before it is asked for: after one is accepted, and where the
    # cursor rests at the end of a line (local engine, with background preparation).
    prefetch: bool = True
    read_ahead: bool = True  # local engine: evaluate a newly opened document's prompt early
    # Next edits (`kode/inlineEdit`, completion/edits/): keep the recent edits and propose
    # the edit that repeats the last one at its next place. Off until issue #49's bar is
    # met (docs/next-edits.md); the history is kept only while it is on.
    next_edits: bool = False
    # Local engine: the most a keystroke may spend evaluating prompt tokens, at the prefill
    # speed measured on this machine; past it, answer from a shorter window that fits and
    # prepare the full one in the background. 0: always the full window.
    first_answer_ms: Annotated[int, msgspec.Meta(ge=0, le=60_000)] = 1000
    # llama.cpp: host memory for evaluated prompts of other documents and places (saved
    # KV states, least recently used dropped first); 0 keeps only the current one.
    kv_memory_mb: Annotated[int, msgspec.Meta(ge=0, le=MAX_KV_MEMORY_MB)] = KV_MEMORY_MB
    # llama.cpp: host memory for chunks of the active document read while the user reads;
    # a fresh place's full window is then assembled from them (the entries taken did not
    # see what precedes them; only the first tokens of each are evaluated again) when
    # evaluating it would not fit firstAnswerMs or a reading pause. 0: off.
    chunk_memory_mb: Annotated[int, msgspec.Meta(ge=0, le=MAX_KV_MEMORY_MB)] = CHUNK_MEMORY_MB
    remote: RemoteSettings = RemoteSettings()


DEFAULT = Settings()


def parse(raw: Any, *, cores: int | None = None) -> tuple[Settings, list[str]]:
    """Settings from editor JSON, and one message per rejected setting.

    Each setting is validated on its own (nested objects field by field), so a bad one
    falls back to its default and is named in a message while the others still apply;
    then what each value allows alone but the machine or the other values do not.
    ``cores``: the most ``threads`` may be (default: ``usable_cores()``).

    >>> print(*parse({"maxTokens": 64, "speculation": "warp"})[1])
    speculation: 'warp' is not one of auto, none, ngram, lookahead, draft, remote; using the default
    """
    settings, problems = _parse_fields(raw)
    return _check_together(settings, problems, usable_cores() if cores is None else cores)


def _check_together(
    settings: Settings, problems: list[str], cores: int
) -> tuple[Settings, list[str]]:
    """What each value allows alone but the machine or the other values do not."""
    if settings.threads > cores:
        # More threads than cores only slows llama.cpp down (600 on 2 cores: 4x slower)
        # and 100000 aborted the process (std::bad_alloc).
        problems.append(
            f"threads: {settings.threads} is more than the {cores} cores this machine "
            "lets Kode use; using 0 (every core)"
        )
        settings = msgspec.structs.replace(settings, threads=0)
    if settings.max_tokens > settings.context_size // 2:
        fallback = min(DEFAULT.max_tokens, settings.context_size // 4)
        problems.append(
            f"maxTokens: {settings.max_tokens} leaves too little of contextSize "
            f"{settings.context_size} for the code around the cursor (at most half of "
            f"it); using {fallback}"
        )
        settings = msgspec.structs.replace(settings, max_tokens=fallback)
    return settings, problems


def _parse_fields(raw: Any) -> tuple[Settings, list[str]]:
    if raw is None or raw == []:  # Lua encodes an empty table as []
        return DEFAULT, []
    if isinstance(raw, dict) and isinstance(raw.get("kode"), dict):
        raw = raw["kode"]
    if not isinstance(raw, dict):
        return DEFAULT, [f"settings must be an object, got {type(raw).__name__}"]
    problems: list[str] = []
    return _parse_struct(Settings, raw, "", problems), problems


S = TypeVar("S", bound=msgspec.Struct)


def _parse_struct(kind: type[S], raw: dict[str, Any], at: str, problems: list[str]) -> S:
    """``kind`` from ``raw``, keeping the fields that validate; a message for each other."""
    fields = {f.encode_name: f for f in msgspec.structs.fields(kind)}
    good: dict[str, Any] = {}
    for key, value in raw.items():
        field = fields.get(key)
        if field is None:
            problems.append(f"{at}{key}: unknown setting, ignored")
            continue
        nested = field.type
        if isinstance(nested, type) and issubclass(nested, msgspec.Struct):
            if isinstance(value, dict):
                good[field.name] = _parse_struct(nested, value, f"{at}{key}.", problems)
            else:
                problems.append(
                    f"{at}{key}: must be an object, got {type(value).__name__}; using the default"
                )
            continue
        try:
            good[field.name] = msgspec.convert(value, field.type)
        except msgspec.ValidationError as exc:
            problems.append(f"{at}{key}: {_explain(exc, value, field.type)}; using the default")
    return kind(**good)


def _explain(exc: msgspec.ValidationError, value: Any, kind: Any) -> str:
    """msgspec's message, or for an enum the values it accepts."""
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        allowed = ", ".join(str(member.value) for member in kind)
        return f"{value!r} is not one of {allowed}"
    return str(exc)
