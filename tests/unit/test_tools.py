"""Tools on a real sandbox without a daemon: schemas, argument errors, results, events.

The sandbox is the real AsyncSandbox on LocalKernelHost (see conftest.py); the same
tools against Docker are in tests/integration/test_tools.py.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kernel_sandbox.errors import ConfigError
from kernel_sandbox.events import Event, FileOperated, PythonExecuted, ShellExecuted
from kernel_sandbox.limits import EVENT_DETAIL_CHARS, STREAM_EVENT_CONTENT
from kernel_sandbox.manager import DockerSandboxConfig
from kernel_sandbox.sandbox import AsyncSandbox
from kernel_sandbox.tools import ToolSet, make_tools
from tests.openai_server import strict_schema_problems
from tests.unit.conftest import NewSandbox

SETTINGS: dict[str, Any] = {
    "volumes": {"/host/out": {"bind": "/sandbox/data", "mode": "ro"}},
    "timeout": 20,
}


@pytest.fixture
def sandbox(idle_sandbox: AsyncSandbox) -> AsyncSandbox:
    """A real sandbox whose kernel never started: whatever reaches it would fail."""
    return idle_sandbox


@pytest.fixture
def tools(sandbox: AsyncSandbox) -> ToolSet:
    return ToolSet(sandbox)


@pytest.fixture
async def live(new_sandbox: NewSandbox) -> AsyncSandbox:
    return await new_sandbox(**SETTINGS)


def recorded(sandbox: AsyncSandbox) -> list[Event]:
    events: list[Event] = []
    sandbox.listeners.append(events.append)
    return events


# -- schemas -------------------------------------------------------------------------


def test_chat_schemas_are_strict_mode_valid(tools: ToolSet) -> None:
    for schema in tools.schemas():
        assert schema["type"] == "function"
        fn = schema["function"]
        assert fn["strict"] is True
        assert strict_schema_problems(fn["parameters"]) == [], fn["name"]
        props = fn["parameters"]["properties"]
        assert fn["parameters"]["required"] == list(props)
        assert fn["parameters"]["additionalProperties"] is False
    names = [s["function"]["name"] for s in tools.schemas()]
    assert names == ["python_executor", "shell_executor", "file_operation"]


def test_optional_arguments_are_nullable_and_required_ones_are_not(tools: ToolSet) -> None:
    python = tools.schema_map()["python_executor"]["function"]["parameters"]["properties"]
    assert python["code"]["type"] == "string"
    assert python["timeout"]["type"] == ["number", "null"]
    files = tools.schema_map()["file_operation"]["function"]["parameters"]["properties"]
    assert files["operation"]["enum"] == [
        "read",
        "write",
        "append",
        "list",
        "delete",
        "exists",
        "mkdir",
    ]
    assert files["content"]["type"] == ["string", "null"]


def test_responses_format_is_flat(tools: ToolSet) -> None:
    chat = tools.schema_map()["shell_executor"]
    flat = tools.schema_map("responses")["shell_executor"]
    assert flat == {"type": "function", **chat["function"]}
    assert set(flat) == {"type", "name", "description", "parameters", "strict"}


def test_non_strict_schemas_keep_optional_arguments_optional(tools: ToolSet) -> None:
    params = tools.schema_map(strict=False)["shell_executor"]["function"]["parameters"]
    assert params["required"] == ["command"]
    assert "strict" not in tools.schema_map(strict=False)["shell_executor"]["function"]


def sandbox_dir(tools: ToolSet) -> str:
    return tools.sandbox.working_dir


def test_descriptions_tell_the_model_about_state_files_and_limits(tools: ToolSet) -> None:
    python = tools.schema_map()["python_executor"]["function"]["description"]
    assert "persist" in python
    assert sandbox_dir(tools) in python
    assert "/sandbox/data (read-only)" in python
    assert "no network" in python
    assert "20 s" in python  # the sandbox's timeout is the default
    shell = tools.schema_map()["shell_executor"]["function"]["description"]
    assert "killed" in shell


def test_options_change_defaults_and_descriptions(sandbox: AsyncSandbox) -> None:
    tools = ToolSet(
        sandbox,
        {
            "python_executor": {"timeout": 90, "max_output_chars": 500},
            "file_operation": {"operations": ["read", "list"], "description": "Read files."},
        },
    )
    assert tools.names == ["python_executor", "file_operation"]
    python = tools.schema_map()["python_executor"]["function"]
    assert "90 s" in python["description"] and "500 characters" in python["description"]
    files = tools.schema_map()["file_operation"]["function"]
    assert files["description"] == "Read files."
    assert files["parameters"]["properties"]["operation"]["enum"] == ["read", "list"]


def test_a_disabled_tool_is_not_offered(sandbox: AsyncSandbox) -> None:
    tools = ToolSet(sandbox, {"python_executor": {}, "shell_executor": {"enabled": False}})
    assert tools.names == ["python_executor"]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"python_exec": {}}, "unknown tool 'python_exec'; available: "),
        ({"python_executor": {"timeuot": 5}}, "unknown option 'timeuot'"),
        ({"shell_executor": {"timeout": -1}}, "tools_config['shell_executor']: timeout"),
        ({"file_operation": {"operations": []}}, "needs at least one operation"),
    ],
)
def test_bad_tools_config_raises_config_error(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        make_tools(config)
    with pytest.raises(ValueError, match="tools_config"):
        DockerSandboxConfig(tools_config=config)


def test_docker_config_accepts_ms_enclave_short_volume_form() -> None:
    cfg = DockerSandboxConfig(volumes={"/host/a": "/sandbox/a", "/host/b": "/sandbox/b:ro"})
    assert cfg.volumes == {
        "/host/a": {"bind": "/sandbox/a", "mode": "rw"},
        "/host/b": {"bind": "/sandbox/b", "mode": "ro"},
    }
    with pytest.raises(ValueError, match="privileged containers are not supported"):
        DockerSandboxConfig(privileged=True)


# -- argument errors: one test per kind ----------------------------------------------


async def test_unknown_tool_lists_the_available_ones(tools: ToolSet) -> None:
    result = await tools.execute("run_python", {"code": "1"})
    assert result.status == "error"
    assert result.tool_name == "run_python"
    assert result.error == (
        "unknown tool 'run_python'; the available tools are: "
        "python_executor, shell_executor, file_operation"
    )


async def test_arguments_that_are_not_json(tools: ToolSet, sandbox: AsyncSandbox) -> None:
    events = recorded(sandbox)
    result = await tools.execute("python_executor", '{"code": "print(1)"')
    assert result.status == "error"
    assert "not valid JSON" in (result.error or "")
    assert "Expected arguments: code, timeout (optional)" in (result.error or "")
    assert events == []  # nothing reached the sandbox


async def test_arguments_that_are_json_but_not_an_object(tools: ToolSet) -> None:
    result = await tools.execute("python_executor", '["print(1)"]')
    assert result.error is not None and "must be a JSON object; got list" in result.error


async def test_missing_argument_is_named(tools: ToolSet) -> None:
    result = await tools.execute("shell_executor", {"cwd": "/tmp"})
    assert result.status == "error"
    assert "missing required argument 'command'" in (result.error or "")


async def test_mistyped_argument_is_named(tools: ToolSet) -> None:
    result = await tools.execute("python_executor", {"code": "1", "timeout": "soon"})
    assert "argument 'timeout' must be a number; got str 'soon'" in (result.error or "")
    result = await tools.execute("python_executor", {"code": 42})
    assert "argument 'code' must be a string; got int 42" in (result.error or "")


async def test_extra_argument_is_named(tools: ToolSet, sandbox: AsyncSandbox) -> None:
    events = recorded(sandbox)
    result = await tools.execute("python_executor", {"code": "1", "language": "python"})
    assert "unexpected argument 'language'" in (result.error or "")
    assert events == []


async def test_out_of_range_argument(tools: ToolSet) -> None:
    result = await tools.execute("python_executor", {"code": "1", "timeout": -5})
    assert "argument 'timeout'" in (result.error or "")
    assert "greater than or equal to 1" in (result.error or "")


async def test_unknown_enum_value_lists_the_choices(tools: ToolSet) -> None:
    result = await tools.execute("file_operation", {"operation": "copy", "file_path": "a"})
    assert "argument 'operation' must be one of 'read', 'write'" in (result.error or "")
    assert "got 'copy'" in (result.error or "")


async def test_strict_mode_nulls_mean_defaults(live: AsyncSandbox) -> None:
    events = recorded(live)
    result = await ToolSet(live).execute(
        "shell_executor", json.dumps({"command": "pwd", "timeout": None, "cwd": None})
    )
    assert result.ok and result.output == live.working_dir
    (event,) = events
    assert isinstance(event, ShellExecuted)
    assert (event.command, event.cwd, event.metadata["tool"]) == ("pwd", None, "shell_executor")


async def test_empty_arguments_string_means_no_arguments(tools: ToolSet) -> None:
    result = await tools.execute("python_executor", "")
    assert "missing required argument 'code'" in (result.error or "")


# -- execution results ---------------------------------------------------------------


async def test_python_statuses_map_to_tool_statuses(live: AsyncSandbox) -> None:
    tools = ToolSet(live)
    events = recorded(live)
    ok = await tools.execute("python_executor", {"code": "print('hi')"})
    assert (ok.status, ok.output, ok.metadata["execution_count"]) == ("success", "hi", 1)

    timed_out = await tools.execute(
        "python_executor", {"code": "import time\nwhile True: time.sleep(0.05)", "timeout": 1}
    )
    assert timed_out.status == "timeout"
    assert "interrupted" in (timed_out.error or "")
    assert isinstance(events[-1], PythonExecuted) and events[-1].execution.status == "timeout"

    died = await tools.execute("python_executor", {"code": "import os; os._exit(9)"})
    assert died.status == "error"
    assert died.metadata["state_lost"] is True
    assert "exited with code 9" in (died.error or "") and "exited with code 9" in died.output
    again = await tools.execute("python_executor", {"code": "print('back')"})
    assert again.output == "back"


async def test_timeouts_are_capped_by_max_timeout(live: AsyncSandbox) -> None:
    tools = ToolSet(live, {"python_executor": {"max_timeout": 60}})
    result = await tools.execute("python_executor", {"code": "1", "timeout": 3600})
    assert result.ok
    assert result.metadata["timeout_capped_at"] == 60.0


async def test_long_output_is_truncated_but_kept_for_python(live: AsyncSandbox) -> None:
    tools = ToolSet(live, {"python_executor": {"max_output_chars": 1000}})
    code = "print(''.join(f'row {i}\\n' for i in range(5000)), end='')"
    result = await tools.execute("python_executor", {"code": code})
    big = "".join(f"row {i}\n" for i in range(5000))
    assert len(result.model_dump_json()) < 1500
    assert "characters" in result.output and "omitted" in result.output
    assert result.output.startswith("row 0\n") and result.output.endswith("row 4999")
    assert result.metadata["output_truncated"] is True
    assert result.full_output == big.rstrip("\n")


async def test_plot_png_is_a_placeholder_for_the_model(live: AsyncSandbox) -> None:
    png = b"\x89PNG" + b"\0" * 30_000
    code = (
        "from IPython.display import display\n"
        f"display({{'image/png': {base64.b64encode(png).decode()!r}, "
        "'text/plain': '<Figure>'}, raw=True)"
    )
    result = await ToolSet(live).execute("python_executor", {"code": code})
    assert result.output == "[image/png #1, 29.3 KB] <Figure>"
    assert len(result.model_dump_json()) < 1000
    assert result.images() == [png]


async def test_shell_exit_status_and_stderr(live: AsyncSandbox) -> None:
    result = await ToolSet(live).execute(
        "shell_executor", {"command": "echo partial; ls x-is-not-here"}
    )
    assert result.status == "error"
    assert result.error == "the command exited with status 2"
    assert result.output.startswith("partial\n[stderr]\nls: cannot access 'x-is-not-here'")
    assert result.metadata["exit_code"] == 2


async def test_shell_command_as_an_argument_list(live: AsyncSandbox) -> None:
    # ms-enclave's schema: a list is a program and its arguments, each passed verbatim
    result = await ToolSet(live).execute(
        "shell_executor", {"command": ["printf", "%s|", "two words", "$HOME", "a;b"]}
    )
    assert result.status == "success"
    assert result.output == "two words|$HOME|a;b|"
    empty = await ToolSet(live).execute("shell_executor", {"command": []})
    assert empty.status == "error" and "argument 'command'" in (empty.error or "")
    assert "one or more strings" in (empty.error or "")


async def test_shell_timeout(live: AsyncSandbox) -> None:
    result = await ToolSet(live).execute("shell_executor", {"command": "sleep 99", "timeout": 2})
    assert result.status == "timeout"
    assert "timed out after 2 s" in (result.error or "")


async def test_a_closed_sandbox_is_an_error_result(tools: ToolSet, sandbox: AsyncSandbox) -> None:
    await sandbox.close()
    result = await tools.execute("python_executor", {"code": "1"})
    assert result.status == "error"
    assert "no longer running" in (result.error or "")


# -- file operations and their events ------------------------------------------------


async def test_file_operations_emit_events(live: AsyncSandbox) -> None:
    tools, events = ToolSet(live), recorded(live)
    notes = f"{live.working_dir}/notes.txt"
    write = await tools.execute(
        "file_operation", {"operation": "write", "file_path": "notes.txt", "content": "héllo"}
    )
    assert write.ok and write.output == f"wrote 6 B to {notes}"
    read = await tools.execute("file_operation", {"operation": "read", "file_path": "notes.txt"})
    assert read.output == "héllo"
    missing = await tools.execute("file_operation", {"operation": "read", "file_path": "nope"})
    assert missing.status == "error"
    assert f"no such file or directory in the sandbox: {live.working_dir}/nope" in (
        missing.error or ""
    )
    assert [type(e) for e in events] == [FileOperated] * 3
    first, second, third = events
    assert isinstance(first, FileOperated) and isinstance(third, FileOperated)
    assert isinstance(second, FileOperated)
    assert (second.operation, second.size, second.detail) == ("read", 6, "héllo")
    assert second.content is None
    assert (first.operation, first.path, first.size, first.content) == (
        "write",
        notes,
        6,
        "héllo".encode(),
    )
    assert first.metadata["tool"] == "file_operation"
    assert third.error.startswith("no such file")


async def test_direct_file_calls_are_events_too(live: AsyncSandbox) -> None:
    events = recorded(live)
    await live.files.write("direct.txt", b"x")
    await live.files.remove("direct.txt")
    assert [(e.operation, e.metadata) for e in events if isinstance(e, FileOperated)] == [
        ("write", {}),
        ("delete", {}),
    ]


async def test_an_events_detail_and_content_are_bounded(live: AsyncSandbox) -> None:
    events = recorded(live)
    await live.files.write("long.txt", "y" * (3 * EVENT_DETAIL_CHARS))
    assert (await live.files.read("long.txt")) == b"y" * (3 * EVENT_DETAIL_CHARS)

    async def pieces(total: int) -> AsyncIterator[bytes]:
        for _ in range(total // 65536):
            yield b"z" * 65536

    for total in (STREAM_EVENT_CONTENT, 2 * STREAM_EVENT_CONTENT):
        await live.files.write_stream(f"{total}.bin", pieces(total))
    await live.run_shell("mkdir many && cd many && seq -f 'file-%015g' 500 | xargs touch")
    assert len(await live.files.list("many")) == 500  # names of 10,000 characters in all
    files = [e for e in events if isinstance(e, FileOperated)]
    read, small, large, listed = files[1], files[2], files[3], files[4]
    assert read.operation == "read" and read.detail == "y" * EVENT_DETAIL_CHARS
    assert listed.operation == "list" and len(listed.detail) == EVENT_DETAIL_CHARS
    assert small.content == b"z" * STREAM_EVENT_CONTENT  # embeddable: carried
    assert large.size == 2 * STREAM_EVENT_CONTENT and large.content is None  # by size only


async def test_write_without_content_says_content_is_needed(tools: ToolSet) -> None:
    result = await tools.execute(
        "file_operation", {"operation": "write", "file_path": "a.txt", "content": None}
    )
    assert result.error == "operation 'write' needs `content` (the text to write)"


async def test_unknown_encoding(tools: ToolSet) -> None:
    result = await tools.execute(
        "file_operation", {"operation": "read", "file_path": "a", "encoding": "klingon"}
    )
    assert result.error == "unknown encoding 'klingon'; use e.g. 'utf-8'"


async def test_binary_file_read_points_to_python(live: AsyncSandbox) -> None:
    await live.files.write("img.png", b"\x89PNG\xff\xfe")
    result = await ToolSet(live).execute(
        "file_operation", {"operation": "read", "file_path": "img.png"}
    )
    assert result.status == "error"
    assert "not utf-8 text" in (result.error or "") and "python_executor" in (result.error or "")


async def test_a_disabled_operation_is_refused(sandbox: AsyncSandbox) -> None:
    tools = ToolSet(sandbox, {"file_operation": {"operations": ["read"]}})
    result = await tools.execute(
        "file_operation", {"operation": "delete", "file_path": "x", "content": None}
    )
    assert result.error == "operation 'delete' is not enabled here; use one of: read"


async def test_a_dead_kernel_host_is_reported_as_such(live: AsyncSandbox) -> None:
    await live.host.kill()  # what runs the sandbox is gone, not only a cell
    result = await ToolSet(live).execute(
        "file_operation", {"operation": "read", "file_path": "nope"}
    )
    assert result.error == "the sandbox is not running: the kernel process was killed by SIGKILL"
