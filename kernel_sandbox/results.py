"""What a sandbox hands back: values, never exceptions, for whatever user code did.

``Execution.outputs`` are nbformat v4 output dicts, exactly as a notebook stores them,
so they can be recorded, rendered or replayed without conversion.  ``Execution.text``
is the compact view for a language model: streams, result text, an error summary and
images *named* rather than dumped.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "BINARY_PREFIXES",
    "CommandResult",
    "Execution",
    "ExecutionError",
    "ExecutionStatus",
    "FileInfo",
    "decoded_size",
    "format_size",
    "output_text",
    "strip_ansi",
]

ExecutionStatus = Literal["ok", "error", "timeout", "kernel_died"]
Output = dict[str, Any]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
#: MIME types that are named in text views, never inlined.
BINARY_PREFIXES = ("image/", "application/pdf", "video/", "audio/")


def strip_ansi(text: str) -> str:
    """Remove terminal colour codes (IPython colours its tracebacks)."""
    return _ANSI.sub("", text)


@dataclass(frozen=True)
class ExecutionError:
    """An exception raised by user code: data, not a Python exception on the host."""

    ename: str
    evalue: str
    traceback: list[str] = field(default_factory=list)

    @property
    def summary(self) -> str:
        """``Name: value`` in one line, for logs and compact views."""
        return f"{self.ename}: {self.evalue}" if self.evalue else self.ename


@dataclass(frozen=True)
class Execution:
    """The result of one ``run_python`` call.

    ``status`` is ``ok``, ``error`` (user code raised), ``timeout`` (interrupted; see
    ``state_lost``) or ``kernel_died`` (crash or out of memory; the kernel was restarted
    and every variable is gone).  ``message`` explains anything that is not ``ok`` in
    plain words.
    """

    status: ExecutionStatus
    outputs: list[Output] = field(default_factory=list)
    execution_count: int | None = None
    error: ExecutionError | None = None
    duration: float = 0.0
    state_lost: bool = False
    message: str = ""
    #: Bytes of output dropped by ``SandboxConfig.max_output_bytes`` (0: nothing was).
    truncated_bytes: int = 0
    #: Display id -> positions in ``outputs`` of the outputs showing it (Jupyter's
    #: ``transient.display_id``, which nbformat does not store).
    display_ids: dict[str, list[int]] = field(default_factory=dict)
    #: Display id -> the newest ``{"data", "metadata"}`` this call sent for it: what a
    #: notebook front end applies to outputs of *earlier* cells with that id.
    display_updates: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when the code ran to the end without raising."""
        return self.status == "ok"

    @property
    def stdout(self) -> str:
        """Everything the code printed to stdout."""
        return "".join(o["text"] for o in self.outputs if o.get("name") == "stdout")

    @property
    def stderr(self) -> str:
        """Everything the code printed to stderr."""
        return "".join(o["text"] for o in self.outputs if o.get("name") == "stderr")

    @property
    def result(self) -> Output | None:
        """The ``execute_result`` output (value of the last expression), if any."""
        return next((o for o in self.outputs if o["output_type"] == "execute_result"), None)

    def images(self, mime: str = "image/png") -> list[bytes]:
        """Decoded images of one MIME type, in output order."""
        found = []
        for out in self.outputs:
            data = out.get("data", {})
            if mime in data:
                found.append(base64.b64decode(data[mime]))
        return found

    @property
    def text(self) -> str:
        """Compact text for a language model or a terminal."""
        parts = [output_text(o) for o in self.outputs]
        if self.message:
            parts.append(f"[{self.message}]")
        return "\n".join(p for p in parts if p).strip("\n")


def format_size(n: int) -> str:
    """A byte count for people and models: ``512 B``, ``23.4 KB``, ``1.2 MB``, ``2.0 GB``."""
    if n < 1024:
        return f"{n} B"
    if n < 1024**2:
        return f"{n / 1024:.1f} KB"
    if n < 1024**3:
        return f"{n / 1024**2:.1f} MB"
    return f"{n / 1024**3:.1f} GB"


def decoded_size(payload: Any) -> int:
    """Bytes of a MIME bundle value (base64 text for binary types)."""
    if isinstance(payload, str):
        try:
            return len(base64.b64decode(payload, validate=False))
        except ValueError:
            return len(payload.encode())
    if isinstance(payload, bytes):
        return len(payload)
    return len(json.dumps(payload, default=str).encode())


def _name_binary(mime: str, payload: Any) -> str:
    return f"<{mime}, {format_size(decoded_size(payload))}>"


def output_text(output: Output, name_binary: Callable[[str, Any], str] = _name_binary) -> str:
    """One output as text: streams verbatim, rich data by its plain view, binaries named.

    ``name_binary(mime, payload)`` gives the text that stands for a binary value.
    """
    kind = output["output_type"]
    if kind == "stream":
        return str(output["text"]).rstrip("\n")
    if kind == "error":
        tb = strip_ansi("\n".join(output.get("traceback", [])))
        return tb or f"{output['ename']}: {output['evalue']}"
    data: dict[str, Any] = output.get("data", {})
    binaries = [name_binary(m, v) for m, v in data.items() if m.startswith(BINARY_PREFIXES)]
    plain = data.get("text/plain")
    if isinstance(plain, list):
        plain = "".join(plain)
    if binaries:
        # "<Figure size 640x480 with 1 Axes>" is useful next to the image's name.
        return " ".join(binaries + ([str(plain)] if plain else []))
    if plain is not None:
        return str(plain)
    if data:
        mime = next(iter(data))
        return f"<{mime}>"
    return ""


@dataclass(frozen=True)
class CommandResult:
    """The result of one shell command run beside the kernel."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    duration: float = 0.0
    #: Bytes of stdout and stderr dropped by ``SandboxConfig.max_output_bytes``.
    truncated_bytes: int = 0

    @property
    def ok(self) -> bool:
        """True when the command exited with status 0."""
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class FileInfo:
    """One entry of a directory listing inside the sandbox."""

    name: str
    type: Literal["file", "directory", "symlink", "other"]
    size: int
