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
    │   │   └── RemoteTimeout      no answer within the time budget
    │   └── EngineError            the shared engine process failed or cannot be reached
    │       └── EngineSetupError   its folder is unsafe, or it speaks another protocol
    ├── DocumentError              unknown document or a position outside it
    └── SettingsError              a setting has the wrong type or value

The LSP layer maps this tree to responses in one place (``lsp/errors.py``).
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


class EngineError(BackendError):
    """The shared engine process (``kode engine run``) failed, died or cannot be reached."""


class EngineSetupError(EngineError):
    """The shared engine cannot be used at all: its folder is unsafe (owner, mode), or it
    speaks another protocol version; retrying does not help."""


class DocumentError(KodeError):
    """A request named an unknown document or a position outside it."""


class SettingsError(KodeError):
    """A setting has the wrong type or value."""


def describe(exc: BaseException) -> str:
    """An exception in words safe for a log or the editor: Kode's own errors say what
    went wrong without quoting code; anything else is named by its type only, since its
    text may quote source code (a UnicodeEncodeError quotes the whole prompt)."""
    return str(exc) if isinstance(exc, KodeError) else type(exc).__name__
