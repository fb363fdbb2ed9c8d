"""Kode's exceptions as LSP errors, in one place."""

from __future__ import annotations

from kode.backends.errors import BackendError, DocumentError, KodeError, ModelError, SettingsError
from pygls.exceptions import JsonRpcException, JsonRpcInternalError, JsonRpcInvalidParams

REQUEST_FAILED = -32803  # LSP 3.17 ErrorCodes.RequestFailed


class RequestFailed(JsonRpcException):
    CODE = REQUEST_FAILED
    MESSAGE = "Request Failed"


def to_lsp_error(exc: BaseException) -> JsonRpcException:
    """The response error for ``exc``: bad input is -32602, a failed model -32803."""
    if isinstance(exc, JsonRpcException):
        return exc
    if isinstance(exc, DocumentError | SettingsError):
        return JsonRpcInvalidParams(str(exc))
    if isinstance(exc, ModelError | BackendError | KodeError):
        return RequestFailed(f"Kode: {exc}")
    # Named by type only: the text of an unexpected error may quote source code.
    return JsonRpcInternalError(f"Kode internal error: {type(exc).__name__}")
