"""Sandbox configuration: one validated, immutable value per sandbox.

Defaults are the safe ones: no network, a non-root user, every Linux capability
dropped, ``no-new-privileges`` and resource limits.  Loosen them one field at a time.
"""

from __future__ import annotations

import os
import posixpath
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .errors import ConfigError
from .limits import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_OUTPUT_BYTES,
    MIN_DISK_BYTES,
    MIN_MEMORY_BYTES,
    parse_positive,
    parse_size,
)

__all__ = [
    "DEFAULT_IMAGE",
    "DISK_SHARES",
    "KERNEL_PYTHON",
    "LABEL_PREFIX",
    "PING_TIMEOUT",
    "RUNTIME_ENV",
    "SandboxConfig",
    "describe_invalid",
    "parse_size",
]

DEFAULT_IMAGE = "kernel-sandbox:datascience"
#: Seconds ``AsyncSandbox.ping`` waits for the kernel by default (here, below the sandbox,
#: so a client that mirrors the sandbox's API can share it without importing the sandbox).
PING_TIMEOUT = 5.0
#: Interpreter with ipykernel inside every kernel-ready image (see ``images/``).
KERNEL_PYTHON = "/opt/venv/bin/python"
#: Environment variable that gives ``SandboxConfig.runtime`` its default (e.g. ``runsc``).
RUNTIME_ENV = "KERNEL_SANDBOX_RUNTIME"
#: Prefix of every label kernel_sandbox puts on containers and images.
LABEL_PREFIX = "kernel-sandbox"
#: Where the per-sandbox run directory (the kernel's sockets and the supervisor's
#: state) is mounted inside the container (``ipc``).
CONTAINER_RUN_DIR = "/run/kernel-sandbox"
#: The supervisor's state directory inside the container with the tcp transport.
TCP_STATE_DIR = "/tmp/kernel-sandbox"

#: How ``disk_limit`` is shared out between the writable places of a sandbox.  The
#: working directory gets half; $HOME a quarter (IPython and matplotlib caches,
#: ``pip install --user``); /tmp and /dev/shm the rest.  The shares add up to 1, so the
#: sandbox can never write more than ``disk_limit`` in total.
DISK_SHARES = {"working_dir": 8 / 16, "home": 4 / 16, "tmp": 3 / 16, "shm": 1 / 16}


class SandboxConfig(BaseModel):
    """Everything that decides how a sandbox container is started.

    ``volumes`` uses the docker SDK's form ``{host_path: {"bind": path, "mode": "rw"}}``.
    ``timeout`` is the default per-execution timeout in seconds for ``run_python`` and
    ``run_shell``; a call may pass its own.

    ``disk_limit`` bounds everything the sandbox can write.  The root filesystem is
    read-only; the only writable places are the working directory, $HOME, /tmp and
    /dev/shm, each an in-memory filesystem with its share of ``disk_limit`` (see
    :data:`DISK_SHARES`), plus the caller's own ``volumes`` (not bounded by it).  A
    write past a share fails with ENOSPC.  The writable area lives in memory and counts
    toward ``memory_limit``: the default of 512m leaves the kernel at least half of the
    default 1g even when the sandbox is full; with ``memory_limit`` at or below
    ``disk_limit``, a full writable area gets the kernel OOM-killed before any write
    sees ENOSPC.  ``None`` turns the bound off: the root filesystem is then writable and
    unbounded, as in a plain container.

    ``max_output_bytes`` bounds what one call keeps in host memory, whatever the code
    prints: a cell's stream text (stdout and stderr together) and, separately, its rich
    outputs (display data, results) and, separately, its errors; a shell command's
    stdout and, separately, its stderr.  Text over the cap keeps its first and last
    halves around a marker line saying how much was dropped; rich outputs over it are
    replaced by one placeholder; a long error keeps its ends;
    ``Execution.truncated_bytes`` / ``CommandResult.truncated_bytes`` count the rest.
    It also sets the largest message the host reads from the kernel (``max_output_bytes``
    + 1 MiB): a larger one is dropped unread and the result says output was lost.
    ``max_file_bytes`` is the largest file ``sandbox.files.read`` brings to the host;
    larger ones are refused with a :class:`~kernel_sandbox.errors.FileOperationError`.

    ``runtime`` names one of the engine's OCI runtimes; ``"runsc"`` runs the sandbox
    under gVisor, a second wall between sandboxed code and the host's kernel (see
    :mod:`kernel_sandbox.backends.docker.runtimes` for what it needs and what changes there).
    Its default comes from ``$KERNEL_SANDBOX_RUNTIME``, else the engine's own default.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    def __init__(self, **data: Any) -> None:
        """Validate the settings; a bad one raises :class:`ConfigError` saying which and why.

        pydantic's own ``ValidationError`` is not a ``SandboxError``, so ``except
        SandboxError`` would miss it; it stays attached as ``__cause__``.
        """
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError(describe_invalid(exc, type(self).__name__)) from exc

    image: str = DEFAULT_IMAGE
    kernel: str = Field(
        default="python3",
        pattern=r"^[A-Za-z0-9._-]{1,64}$",
        description=(
            "The kernelspec the sandbox's default kernel runs, by name in the image "
            "('python3', 'ir', 'deno', 'bash', ...; `kernel-sandbox images` lists them)."
        ),
    )
    network: Literal["none", "packages", "full"] | list[str] = Field(
        default="none",
        description=(
            "What the sandbox may reach: 'none' (only lo), 'packages' (the host pip's "
            "index, through the host's egress proxy), a list of host patterns such as "
            "['files.example.org', '*.example.com:443', 'packages'], or 'full' (a bridge)."
        ),
    )
    network_enabled: bool = Field(
        default=False, description="Alias: True is network='full'; kept for ms-enclave's API."
    )
    ca_bundle: str | None = Field(
        default=None,
        description=(
            "CA bundle (a host path) the sandbox trusts for egress under 'packages' or a "
            "list; default: pip's `cert` setting, if any."
        ),
    )
    memory_limit: str = "1g"
    disk_limit: str | None = "512m"
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
    runtime: str | None = Field(
        default_factory=lambda: os.environ.get(RUNTIME_ENV) or None,
        description="The engine's OCI runtime ('runsc': gVisor); None: the engine's default.",
    )
    exact_snapshots: bool = Field(
        default=False,
        description=(
            "Make the sandbox ready for exact snapshots (its whole memory, by gVisor's "
            "checkpoint): needs runtime='runsc', transport='ipc', network='none' and an "
            "engine that allows checkpoints; its writable places live in its memory."
        ),
    )
    derive_image: bool = Field(
        default=True,
        description="Derive a kernel-ready image from a plain Python image when needed.",
    )
    pull_image: bool = Field(
        default=True,
        description="Pull the image from its registry when the engine does not have it "
        "(False: refuse it with ImageNotFoundError; a server's --pull never).",
    )
    host: str = Field(
        default_factory=lambda: os.environ.get("KERNEL_SANDBOX_HOST") or "docker",
        description=(
            "The kernel host that runs the sandbox, by entry-point name "
            "(kernel_sandbox.hosts: docker, local, kubernetes, ...); the default is "
            "$KERNEL_SANDBOX_HOST, else docker."
        ),
    )
    namespace: str | None = Field(
        default=None,
        description=(
            "Kubernetes namespace of the sandbox's pod (kubernetes host only); None: "
            "$KERNEL_SANDBOX_NAMESPACE, else the pod's own namespace, else the kubeconfig's."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _network_alias(cls, data: Any) -> Any:
        """``network_enabled`` and ``network`` say the same thing; keep them in step."""
        if not isinstance(data, dict):
            return data
        enabled, network = data.get("network_enabled"), data.get("network")
        if network is None:
            return {**data, "network": "full" if enabled else "none"}
        if enabled and network != "full":
            raise ValueError(
                f"network={network!r} and network_enabled=True disagree; "
                "give only network= (network_enabled=True means network='full')"
            )
        return {**data, "network_enabled": network == "full"}

    @field_validator("network")
    @classmethod
    def _check_network(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, str):
            return value
        from .network.policy import parse_pattern  # the policy module knows the patterns

        if not value:
            raise ValueError("network=[] allows nothing; use network='none'")
        for entry in value:
            if entry != "packages":
                try:
                    parse_pattern(entry)
                except ValueError as exc:
                    raise ValueError(f"network={exc}") from None
        return list(value)

    @model_validator(mode="after")
    def _check_exact(self) -> SandboxConfig:
        """An exact-ready sandbox's kernel is reached over ipc and reaches nothing."""
        if self.exact_snapshots and (self.transport != "ipc" or self.network != "none"):
            raise ValueError(
                "exact_snapshots=True needs transport='ipc' and network='none' (a "
                "checkpoint cannot carry the host's sockets: the tcp ports' CURVE or the "
                "egress proxy's); use a portable snapshot for this sandbox"
            )
        return self

    @property
    def egress(self) -> bool:
        """True when the host's egress proxy serves this sandbox ('packages' or a list)."""
        return self.network not in ("none", "full")

    @field_validator("memory_limit", "disk_limit")
    @classmethod
    def _check_size(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None and info.field_name == "disk_limit":
            return None
        field = str(info.field_name)
        least = MIN_DISK_BYTES if field == "disk_limit" else MIN_MEMORY_BYTES
        parse_size(value, field, least)  # ValueError names the field
        return str(value).strip().lower()

    @field_validator("cpu_limit", "timeout", "startup_timeout", "interrupt_grace", mode="before")
    @classmethod
    def _check_positive(cls, value: object, info: ValidationInfo) -> float:
        return parse_positive(value, str(info.field_name))

    @field_validator("working_dir")
    @classmethod
    def _check_working_dir(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"working_dir={value!r} must be an absolute path inside the sandbox")
        path = posixpath.normpath(value)
        for reserved in (CONTAINER_RUN_DIR, TCP_STATE_DIR):
            if path == reserved or path.startswith(reserved + "/"):
                raise ValueError(
                    f"working_dir={value!r} is inside {reserved}, where the kernel's "
                    "connection lives; choose another directory (e.g. /sandbox)"
                )
        return value

    @field_validator("env_vars")
    @classmethod
    def _check_env_vars(cls, value: dict[str, str]) -> dict[str, str]:
        """What no process's environment can hold is refused here, not by the engine."""
        for name, text in value.items():
            if not name or "=" in name or "\0" in name:
                raise ValueError(
                    f"{name[:64]!r} is not an environment variable name "
                    "(empty, or holding '=' or a NUL byte)"
                )
            if "\0" in text:
                raise ValueError(f"the value of {name[:64]!r} holds a NUL byte: no environment can")
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

    def disk_budget(self) -> dict[str, int]:
        """Bytes each writable place may hold (keys of :data:`DISK_SHARES`); {} if unbounded."""
        if self.disk_limit is None:
            return {}
        total = parse_size(self.disk_limit)
        return {place: int(total * share) for place, share in DISK_SHARES.items()}

    def with_overrides(self, **overrides: Any) -> SandboxConfig:
        """Return a validated copy with some fields changed."""
        if not overrides:
            return self
        base = self.model_dump()
        # the alias: overriding one of the pair replaces the other too
        if "network_enabled" in overrides and "network" not in overrides:
            base.pop("network")
        if "network" in overrides and "network_enabled" not in overrides:
            base.pop("network_enabled")
        return type(self)(**{**base, **overrides})


def describe_invalid(exc: ValidationError, what: str) -> str:
    """One line per bad setting of a pydantic error, e.g. ``memory_limit: 'lots' is not...``."""
    problems = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"]) or what
        if error["type"] == "extra_forbidden":
            problems.append(f"{where}: unknown setting (not a field of {what})")
            continue
        message = str(error["msg"]).removeprefix("Value error, ")
        # Our validators name the field themselves ("memory_limit='lots' is not a size").
        problems.append(message if message.startswith(f"{where}=") else f"{where}: {message}")
    return f"invalid {what}: " + "; ".join(problems)
