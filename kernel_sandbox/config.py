"""Sandbox configuration: one validated, immutable value per sandbox.

Defaults are the safe ones: no network, a non-root user, every Linux capability
dropped, ``no-new-privileges`` and resource limits.  Loosen them one field at a time.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .limits import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_OUTPUT_BYTES

__all__ = ["DEFAULT_IMAGE", "KERNEL_PYTHON", "LABEL_PREFIX", "SandboxConfig"]

DEFAULT_IMAGE = "kernel-sandbox:datascience"
#: Interpreter with ipykernel inside every kernel-ready image (see ``images/``).
KERNEL_PYTHON = "/opt/venv/bin/python"
#: Prefix of every label kernel_sandbox puts on containers and images.
LABEL_PREFIX = "kernel-sandbox"

_MEMORY = re.compile(r"^\d+(\.\d+)?[bkmg]?$", re.IGNORECASE)


class SandboxConfig(BaseModel):
    """Everything that decides how a sandbox container is started.

    ``volumes`` uses the docker SDK's form ``{host_path: {"bind": path, "mode": "rw"}}``.
    ``timeout`` is the default per-execution timeout in seconds for ``run_python`` and
    ``run_shell``; a call may pass its own.

    ``max_output_bytes`` bounds what one call keeps in host memory, whatever the code
    prints: a cell's stream text (stdout and stderr together) and, separately, its rich
    outputs (display data, results); a shell command's stdout and, separately, its
    stderr.  Text over the cap keeps its first and last halves around a marker line
    saying how much was dropped; rich outputs over it are replaced by one placeholder;
    ``Execution.truncated_bytes`` / ``CommandResult.truncated_bytes`` count the rest.
    ``max_file_bytes`` is the largest file ``sandbox.files.read`` brings to the host;
    larger ones are refused with a :class:`~kernel_sandbox.errors.FileOperationError`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str = DEFAULT_IMAGE
    network_enabled: bool = False
    memory_limit: str = "1g"
    cpu_limit: float = Field(default=1.0, gt=0)
    pids_limit: int = Field(default=256, ge=16)
    user: str = "sandbox"
    working_dir: str = "/sandbox"
    env_vars: dict[str, str] = Field(default_factory=dict)
    volumes: dict[str, dict[str, str]] = Field(default_factory=dict)
    timeout: float = Field(default=30.0, gt=0)
    labels: dict[str, str] = Field(default_factory=dict)
    transport: Literal["ipc", "tcp"] = "ipc"
    startup_timeout: float = Field(default=30.0, gt=0)
    interrupt_grace: float = Field(
        default=2.0, gt=0, description="Seconds to wait after an interrupt before restarting."
    )
    max_output_bytes: int = Field(
        default=DEFAULT_MAX_OUTPUT_BYTES,
        gt=0,
        description="Output bytes one call keeps; the middle of longer output is dropped.",
    )
    max_file_bytes: int = Field(
        default=DEFAULT_MAX_FILE_BYTES,
        gt=0,
        description="Largest file files.read brings to the host; larger ones are refused.",
    )
    derive_image: bool = Field(
        default=True,
        description="Derive a kernel-ready image from a plain Python image when needed.",
    )

    @field_validator("memory_limit")
    @classmethod
    def _check_memory(cls, value: str) -> str:
        if not _MEMORY.match(value.strip()):
            raise ValueError(
                f"memory_limit={value!r} is not a size; use a number with b, k, m or g, e.g. '512m'"
            )
        return value.strip().lower()

    @field_validator("working_dir")
    @classmethod
    def _check_working_dir(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"working_dir={value!r} must be an absolute path inside the sandbox")
        return value

    @field_validator("volumes")
    @classmethod
    def _check_volumes(cls, value: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        for host, spec in value.items():
            if "bind" not in spec:
                raise ValueError(f"volumes[{host!r}] needs a 'bind' path, e.g. {{'bind': '/data'}}")
            if spec.get("mode", "rw") not in ("rw", "ro"):
                raise ValueError(f"volumes[{host!r}]['mode'] must be 'rw' or 'ro'")
        return value

    def with_overrides(self, **overrides: Any) -> SandboxConfig:
        """Return a validated copy with some fields changed."""
        if not overrides:
            return self
        return type(self).model_validate({**self.model_dump(), **overrides})
