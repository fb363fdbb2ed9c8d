"""Every error Kode raises on purpose, in one tree.

    KodeError
    ├── ModelError                 a model file is missing, corrupt or unloadable
    │   └── ModelPartMissing       a PyPI part package of a default model is absent
    ├── BackendError               a backend could not produce tokens
    │   ├── BackendClosed          the window closed it (a settings change, shutdown): the
    │   │                          request it served is obsolete, not failed; never shown
    │   ├── ContextOverflow        the prompt does not fit the context window
    │   ├── PrefillAborted         a cancel stopped a prompt evaluation (never reaches a user)
    │   ├── RemoteError            a remote server failed (HTTP status, malformed stream)
    │   │   ├── RemoteAuthError    401 / 403
    │   │   ├── RemoteBusyError    429
    │   │   ├── RemoteTimeout      no answer within the time budget
    │   │   └── StreamError        not a well-formed event stream (garbage, an endless line)
    │   └── EngineError            the shared engine process failed or cannot be reached
    │       └── EngineSetupError   its folder is unsafe, or it speaks another protocol
    ├── DocumentError              unknown document or a position outside it
    ├── SettingsError              a setting has the wrong type or value
    ├── Superseded                 a newer request or an edit took over (answered empty)
    ├── CommandError               `kode sglang-command` arguments describe no valid launch
    └── ServeError                 the team server refuses a request (carries the status)
        └── Busy                   429: a key's limit of requests in flight

The LSP layer maps this tree to responses in one place (``lsp/errors.py``); the team
server maps ``ServeError`` to its HTTP answer (``serve/app.py``).
"""

from __future__ import annotations


class KodeError(Exception):
    """Base of every error Kode raises on purpose."""


class ModelError(KodeError):
    """A model file is missing, corrupt or cannot be loaded."""


class ModelPartMissing(ModelError):
    """A PyPI part package of a default model is not installed or is damaged."""


class BackendError(KodeError):
    """A backend could not produce tokens."""


class BackendClosed(BackendError):
    """The window closed the backend under a generation, or asked a closed one: its
    settings changed (another model, another engine) or it is shutting down. The
    request is obsolete, as one a newer request supersedes: answered empty, never shown
    to the user as a failure."""


class ContextOverflow(BackendError):
    """The prompt does not fit the model's context window."""


class PrefillAborted(BackendError):
    """The prompt was only partly evaluated because the generation was cancelled; the
    backend reports the generation as cancelled, so this never reaches a user."""

    def __init__(self, reused: int) -> None:
        super().__init__("prefill aborted")
        self.reused = reused


class RemoteError(BackendError):
    """A remote completion server failed."""


class RemoteAuthError(RemoteError):
    """The remote server refused our credentials (401/403)."""


class RemoteBusyError(RemoteError):
    """The remote server is rate limiting us (429)."""


class RemoteTimeout(RemoteError):
    """The remote server did not answer within the time budget."""


class StreamError(RemoteError):
    """The stream is not a well-formed event stream (garbage, an endless line)."""


class EngineError(BackendError):
    """The shared engine process (``kode engine run``) failed, died or cannot be reached."""


class EngineSetupError(EngineError):
    """The shared engine cannot be used at all: its folder is unsafe (owner, mode), or it
    speaks another protocol version; retrying does not help."""


class DocumentError(KodeError):
    """A request named an unknown document or a position outside it."""


class SettingsError(KodeError):
    """A setting has the wrong type or value."""


class Superseded(KodeError):
    """A newer request for the same document took over (or the document changed): the
    request is answered with no suggestion, and nothing is shown."""


class CommandError(KodeError):
    """The arguments of ``kode sglang-command`` do not describe a valid launch."""


class ServeError(KodeError):
    """A request the team server refuses, with the HTTP status to answer."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


class Busy(ServeError):
    """The key has as many requests in flight as its limit allows (429)."""

    def __init__(self, message: str) -> None:
        super().__init__(429, message, "rate_limit_error")


def describe(exc: BaseException) -> str:
    """An exception in words safe for a log or the editor: Kode's own errors say what
    went wrong without quoting code; anything else is named by its type only, since its
    text may quote source code (a UnicodeEncodeError quotes the whole prompt)."""
    return str(exc) if isinstance(exc, KodeError) else type(exc).__name__
