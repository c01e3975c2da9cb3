"""Sentences shared by the tool descriptions: where files live, what the limits are.

Descriptions are written for a model and depend on the sandbox (working directory,
mounted volumes, network), so they are built per sandbox rather than hard-coded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..protocols import SandboxLike

__all__ = ["limits_text", "where_text"]


def where_text(sandbox: SandboxLike) -> str:
    """Working directory and mounted host directories."""
    cfg = sandbox.config
    text = (
        f"The working directory is {sandbox.working_dir}; relative paths start there and files "
        "persist for the life of the sandbox."
    )
    mounts = [
        f"{spec['bind']} ({'read-only' if spec.get('mode') == 'ro' else 'read-write'})"
        for spec in cfg.volumes.values()
    ]
    if mounts:
        text += f" Host directories mounted: {', '.join(mounts)}."
    return text


def limits_text(sandbox: SandboxLike, timeout: float, max_timeout: float) -> str:
    """Network, memory and timeout, in one or two sentences."""
    cfg = sandbox.config
    from ..network import describe_network  # what the sandbox's network= policy allows

    network = describe_network(cfg.network)
    return (
        f"{network} Memory is limited to {cfg.memory_limit}. A call is stopped after "
        f"{timeout:g} s unless you pass a larger timeout (at most {max_timeout:g} s)."
    )
