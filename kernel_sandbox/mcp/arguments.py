"""Arguments several MCP tools take, each with what the model is told about it."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

__all__ = ["SandboxId", "Timeout"]

SandboxId = Annotated[
    str | None,
    Field(
        description="Run in this sandbox of your API key (one create_sandbox returned; HTTP "
        "only). Default: the MCP session's sandbox, else the key's default sandbox."
    ),
]
Timeout = Annotated[float | None, Field(description="Seconds before the call is interrupted.")]
