"""Results on the wire: ``Execution``, ``CommandResult`` and ``FileInfo`` as JSON and back.

The native API and :class:`~kernel_sandbox.client.remote.RemoteSandbox` share these, so
a remote caller gets the very result types a local one does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from .results import CommandResult, Execution, ExecutionError, FileInfo

__all__ = [
    "command_from",
    "dumps",
    "execution_from",
    "file_info_from",
    "to_json",
]


def dumps(value: Any) -> bytes:
    """JSON bytes of results, their dataclasses and nbformat outputs, at C speed."""
    return orjson.dumps(value)


def to_json(value: Execution | CommandResult | FileInfo) -> dict[str, Any]:
    """A result dataclass as a JSON object (nbformat outputs stay as they are)."""
    return dataclasses.asdict(value)


def execution_from(data: dict[str, Any]) -> Execution:
    """The :class:`Execution` a JSON object describes."""
    fields = {f.name for f in dataclasses.fields(Execution)}
    values = {k: v for k, v in data.items() if k in fields}
    if values.get("error"):
        values["error"] = ExecutionError(**values["error"])
    return Execution(**values)


def command_from(data: dict[str, Any]) -> CommandResult:
    """The :class:`CommandResult` a JSON object describes."""
    fields = {f.name for f in dataclasses.fields(CommandResult)}
    return CommandResult(**{k: v for k, v in data.items() if k in fields})


def file_info_from(data: dict[str, Any]) -> FileInfo:
    """The :class:`FileInfo` a JSON object describes."""
    fields = {f.name for f in dataclasses.fields(FileInfo)}
    return FileInfo(**{k: v for k, v in data.items() if k in fields})
