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

import fnmatch
from typing import Any

from pydantic import ValidationError

from ..config import parse_size
from ..errors import ConfigError
from ..manager import DockerSandboxConfig
from ..network.ceiling import cap_network, requested_network
from .auth import ANONYMOUS
from .settings import ServerSettings

__all__ = ["TOOL_ALIASES", "client_config"]

#: ms-enclave tool names that are served by one of ours (docker_notebook's executor).
TOOL_ALIASES = {"notebook_executor": "python_executor"}
#: Fields a client may set; everything else it sends is ignored.
_MAPPED = ("image", "timeout", "working_dir", "env_vars", "memory_limit", "cpu_limit")
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


def _clamp_size(value: Any, maximum: str, field: str) -> str:
    try:
        wanted = parse_size(str(value))
    except ValueError as exc:
        raise ConfigError(f"{field}: {exc}") from None
    return str(value) if wanted <= parse_size(maximum) else maximum


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
    data["tools_config"] = _tools(raw.get("tools_config"))
    data.setdefault("image", settings.default_image)
    image = str(data["image"])
    if not any(fnmatch.fnmatchcase(image, pat) for pat in settings.allowed_images):
        raise ConfigError(
            f"image {image!r} is not allowed on this server (allowed: "
            f"{', '.join(settings.allowed_images)})"
        )
    network, lowered = cap_network(requested_network(raw), settings.network_ceiling(key))
    notes += lowered
    data["network"] = network
    if "memory_limit" in data:
        data["memory_limit"] = _clamp_size(
            data["memory_limit"], settings.max_memory, "memory_limit"
        )
    if raw.get("disk_limit") is not None:
        data["disk_limit"] = _clamp_size(raw["disk_limit"], settings.max_disk, "disk_limit")
    try:
        if "cpu_limit" in data:
            data["cpu_limit"] = min(float(data["cpu_limit"]), settings.max_cpu)
        if "timeout" in data:
            data["timeout"] = min(float(data["timeout"]), settings.max_timeout)
    except (TypeError, ValueError):
        raise ConfigError("cpu_limit and timeout must be numbers") from None
    try:
        return DockerSandboxConfig.model_validate(data), notes
    except ValidationError as exc:
        raise ConfigError(f"invalid sandbox configuration: {exc}") from None
