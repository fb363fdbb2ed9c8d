"""One home for each setting's default: completion/settings.py's ``DEFAULT``.

The VS Code extension shows package.json's ``default`` in its Settings UI but sends only
what the user set (editors/vscode/src/common/settings.ts), so those defaults must be the
server's, value for value; library code repeats none of them.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from pathlib import Path
from typing import Any

import msgspec
from kode.completion.context import Budget
from kode.completion.settings import DEFAULT, Settings
from kode.completion.stops import StopRules

ROOT = Path(__file__).resolve().parents[2]
VSCODE = ROOT / "editors" / "vscode"
CLIENT_ONLY = {"kode.serverPath", "kode.trace.server"}  # read by the extension, never sent


def _contributed() -> dict[str, dict[str, Any]]:
    manifest = json.loads((VSCODE / "package.json").read_text(encoding="utf-8"))
    properties: dict[str, dict[str, Any]] = manifest["contributes"]["configuration"]["properties"]
    return properties


def _server_defaults() -> dict[str, Any]:
    """``kode.<camelCase>`` -> the server's default as JSON, ``remote`` flattened."""
    out: dict[str, Any] = {}
    for key, value in msgspec.to_builtins(DEFAULT).items():
        if isinstance(value, dict):
            out.update({f"kode.{key}.{inner}": v for inner, v in value.items()})
        else:
            out[f"kode.{key}"] = value
    return out


def _client_defaults() -> dict[str, Any]:
    """CLIENT_DEFAULTS of settings.ts: what the extension sends when the user set nothing."""
    source = (VSCODE / "src" / "common" / "settings.ts").read_text(encoding="utf-8")
    found = re.search(r"export const CLIENT_DEFAULTS\b[^=]*=\s*\{([^}]*)\}", source)
    assert found, "CLIENT_DEFAULTS not found in editors/vscode/src/common/settings.ts"
    body = re.sub(r"(\w+)\s*:", r'"\1":', found.group(1)).strip().rstrip(",")
    parsed: dict[str, Any] = json.loads("{" + body + "}")
    return {f"kode.{key}": value for key, value in parsed.items()}


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values: 0 and 0.0 alike, but not True and 1."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def test_package_json_contributes_every_server_setting() -> None:
    assert set(_contributed()) - CLIENT_ONLY == set(_server_defaults())


def test_package_json_defaults_are_the_servers() -> None:
    server, client = _server_defaults(), _client_defaults()
    wrong = {}
    for key, schema in _contributed().items():
        if key in CLIENT_ONLY or "default" not in schema:
            continue
        expected = client.get(key, server[key])
        if not _same(schema["default"], expected):
            wrong[key] = (schema["default"], expected)
    assert wrong == {}, "package.json default, expected (server's, or CLIENT_DEFAULTS')"


def test_client_defaults_are_server_settings_that_differ() -> None:
    server, client = _server_defaults(), _client_defaults()
    assert client == {"kode.partialCompletions": True}
    for key, value in client.items():
        assert key in server and not _same(value, server[key]), key


def _library_defaults() -> dict[tuple[str, str], Any]:
    """(where, parameter name) -> default, for StopRules and Budget."""
    out: dict[tuple[str, str], Any] = {}
    for param in inspect.signature(StopRules.build).parameters.values():
        if param.default is not param.empty:
            out["StopRules.build", param.name] = param.default
    for struct in (StopRules, Budget):
        for f in dataclasses.fields(struct):
            if f.default is not dataclasses.MISSING:
                out[struct.__name__, f.name] = f.default
    return out


def test_library_code_repeats_no_setting_default() -> None:
    """A parameter named after a setting (``max_lines``, ``prefix_tokens``...) has no
    default, or one meaning "none" (0 or None), never a number of its own."""
    settings = {f.name for f in msgspec.structs.fields(Settings)}
    copies = {
        where: value
        for where, value in _library_defaults().items()
        if where[1] in settings and value is not None and value != 0
    }
    assert copies == {}


def test_stop_rules_without_max_lines_bound_no_lines() -> None:
    plain = StopRules.build("", "", "")
    assert plain.max_lines is None
    text = "\n".join(f"x{i} = {i}" for i in range(3 * DEFAULT.max_lines))
    assert not plain.scan(text).stop
    bounded = StopRules.build("", "", "", max_lines=DEFAULT.max_lines)
    cut = bounded.scan(text)
    assert cut.stop and text[: cut.keep].count("\n") == DEFAULT.max_lines - 1
