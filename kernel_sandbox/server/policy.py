"""Server-side policy: a client's sandbox configuration, mapped and clamped.

ms-enclave's client sends every default of its own ``DockerSandboxConfig``
(``image: python:3.11-slim``, ``memory_limit: 4g``, ``network_enabled: true``,
``privileged: false``, ``ports``, ``entrypoint``, ...).  What has a meaning here is
mapped; the rest is ignored.  The server's settings win: the network is lowered to the
key's maximum (``ServerSettings.network_ceiling``: "none" unless the operator says;
ms-enclave's ``network: bridge`` names a Docker network and means nothing here), limits
are clamped to its maxima, host directories are never mounted, images must match the
allowed patterns.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from ..errors import ConfigError
from ..limits import MIN_DISK_BYTES, MIN_MEMORY_BYTES, parse_positive, parse_size
from ..manager import DockerSandboxConfig
from ..network.ceiling import cap_network, requested_network
from ..tools.base import available_tools
from .auth import ANONYMOUS
from .image_policy import image_allowed
from .settings import ServerSettings

__all__ = ["TOOL_ALIASES", "client_config"]

#: ms-enclave tool names that are served by one of ours (docker_notebook's executor).
TOOL_ALIASES = {"notebook_executor": "python_executor"}
#: Fields a client may set; everything else it sends is ignored.
_MAPPED = (
    "image",
    "timeout",
    "working_dir",
    "env_vars",
    "memory_limit",
    "cpu_limit",
    "exact_snapshots",
)
_ALL_TOOLS: dict[str, dict[str, Any]] = {
    "python_executor": {},
    "shell_executor": {},
    "file_operation": {},
}


def _tools(value: Any) -> dict[str, Any]:
    if value is None:
        return dict(_ALL_TOOLS)
    if isinstance(value, list | tuple):
        value = {str(name): {} for name in value}
    if not isinstance(value, dict):
        raise ConfigError("tools_config must be a list of tool names or a dict of options")
    return {TOOL_ALIASES.get(str(k), str(k)): ({} if v is None else v) for k, v in value.items()}


def _clamp_limits(data: dict[str, Any], raw: dict[str, Any], settings: ServerSettings) -> list[str]:
    """Every limit of ``data`` at or under the server's maxima, asked for or not.

    A field the client left out gets the sandbox default, and that default is clamped
    too: ``--max-memory 128m`` holds for a client that never names a memory limit.
    Values are parsed by :mod:`kernel_sandbox.limits` (zero, NaN and infinity refused).
    """
    notes: list[str] = []
    defaults = DockerSandboxConfig.model_fields
    sizes = {"memory_limit": settings.max_memory, "disk_limit": settings.max_disk}
    for field, maximum in sizes.items():
        value = raw.get(field) if field == "disk_limit" else data.get(field)
        value = defaults[field].default if value is None else value  # disk None: bounded
        least = MIN_DISK_BYTES if field == "disk_limit" else MIN_MEMORY_BYTES
        try:
            wanted = parse_size(value, field, least)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if wanted > parse_size(maximum):
            data[field] = maximum
            if raw.get(field) is not None:
                notes.append(f"{field} lowered to the server's maximum {maximum}")
        else:
            data[field] = str(value).strip().lower()
    numbers = {"cpu_limit": settings.max_cpu, "timeout": settings.max_timeout}
    for field, ceiling in numbers.items():
        value = data.get(field, defaults[field].default)
        try:
            wanted_number = parse_positive(value, field)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        data[field] = min(wanted_number, ceiling)
        if wanted_number > ceiling and raw.get(field) is not None:
            notes.append(f"{field} lowered to the server's maximum {ceiling:g}")
    return notes


def _clamp_tool_timeouts(tools: dict[str, Any], settings: ServerSettings) -> dict[str, Any]:
    """``timeout``/``max_timeout`` of every tool's options at or under ``--max-timeout``.

    A tool call's own ``timeout`` is bounded by its tool's ``max_timeout``, so bounding
    that option here bounds ``/sandbox/tool/execute`` and ``/pool/execute`` too.
    """
    registry = available_tools()
    out: dict[str, Any] = {}
    for name, options in tools.items():
        cls = registry.get(name)
        fields = cls.Options.model_fields if cls is not None else {}
        if not isinstance(options, dict) or "max_timeout" not in fields:
            out[name] = options
            continue
        options = dict(options)
        for option in ("timeout", "max_timeout"):
            if options.get(option) is None:
                continue
            try:
                options[option] = min(parse_positive(options[option], option), settings.max_timeout)
            except ValueError as exc:
                raise ConfigError(f"tools_config[{name!r}]: {exc}") from None
        options.setdefault("max_timeout", settings.max_timeout)
        out[name] = options
    return out


def client_config(
    raw: Any, settings: ServerSettings, key: str = ANONYMOUS
) -> tuple[DockerSandboxConfig, list[str]]:
    """The sandbox a client may have, and notes on what the policy changed.

    Raises ``ConfigError`` (a 400) for what cannot be honoured at all: host volumes,
    ``privileged``, an image the server does not allow, malformed values.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError("the sandbox configuration must be a JSON object")
    notes: list[str] = []
    if raw.get("privileged"):
        raise ConfigError("privileged sandboxes are never created by this server")
    if raw.get("volumes"):
        raise ConfigError(
            "this server mounts no host directories into sandboxes; upload files with "
            "file_operation or POST /sandbox/{id}/archive instead of volumes"
        )
    data: dict[str, Any] = {k: raw[k] for k in _MAPPED if raw.get(k) is not None}
    data["tools_config"] = _clamp_tool_timeouts(_tools(raw.get("tools_config")), settings)
    data.setdefault("image", settings.default_image)
    image = str(data["image"])
    if not image_allowed(image, settings.allowed_images):
        raise ConfigError(
            f"image {image!r} is not allowed on this server (allowed: "
            f"{', '.join(settings.allowed_images)})"
        )
    data["derive_image"] = settings.derive
    data["pull_image"] = settings.pull == "allowed"
    network, lowered = cap_network(requested_network(raw), settings.network_ceiling(key))
    notes += lowered
    data["network"] = network
    notes += _clamp_limits(data, raw, settings)
    try:
        return DockerSandboxConfig.model_validate(data), notes
    except ValidationError as exc:
        raise ConfigError(f"invalid sandbox configuration: {exc}") from None
