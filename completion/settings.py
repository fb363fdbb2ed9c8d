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

from backends.base import SpeculationMethod
from completion.stops import MultilineMode


class BackendKind(enum.StrEnum):
    LOCAL = "local"
    REMOTE = "remote"
    AUTO = "auto"


_Positive = Annotated[int, msgspec.Meta(ge=1)]
_NonNegative = Annotated[int, msgspec.Meta(ge=0)]


class Settings(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    """Every setting, with its default. The table in ``editors/README.md`` mirrors it."""

    enabled: bool = True
    backend: BackendKind = BackendKind.LOCAL
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
    snippet_tokens: _NonNegative = 512
    context_size: Annotated[int, msgspec.Meta(ge=512)] = 4096
    threads: _NonNegative = 0  # 0: every core
    log_prompts: bool = False  # never log source code unless asked to


DEFAULT = Settings()

_PATH = re.compile(r"at `\$\.([A-Za-z0-9_]+)`")


def parse(raw: Any) -> tuple[Settings, list[str]]:
    """Settings from editor JSON, and one message per rejected setting.

    >>> parse({"maxTokens": 64, "speculation": "warp"})
    (Settings(... max_tokens=64 ...), ["speculation: Invalid enum value 'warp'"])
    """
    if raw is None:
        return DEFAULT, []
    if isinstance(raw, dict) and isinstance(raw.get("kode"), dict):
        raw = raw["kode"]
    if not isinstance(raw, dict):
        return DEFAULT, [f"settings must be an object, got {type(raw).__name__}"]
    values = dict(raw)
    problems: list[str] = []
    for _ in range(len(values) + 1):
        try:
            return msgspec.convert(values, Settings), problems
        except msgspec.ValidationError as exc:
            message = str(exc)
            match = _PATH.search(message)
            key = match.group(1) if match else _unknown_key(message)
            if key is None or key not in values:
                return DEFAULT, [*problems, message]
            if match:
                problems.append(f"{key}: {message.split(' - at ')[0]}; using the default")
            else:
                problems.append(f"{key}: unknown setting, ignored")
            del values[key]
    return DEFAULT, problems


def _unknown_key(message: str) -> str | None:
    match = re.search(r"unknown field `([^`]+)`", message)
    return match.group(1) if match else None


def to_json(settings: Settings) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(settings)
    return out
