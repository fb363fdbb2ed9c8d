"""Which folders the language server indexes, from `initialize`. No model."""

from __future__ import annotations

from pathlib import Path

from kode.lsp.server import _workspace_roots
from lsprotocol import types


def params(**kwargs: object) -> types.InitializeParams:
    return types.InitializeParams(capabilities=types.ClientCapabilities(), **kwargs)  # type: ignore[arg-type]


def test_workspace_folders_first_then_root_uri_then_root_path() -> None:
    folders = [
        types.WorkspaceFolder(uri="file:///home/u/a%20b", name="a"),
        types.WorkspaceFolder(uri="untitled:x", name="x"),  # not a file: skipped
    ]
    assert _workspace_roots(params(workspace_folders=folders, root_uri="file:///r")) == [
        Path("/home/u/a b")
    ]
    assert _workspace_roots(params(root_uri="file:///r")) == [Path("/r")]
    assert _workspace_roots(params(root_path="/legacy")) == [Path("/legacy")]
    assert _workspace_roots(params()) == []
