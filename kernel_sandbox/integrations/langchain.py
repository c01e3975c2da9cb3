"""LangChain: a sandbox's tools as ``langchain-core`` tools.

``sandbox_tools(sandbox)`` gives one :class:`SandboxTool` per enabled tool
(``python_executor``, ``shell_executor``, ``file_operation``) for ``create_agent``,
LangGraph's ``create_react_agent``, ``model.bind_tools`` or any other LangChain runner.
Their argument schemas and descriptions are the toolset's own; every call goes through
:meth:`~kernel_sandbox.tools.ToolSet.execute`, so bad arguments, failing code and a
dead sandbox come back as results the model reads, never as exceptions in the graph.

A tool answers with ``response_format="content_and_artifact"``: the content is the
result's compact JSON followed by each image as a standard ``image`` content block
(which ``langchain-openai`` sends as ``image_url`` parts), and the artifact is the full
:class:`~kernel_sandbox.tools.ToolResult` — kept on the ``ToolMessage`` for the program,
never sent to the model.  A call that failed (the cell raised, the command exited
non-zero, the arguments were wrong, it timed out) comes back as a ``ToolMessage`` with
``status="error"``, langchain-core's mark of a failed tool call, which LangGraph and
LangSmith read; the model still gets the result's JSON, traceback included.

Both LangChain call styles work on a blocking :class:`~kernel_sandbox.Sandbox`
(``invoke`` and ``ainvoke``); an :class:`~kernel_sandbox.AsyncSandbox` lives on its
own event loop and takes ``ainvoke`` only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Literal

from .._extras import require_extra

with require_extra("langchain", "kernel_sandbox.integrations.langchain"):
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import BaseTool
    from pydantic import ConfigDict, Field

from ..protocols import SandboxLike
from ..sync import Sandbox, _portal, as_async
from ..tools import ToolResult, ToolSet
from ..tools.base import ToolsConfig

__all__ = ["SandboxTool", "content_blocks", "sandbox_tools"]


def content_blocks(result: ToolResult) -> list[dict[str, Any]]:
    """What the model reads of a result: its JSON as text, then each image it can see."""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": result.model_dump_json()}]
    for part in result.image_parts():
        mime, _, data = part["image_url"]["url"].removeprefix("data:").partition(";base64,")
        blocks.append({"type": "image", "base64": data, "mime_type": mime})
    return blocks


class SandboxTool(BaseTool):
    """One kernel_sandbox tool as a LangChain tool (made by :func:`sandbox_tools`)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    response_format: Literal["content", "content_and_artifact"] = "content_and_artifact"
    #: The toolset the call runs through (bound to one sandbox).
    toolset: ToolSet = Field(exclude=True)
    #: True when the sandbox is a blocking ``Sandbox``, whose async twin lives on the
    #: process's portal loop: calls are handed to that loop from any thread or loop.
    on_portal: bool = Field(default=False, exclude=True)

    def _run(self, **arguments: Any) -> tuple[list[dict[str, Any]], ToolResult]:
        if not self.on_portal:
            raise TypeError(
                f"{self.name} runs on an AsyncSandbox: call it with ainvoke (or an async "
                "agent), or pass a blocking kernel_sandbox.Sandbox to sandbox_tools for invoke"
            )
        call = self.toolset.execute(self.name, arguments)
        result = asyncio.run_coroutine_threadsafe(call, _portal()).result()
        return content_blocks(result), result

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return _mark_failure(super().run(*args, **kwargs))

    async def arun(self, *args: Any, **kwargs: Any) -> Any:
        return _mark_failure(await super().arun(*args, **kwargs))

    async def _arun(self, **arguments: Any) -> tuple[list[dict[str, Any]], ToolResult]:
        call = self.toolset.execute(self.name, arguments)
        if self.on_portal:
            result = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call, _portal()))
        else:
            result = await call
        return content_blocks(result), result


def _mark_failure(output: Any) -> Any:
    """A tool call's ``ToolMessage`` with ``status="error"`` when its result failed.

    langchain-core sets that status only for a raised ``ToolException``, which would
    drop the artifact and the structured content; the result is kept whole here.
    """
    if (
        isinstance(output, ToolMessage)
        and isinstance(output.artifact, ToolResult)
        and not output.artifact.ok
    ):
        output.status = "error"
    return output


def sandbox_tools(
    sandbox: SandboxLike | Sandbox, tools_config: ToolsConfig | None = None
) -> list[BaseTool]:
    """The sandbox's tools as LangChain tools, one per enabled tool.

    ``tools_config`` is :class:`~kernel_sandbox.tools.ToolSet`'s (``{"python_executor":
    {"timeout": 60}}`` enables only that tool); without it every built-in tool is there.
    Bad options raise :class:`~kernel_sandbox.errors.ConfigError`.
    """
    toolset = ToolSet(as_async(sandbox), tools_config)
    schemas: Mapping[str, Any] = toolset.schema_map("chat", strict=False)
    return [
        SandboxTool(
            name=name,
            description=schemas[name]["function"]["description"],
            args_schema=schemas[name]["function"]["parameters"],
            toolset=toolset,
            on_portal=isinstance(sandbox, Sandbox),
        )
        for name in toolset.names
    ]
