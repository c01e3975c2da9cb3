"""Tools without a daemon: schemas, argument errors, status mapping, events.

A small in-memory stand-in for AsyncSandbox plays the sandbox; the real one is
exercised in tests/integration/test_tools.py.
"""

from __future__ import annotations

import base64
import json
import posixpath
from typing import Any

import pytest

from kernel_sandbox.backends.base import ContainerState
from kernel_sandbox.config import SandboxConfig
from kernel_sandbox.errors import ConfigError, SandboxClosedError, SandboxFileNotFoundError
from kernel_sandbox.events import Event, FileOperated
from kernel_sandbox.manager import DockerSandboxConfig
from kernel_sandbox.results import CommandResult, Execution, FileInfo
from kernel_sandbox.tools import ToolSet, make_tools
from tests.openai_server import strict_schema_problems


class FakeFiles:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    async def read(self, path: str) -> bytes:
        if path not in self.data:
            raise SandboxFileNotFoundError(f"no such file in the sandbox: {path}")
        return self.data[path]

    async def write(self, path: str, data: bytes) -> None:
        self.data[path] = data

    async def append(self, path: str, data: bytes) -> None:
        self.data[path] = self.data.get(path, b"") + data

    async def list(self, path: str) -> list[FileInfo]:
        return [
            FileInfo(posixpath.basename(p), "file", len(d))
            for p, d in sorted(self.data.items())
            if posixpath.dirname(p) == path
        ]

    async def exists(self, path: str) -> bool:
        return path in self.data

    async def remove(self, path: str) -> None:
        if self.data.pop(path, None) is None:
            raise SandboxFileNotFoundError(path)

    async def mkdir(self, path: str) -> None:
        pass


class FakeBackend:
    def __init__(self) -> None:
        self.running = True

    async def state(self, container_id: str) -> ContainerState:
        return ContainerState(running=self.running, error="the container was removed")


class FakeSandbox:
    """Just enough of AsyncSandbox for the tools."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self.id = "fake"
        self.container_id = "c0ffee"
        self.closed = False
        self.listeners: list[Any] = []
        self.files = FakeFiles()
        self.backend = FakeBackend()
        self.execution = Execution(
            "ok", [{"output_type": "stream", "name": "stdout", "text": "hi\n"}], 1
        )
        self.command = CommandResult(0, "out\n", "")
        self.calls: list[tuple[str, Any]] = []

    def resolve_path(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.config.working_dir, path))

    async def run_python(self, code: str, timeout: float | None = None) -> Execution:
        if self.closed:
            raise SandboxClosedError("sandbox fake is closed; create a new one")
        self.calls.append(("python", (code, timeout)))
        return self.execution

    async def run_shell(
        self, command: str, timeout: float | None = None, cwd: str | None = None
    ) -> CommandResult:
        self.calls.append(("shell", (command, timeout, cwd)))
        return self.command


@pytest.fixture
def sandbox() -> FakeSandbox:
    return FakeSandbox(
        SandboxConfig(volumes={"/host/out": {"bind": "/sandbox/data", "mode": "ro"}}, timeout=20)
    )


@pytest.fixture
def tools(sandbox: FakeSandbox) -> ToolSet:
    return ToolSet(sandbox)  # type: ignore[arg-type]


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


def test_descriptions_tell_the_model_about_state_files_and_limits(tools: ToolSet) -> None:
    python = tools.schema_map()["python_executor"]["function"]["description"]
    assert "persist" in python
    assert "/sandbox" in python
    assert "/sandbox/data (read-only)" in python
    assert "no network" in python
    assert "20 s" in python  # the sandbox's timeout is the default
    shell = tools.schema_map()["shell_executor"]["function"]["description"]
    assert "killed" in shell


def test_options_change_defaults_and_descriptions(sandbox: FakeSandbox) -> None:
    tools = ToolSet(
        sandbox,  # type: ignore[arg-type]
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


def test_a_disabled_tool_is_not_offered(sandbox: FakeSandbox) -> None:
    tools = ToolSet(sandbox, {"python_executor": {}, "shell_executor": {"enabled": False}})  # type: ignore[arg-type]
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


async def test_arguments_that_are_not_json(tools: ToolSet, sandbox: FakeSandbox) -> None:
    result = await tools.execute("python_executor", '{"code": "print(1)"')
    assert result.status == "error"
    assert "not valid JSON" in (result.error or "")
    assert "Expected arguments: code, timeout (optional)" in (result.error or "")
    assert sandbox.calls == []


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


async def test_extra_argument_is_named(tools: ToolSet, sandbox: FakeSandbox) -> None:
    result = await tools.execute("python_executor", {"code": "1", "language": "python"})
    assert "unexpected argument 'language'" in (result.error or "")
    assert sandbox.calls == []


async def test_out_of_range_argument(tools: ToolSet) -> None:
    result = await tools.execute("python_executor", {"code": "1", "timeout": -5})
    assert "argument 'timeout'" in (result.error or "")
    assert "greater than or equal to 1" in (result.error or "")


async def test_unknown_enum_value_lists_the_choices(tools: ToolSet) -> None:
    result = await tools.execute("file_operation", {"operation": "copy", "file_path": "a"})
    assert "argument 'operation' must be one of 'read', 'write'" in (result.error or "")
    assert "got 'copy'" in (result.error or "")


async def test_strict_mode_nulls_mean_defaults(tools: ToolSet, sandbox: FakeSandbox) -> None:
    result = await tools.execute(
        "shell_executor", json.dumps({"command": "ls", "timeout": None, "cwd": None})
    )
    assert result.ok
    assert sandbox.calls == [("shell", ("ls", 20.0, None))]


async def test_empty_arguments_string_means_no_arguments(tools: ToolSet) -> None:
    result = await tools.execute("python_executor", "")
    assert "missing required argument 'code'" in (result.error or "")


# -- execution results ---------------------------------------------------------------


async def test_python_statuses_map_to_tool_statuses(tools: ToolSet, sandbox: FakeSandbox) -> None:
    ok = await tools.execute("python_executor", {"code": "print('hi')"})
    assert (ok.status, ok.output, ok.metadata["execution_count"]) == ("success", "hi", 1)

    sandbox.execution = Execution(
        "timeout", [], 2, message="execution timed out after 1s and was interrupted"
    )
    timed_out = await tools.execute("python_executor", {"code": "while True: pass", "timeout": 1})
    assert timed_out.status == "timeout"
    assert "interrupted" in (timed_out.error or "")
    assert sandbox.calls[-1] == ("python", ("while True: pass", 1.0))

    sandbox.execution = Execution(
        "kernel_died", [], None, state_lost=True, message="the kernel ran out of memory"
    )
    died = await tools.execute("python_executor", {"code": "x = ' ' * 10**12"})
    assert died.status == "error"
    assert died.metadata["state_lost"] is True
    assert "out of memory" in (died.error or "") and "out of memory" in died.output


async def test_timeouts_are_capped_by_max_timeout(sandbox: FakeSandbox) -> None:
    tools = ToolSet(sandbox, {"python_executor": {"max_timeout": 60}})  # type: ignore[arg-type]
    result = await tools.execute("python_executor", {"code": "1", "timeout": 3600})
    assert sandbox.calls[-1] == ("python", ("1", 60.0))
    assert result.metadata["timeout_capped_at"] == 60.0


async def test_long_output_is_truncated_but_kept_for_python(sandbox: FakeSandbox) -> None:
    tools = ToolSet(sandbox, {"python_executor": {"max_output_chars": 1000}})  # type: ignore[arg-type]
    big = "".join(f"row {i}\n" for i in range(5000))
    sandbox.execution = Execution(
        "ok", [{"output_type": "stream", "name": "stdout", "text": big}], 3
    )
    result = await tools.execute("python_executor", {"code": "..."})
    assert len(result.model_dump_json()) < 1500
    assert "characters" in result.output and "omitted" in result.output
    assert result.output.startswith("row 0\n") and result.output.endswith("row 4999")
    assert result.metadata["output_truncated"] is True
    assert result.full_output == big.rstrip("\n")


async def test_plot_png_is_a_placeholder_for_the_model(sandbox: FakeSandbox) -> None:
    png = b"\x89PNG" + b"\0" * 30_000
    sandbox.execution = Execution(
        "ok",
        [
            {
                "output_type": "display_data",
                "data": {"image/png": base64.b64encode(png).decode(), "text/plain": "<Figure>"},
                "metadata": {},
            }
        ],
        4,
    )
    result = await ToolSet(sandbox).execute("python_executor", {"code": "plt.plot()"})  # type: ignore[arg-type]
    assert result.output == "[image/png #1, 29.3 KB] <Figure>"
    assert len(result.model_dump_json()) < 1000
    assert result.images() == [png]


async def test_shell_exit_status_and_stderr(tools: ToolSet, sandbox: FakeSandbox) -> None:
    sandbox.command = CommandResult(2, "partial\n", "ls: cannot access 'x'\n")
    result = await tools.execute("shell_executor", {"command": "ls x"})
    assert result.status == "error"
    assert result.error == "the command exited with status 2"
    assert result.output == "partial\n[stderr]\nls: cannot access 'x'"
    assert result.metadata["exit_code"] == 2


async def test_shell_timeout(tools: ToolSet, sandbox: FakeSandbox) -> None:
    sandbox.command = CommandResult(124, "", "", timed_out=True)
    result = await tools.execute("shell_executor", {"command": "sleep 99", "timeout": 2})
    assert result.status == "timeout"
    assert "timed out after 2 s" in (result.error or "")


async def test_a_closed_sandbox_is_an_error_result(tools: ToolSet, sandbox: FakeSandbox) -> None:
    sandbox.closed = True
    result = await tools.execute("python_executor", {"code": "1"})
    assert result.status == "error"
    assert "no longer running" in (result.error or "")


# -- file operations and their events ------------------------------------------------


async def test_file_operations_emit_events(tools: ToolSet, sandbox: FakeSandbox) -> None:
    events: list[Event] = []
    sandbox.listeners.append(events.append)
    write = await tools.execute(
        "file_operation", {"operation": "write", "file_path": "notes.txt", "content": "héllo"}
    )
    assert write.ok and write.output == "wrote 6 B to /sandbox/notes.txt"
    read = await tools.execute("file_operation", {"operation": "read", "file_path": "notes.txt"})
    assert read.output == "héllo"
    missing = await tools.execute("file_operation", {"operation": "read", "file_path": "nope"})
    assert missing.status == "error"
    assert "no such file or directory in the sandbox: /sandbox/nope" in (missing.error or "")
    assert [type(e) for e in events] == [FileOperated] * 3
    first, second, third = events
    assert isinstance(first, FileOperated) and isinstance(third, FileOperated)
    assert isinstance(second, FileOperated)
    assert (second.operation, second.size, second.detail) == ("read", 6, "héllo")
    assert second.content is None
    assert (first.operation, first.path, first.size, first.content) == (
        "write",
        "/sandbox/notes.txt",
        6,
        "héllo",
    )
    assert first.detail == "wrote 6 B to /sandbox/notes.txt"
    assert first.metadata["tool"] == "file_operation"
    assert third.error.startswith("no such file")


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


async def test_binary_file_read_points_to_python(tools: ToolSet, sandbox: FakeSandbox) -> None:
    sandbox.files.data["/sandbox/img.png"] = b"\x89PNG\xff\xfe"
    result = await tools.execute("file_operation", {"operation": "read", "file_path": "img.png"})
    assert result.status == "error"
    assert "not utf-8 text" in (result.error or "") and "python_executor" in (result.error or "")


async def test_a_disabled_operation_is_refused(sandbox: FakeSandbox) -> None:
    tools = ToolSet(sandbox, {"file_operation": {"operations": ["read"]}})  # type: ignore[arg-type]
    result = await tools.execute(
        "file_operation", {"operation": "delete", "file_path": "x", "content": None}
    )
    assert result.error == "operation 'delete' is not enabled here; use one of: read"


async def test_a_dead_container_is_reported_as_such(tools: ToolSet, sandbox: FakeSandbox) -> None:
    sandbox.backend.running = False
    result = await tools.execute("file_operation", {"operation": "read", "file_path": "a"})
    assert result.error == (
        "the sandbox is not running: the kernel process exited with code None "
        "(the container was removed)"
    )
