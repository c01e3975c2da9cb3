"""run_code's language enum is learnt from the sandbox at the first tools/list (once per
server), through the SDK's in-process client; a failure to ask leaves it a string."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from mcp import Client

from kernel_sandbox.errors import ConfigError
from kernel_sandbox.mcp.server import build_mcp_server


class FakeSandbox:
    def __init__(self, languages: list[str]) -> None:
        self._languages = languages
        self.asked = 0

    async def languages(self) -> list[str]:
        self.asked += 1
        return self._languages


class OneSandbox:
    def __init__(self, sandbox: Any) -> None:
        self.sandbox_ = sandbox
        self.opened = 0

    @contextlib.asynccontextmanager
    async def sandbox(self, ctx: Any, sandbox_id: str | None) -> AsyncIterator[Any]:
        self.opened += 1
        if isinstance(self.sandbox_, Exception):
            raise self.sandbox_
        yield self.sandbox_


def _run_code(tools: Any) -> Any:
    return next(t for t in tools if t.name == "run_code")


def _language(tools: Any) -> dict[str, Any]:
    """The string branch of run_code's ``language`` schema."""
    return _run_code(tools).input_schema["properties"]["language"]["anyOf"][0]  # type: ignore[no-any-return]


async def test_the_first_tools_list_learns_the_images_languages_once() -> None:
    fake = FakeSandbox(["bash", "javascript", "python", "r"])
    source = OneSandbox(fake)
    server = build_mcp_server(source)
    async with Client(server) as client:
        for _ in range(2):
            tool = _run_code((await client.list_tools()).tools)
            language = tool.input_schema["properties"]["language"]
            assert language["anyOf"][0]["enum"] == ["bash", "javascript", "python", "r"]
            assert "One of: bash, javascript, python, r." in language["description"]
            assert "bash, javascript, python, r (" in (tool.description or "")
            assert "state" in (tool.description or "").lower()
    assert fake.asked == 1 and source.opened == 1
    names = {t.name for t in (await server.list_tools())}
    assert {"create_context", "list_contexts", "restart_context", "remove_context"} <= names
    assert {"run_python", "run_shell"} <= names


async def test_a_sandbox_that_cannot_be_asked_leaves_language_a_string() -> None:
    source = OneSandbox(ConfigError("no such image"))
    async with Client(build_mcp_server(source)) as client:
        tool = _run_code((await client.list_tools()).tools)
        assert "enum" not in tool.input_schema["properties"]["language"]["anyOf"][0]
        failed = await client.call_tool("run_code", {"code": "1", "language": "r"})
        assert failed.is_error and "no such image" in failed.content[0].text  # type: ignore[union-attr]


class SlowSandbox(FakeSandbox):
    def __init__(self) -> None:
        super().__init__(["python", "r"])
        self.release = asyncio.Event()

    async def languages(self) -> list[str]:
        await self.release.wait()
        return await super().languages()


async def test_a_listing_does_not_wait_for_another_callers_sandbox() -> None:
    """Over HTTP the first lister's sandbox may be another key's: nobody queues behind it."""
    slow = SlowSandbox()
    server = build_mcp_server(OneSandbox(slow))
    async with Client(server) as first, Client(server) as second:
        waiting = asyncio.ensure_future(first.list_tools())
        await asyncio.sleep(0.2)  # the first listing is asking the sandbox now
        other = await asyncio.wait_for(second.list_tools(), 5)
        assert (
            "enum" not in _run_code(other.tools).input_schema["properties"]["language"]["anyOf"][0]
        )
        slow.release.set()
        assert _language((await waiting).tools)["enum"] == ["python", "r"]
