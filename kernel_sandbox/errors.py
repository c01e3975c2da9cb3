"""The one exception tree of kernel_sandbox.

Errors in the *user's* code are never exceptions: they are data in
:class:`~kernel_sandbox.results.Execution`.  Exceptions are for mistakes of the
caller and for failures of the machinery underneath::

    SandboxError
    ├── ConfigError(ValueError)          a setting is invalid
    │   └── CapacityError                a server's cap is reached (HTTP 429)
    ├── EngineUnavailableError           the Docker engine cannot be reached
    ├── ImageError                       an image is missing or cannot be built
    │   └── ImageNotFoundError(LookupError)
    ├── SandboxStartError                a container or kernel did not come up
    ├── SandboxClosedError               the sandbox was closed already
    ├── ContainerStoppedError            the container is not running (killed from outside)
    │   └── ContainerRemovedError        the container is gone (removed from outside)
    ├── SandboxNotFoundError(KeyError)   unknown sandbox id (manager API)
    ├── KernelError                      the kernel could not be reached or restarted
    ├── ContextNotFoundError(KeyError)   unknown context id in a sandbox
    ├── MissingExtraError(ModuleNotFoundError)  an optional part is not installed
    ├── AccessDeniedError(PermissionError)  a call without a sandbox's own credential
    ├── SnapshotError                    a snapshot cannot be made, stored or restored
    │   └── SnapshotNotFoundError(KeyError)  no such snapshot (for this owner)
    ├── NotebookError(ValueError)        a notebook file cannot be read or is not valid
    │   └── ResumeDivergedError          resuming: a replayed cell gave another result
    └── FileOperationError(OSError)      a file operation inside the sandbox failed
        ├── SandboxFileNotFoundError(FileNotFoundError)
        └── FileOperationTimeoutError    its process did not finish within its deadline

Each class also inherits the builtin it means, so ``except KeyError`` keeps working.
Messages say what happened and what to change.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AccessDeniedError",
    "CapacityError",
    "ConfigError",
    "ContainerRemovedError",
    "ContainerStoppedError",
    "ContextNotFoundError",
    "EngineUnavailableError",
    "FileOperationError",
    "FileOperationTimeoutError",
    "ImageError",
    "ImageNotFoundError",
    "KernelError",
    "MissingExtraError",
    "NotebookError",
    "ResumeDivergedError",
    "SandboxClosedError",
    "SandboxError",
    "SandboxFileNotFoundError",
    "SandboxNotFoundError",
    "SandboxStartError",
    "SnapshotError",
    "SnapshotNotFoundError",
]


class SandboxError(Exception):
    """Root of every exception raised by kernel_sandbox."""


class ConfigError(SandboxError, ValueError):
    """A configuration value is invalid; the message names the setting."""


class CapacityError(ConfigError):
    """A cap of a server or of an API key is reached (too many sandboxes); retry later."""


class EngineUnavailableError(SandboxError, ConnectionError):
    """The container engine is not running or not reachable."""


class ImageError(SandboxError):
    """An image could not be built, derived or used."""


class ImageNotFoundError(ImageError, LookupError):
    """The requested image does not exist locally and cannot be pulled or built."""


class SandboxStartError(SandboxError):
    """The container or its kernel did not become ready."""


class SandboxClosedError(SandboxError, RuntimeError):
    """An operation was attempted on a sandbox that was closed."""


class ContainerStoppedError(SandboxError):
    """The sandbox's container is not running: something outside stopped or killed it.

    ``run_python`` (or ``restart()``) starts it again; files are kept, variables are not.
    """


class ContainerRemovedError(ContainerStoppedError):
    """The sandbox's container no longer exists (e.g. ``docker rm -f`` from outside).

    Nothing can bring it back: its files and variables are gone; create a new sandbox.
    """


class SandboxNotFoundError(SandboxError, KeyError):
    """No sandbox with this id is known to the manager."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want the sentence
        return str(self.args[0]) if self.args else "sandbox not found"


class KernelError(SandboxError):
    """The kernel could not be reached, interrupted or restarted."""


class ContextNotFoundError(SandboxError, KeyError):
    """The sandbox has no context (kernel) with this id."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want the sentence
        return str(self.args[0]) if self.args else "context not found"


class MissingExtraError(SandboxError, ModuleNotFoundError):
    """A part of kernel_sandbox needs an extra that is not installed; the message names
    the extra and the command that installs it (``pip install 'kernel-sandbox[EXTRA]'``).
    """


class AccessDeniedError(SandboxError, PermissionError):
    """A call into a sandbox without the credential that sandbox was given (for example
    the envd access token of a sandbox made through the E2B API): answered 401."""


class SnapshotError(SandboxError):
    """A snapshot could not be made, stored or restored (over a cap, a digest that does
    not match, a kernel that could not save or load it); the message says which."""


class SnapshotNotFoundError(SnapshotError, KeyError):
    """No snapshot (or paused sandbox) with this id is in the store for this owner."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "snapshot not found"


class NotebookError(SandboxError, ValueError):
    """A notebook file cannot be read, is not nbformat v4, or cannot be exported."""


class ResumeDivergedError(NotebookError):
    """Resuming a session: replaying its notebook gave another result in one cell.

    ``cell`` is the replay's result for that cell (``cell.label``, ``cell.diff``).
    """

    def __init__(self, message: str, cell: Any = None) -> None:
        super().__init__(message)
        self.cell = cell


class FileOperationError(SandboxError, OSError):
    """A file operation inside the sandbox failed."""


class FileOperationTimeoutError(FileOperationError):
    """A process of a file operation (or any host-run process) in the sandbox did not
    finish within its deadline; the host stopped waiting for it.  Not a ``TimeoutError``:
    code that waits with its own timeout tells its own from this one."""


class SandboxFileNotFoundError(FileOperationError, FileNotFoundError):
    """The path does not exist inside the sandbox."""
