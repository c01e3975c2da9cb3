"""The OpenAI Agents SDK's own runner drives a Sandbox Agent on our client (real model
client against the local OpenAI-compatible server, real sandbox, real notebook)."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path
from typing import Any

import httpx2
import nbformat
import pytest
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    RunResult,
    ToolCallOutputItem,
    set_tracing_disabled,
)
from agents.mcp import MCPServerStreamableHttp
from agents.sandbox import Manifest, SandboxAgent, SandboxRunConfig
from agents.sandbox.capabilities import Shell
from agents.sandbox.errors import (
    InvalidManifestPathError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.types import User
from agents.sandbox.workspace_paths import SandboxPathGrant
from agents.tool import ToolOutputImage
from openai import AsyncOpenAI

from kernel_sandbox.integrations.openai_agents import (
    KernelPython,
    KernelSandboxClient,
    KernelSandboxClientOptions,
    KernelSandboxSession,
)
from kernel_sandbox.limits import (
    E2B_MAX_FRAME,
    PTY_MAX_PROCESSES,
    PTY_UNREAD_BYTES,
    PTY_UPDATE_BYTES,
)
from kernel_sandbox.notebook.replay import areplay
from kernel_sandbox.snapshots import LocalSnapshotStore
from tests.conftest import TEST_LABEL
from tests.integration.serving import KEY_A, Server
from tests.openai_server import RecordedRequest, ScriptedOpenAIServer, call, text, tool_calls
from tests.waiting import await_for

pytestmark = pytest.mark.integration
set_tracing_disabled(True)  # nothing leaves this machine

PLOT = (
    "import matplotlib\nmatplotlib.use('module://matplotlib_inline.backend_inline')\n"
    "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3]); plt.show()"
)


def _model(server: ScriptedOpenAIServer) -> OpenAIChatCompletionsModel:
    client = AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0)
    return OpenAIChatCompletionsModel(model="scripted", openai_client=client)


def _tool_texts(request: RecordedRequest) -> list[str]:
    """Every tool result the model was sent, as text (image parts dropped)."""
    out = []
    for message in request.tool_messages:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if p.get("type") == "text")
        out.append(str(content))
    return out


def _images(result: RunResult) -> list[str]:
    """The image URLs tool calls handed the model (the Responses API carries them; Chat
    Completions' tool messages take text only, so the SDK sends those as text)."""
    return [
        part.image_url
        for item in result.new_items
        if isinstance(item, ToolCallOutputItem) and isinstance(item.output, list)
        for part in item.output
        if isinstance(part, ToolOutputImage) and part.image_url
    ]


async def test_sandbox_agent_keeps_kernel_state_sees_plots_errors_and_files(
    docker_engine: object, tmp_path: Path
) -> None:
    script = [
        tool_calls(call("python_executor", {"code": "x = 21", "timeout": None})),
        tool_calls(call("python_executor", {"code": "x * 2", "timeout": None})),
        tool_calls(call("python_executor", {"code": PLOT, "timeout": None})),
        tool_calls(call("python_executor", {"code": "1/0", "timeout": None})),
        tool_calls(call("exec_command", {"cmd": "echo written-by-shell > note.txt"})),
        tool_calls(call("python_executor", {"code": "open('note.txt').read()", "timeout": None})),
        text("x * 2 is 42"),
    ]
    client = KernelSandboxClient(
        record_dir=tmp_path, snapshot_store=LocalSnapshotStore(tmp_path / "snapshots")
    )
    options = KernelSandboxClientOptions(config={"labels": TEST_LABEL})
    with ScriptedOpenAIServer(script) as model:
        agent = SandboxAgent(
            name="analyst",
            instructions="Answer with the sandbox.",
            model=_model(model),
            capabilities=[Shell(), KernelPython()],
        )
        result = await Runner.run(
            agent,
            "What is x * 2?",
            run_config=RunConfig(sandbox=SandboxRunConfig(client=client, options=options)),
        )
        requests = model.chat_requests
    assert result.final_output == "x * 2 is 42"
    assert {"python_executor", "exec_command"} <= {t["function"]["name"] for t in requests[0].tools}
    results = _tool_texts(requests[-1])
    assert '"42"' in results[1] or "42" in json.loads(results[1])["output"]
    images = _images(result)  # the plot, as an image for the model
    assert len(images) == 1, results[2]
    assert images[0].startswith("data:image/png;base64,iVBOR")
    error = json.loads(results[3])
    assert error["status"] == "error" and "ZeroDivisionError" in error["output"]
    assert "written-by-shell" in json.loads(results[5])["output"]

    (notebook,) = tmp_path.rglob("*.ipynb")
    nb = nbformat.read(notebook, as_version=4)
    nbformat.validate(nb)
    sources = [c.source for c in nb.cells]  # a title cell, then one cell per call
    python = [s for s in sources[1:] if not s.startswith("%%sh")]  # shell commands: %%sh
    assert python[:2] == ["x = 21", "x * 2"]
    assert any("echo written-by-shell" in s for s in sources)
    report = await areplay(
        notebook, output=tmp_path / "replayed.ipynb", sandbox_options={"labels": TEST_LABEL}
    )
    assert report.cells_by_index[sources.index("x * 2")].verdict == "same"


async def test_the_workspace_persists_and_hydrates_into_a_new_sandbox(
    docker_engine: object, tmp_path: Path
) -> None:
    client = KernelSandboxClient(
        record_dir=tmp_path, snapshot_store=LocalSnapshotStore(tmp_path / "snapshots")
    )
    options = KernelSandboxClientOptions(config={"labels": TEST_LABEL})
    first = await client.create(options=options)
    async with first:
        await first.exec("mkdir -p data && echo kept > data/a.txt")
        archive = await first.persist_workspace()
    second = await client.create(options=options)
    async with second:
        await second.hydrate_workspace(archive)
        read = await second.read(Path("data/a.txt"))
        assert read.read() == b"kept\n"
        assert (await second.exec("cat data/a.txt")).stdout == b"kept\n"
    await client.delete(first)
    await client.delete(second)


@pytest.fixture(scope="module")
def mcp_server(tmp_path_factory: pytest.TempPathFactory, docker_engine: object) -> Any:
    """A server that removes sandboxes idle for 8 s."""
    srv = Server(
        f"t-agents-mcp-{os.getpid()}", tmp_path_factory.mktemp("nb"), ["--idle-timeout", "8"]
    ).start()
    yield srv
    srv.stop()


async def _sandbox_ids(server: Server) -> list[str]:
    async with httpx2.AsyncClient(headers={"X-API-Key": KEY_A}) as api:
        return [s["id"] for s in (await api.get(f"{server.url}/v1/sandboxes")).json()]


async def test_agents_sdk_mcp_client_keeps_state_in_one_sandbox_released_when_idle(
    mcp_server: Server,
) -> None:
    """The Agents SDK's MCPServerStreamableHttp speaks protocol 2026-07-28 (no sessions):
    five dependent calls through its runner share one sandbox, which the server removes
    once idle; the next call starts afresh."""
    codes = ["x = 1", "x += 1", "x += 1", "x += 1", "x * 10"]
    script = [tool_calls(call("run_python", {"code": code})) for code in codes]
    script += [text("40"), tool_calls(call("run_python", {"code": "x"})), text("gone")]
    async with MCPServerStreamableHttp(
        params={"url": f"{mcp_server.url}/mcp", "headers": {"X-API-Key": KEY_A}},
        cache_tools_list=True,
    ) as mcp:
        assert mcp.session is not None and mcp.session.protocol_version == "2026-07-28"
        with ScriptedOpenAIServer(script) as model:
            agent = Agent(name="analyst", model=_model(model), mcp_servers=[mcp])
            result = await Runner.run(agent, "What is x * 10?")
            assert result.final_output == "40"
            assert _tool_texts(model.chat_requests[-1])[-1] == "40"
            (sandbox,) = await _sandbox_ids(mcp_server)  # five calls, one sandbox

            async def reaped() -> bool:  # idle: the server's reaper removes it
                return await _sandbox_ids(mcp_server) == []

            await await_for(reaped, 60, 0.5, "the idle sandbox to be reaped")
            again = await Runner.run(agent, "And x now?")
            assert again.final_output == "gone"
            assert "NameError" in _tool_texts(model.chat_requests[-1])[-1]
        assert sandbox not in await _sandbox_ids(mcp_server)


def _session_id(request: RecordedRequest) -> int:
    """The PTY session id the last exec_command/write_stdin result named."""
    found = re.search(r"session ID (\d+)", _tool_texts(request)[-1])
    assert found, _tool_texts(request)[-1]
    return int(found.group(1))


def _stdin(chars: str, wait_ms: int = 2000) -> Any:
    """A scripted write_stdin call to the session the model was last told about."""
    return lambda request: tool_calls(
        call(
            "write_stdin",
            {"session_id": _session_id(request), "chars": chars, "yield_time_ms": wait_ms},
        )
    )


async def test_the_shell_capabilitys_pty_keeps_a_repl_running_between_calls(
    docker_engine: object, tmp_path: Path
) -> None:
    """The SDK's runner and Shell capability: exec_command opens a Python REPL on a
    terminal, write_stdin talks to it across calls, Ctrl-C and exit end what runs."""
    start = {"cmd": "python3 -q", "tty": True, "yield_time_ms": 5000}
    script = [
        tool_calls(call("exec_command", start)),
        _stdin("x = 21\n"),
        _stdin("print(x * 2)\n"),
        _stdin("import time; time.sleep(100)\n", 500),
        _stdin("\x03"),  # Ctrl-C: KeyboardInterrupt, the REPL goes on
        _stdin("exit()\n"),
        text("x * 2 is 42"),
    ]
    client = KernelSandboxClient(
        record_dir=tmp_path, snapshot_store=LocalSnapshotStore(tmp_path / "snapshots")
    )
    options = KernelSandboxClientOptions(config={"labels": TEST_LABEL})
    with ScriptedOpenAIServer(script) as model:
        agent = SandboxAgent(
            name="coder", instructions="Use the shell.", model=_model(model), capabilities=[Shell()]
        )
        result = await Runner.run(
            agent,
            "What is x * 2?",
            run_config=RunConfig(sandbox=SandboxRunConfig(client=client, options=options)),
        )
        requests = model.chat_requests
    assert result.final_output == "x * 2 is 42"
    assert {"exec_command", "write_stdin"} <= {t["function"]["name"] for t in requests[0].tools}
    replies = _tool_texts(requests[-1])
    assert replies[0].endswith(">>> ") and "session ID" in replies[0]
    assert "42\r\n>>> " in replies[2]
    assert "session ID" in replies[3]  # sleeping: still running
    assert "KeyboardInterrupt" in replies[4] and replies[4].endswith(">>> ")
    # ended (its shell, which took the Ctrl-C too, exits 130 as sh does)
    assert "Process exited with code" in replies[5] and "session ID" not in replies[5]

    (notebook,) = tmp_path.rglob("*.ipynb")
    nb = nbformat.read(notebook, as_version=4)
    nbformat.validate(nb)
    (repl,) = [c for c in nb.cells if "python3 -q" in c.source]  # the process, with its transcript
    transcript = "".join(o.get("text", "") for o in repl.outputs)
    assert "print(x * 2)\r\n42" in transcript
    assert repl.metadata["kernel_sandbox"]["interactive"] == "tty"


async def test_pty_processes_end_with_their_status_and_are_bounded(
    docker_engine: object, tmp_path: Path
) -> None:
    """The SDK's PTY calls on our session: exit codes, a terminal, signals, the
    non-tty stdin refusal, output held in the process past the caps, and the cap on
    processes (the least recently used one is ended for the next)."""
    client = KernelSandboxClient(
        record_dir=tmp_path, snapshot_store=LocalSnapshotStore(tmp_path / "snapshots")
    )
    session = await client.create(options=KernelSandboxClientOptions(config={"labels": TEST_LABEL}))
    inner = session._inner
    assert isinstance(inner, KernelSandboxSession) and session.supports_pty()
    async with session:
        done = await session.pty_exec_start("echo out; echo err >&2; exit 3", yield_time_s=5)
        assert (done.process_id, done.exit_code) == (None, 3)
        assert done.output.split() == [b"out", b"err"]  # stdout and stderr, together
        on_tty = await session.pty_exec_start("tty", tty=True, yield_time_s=5)
        assert on_tty.output.startswith(b"/dev/pts/") and on_tty.exit_code == 0

        piped = await session.pty_exec_start("sleep 100", yield_time_s=0.3)
        assert piped.process_id is not None and piped.exit_code is None
        with pytest.raises(RuntimeError, match="stdin is not available"):
            await session.pty_write_stdin(session_id=piped.process_id, chars="x")
        sleeping = await session.pty_exec_start("sleep 100", tty=True, yield_time_s=0.3)
        assert sleeping.process_id is not None
        interrupted = await session.pty_write_stdin(
            session_id=sleeping.process_id, chars="\x03", yield_time_s=5
        )
        assert (interrupted.process_id, interrupted.exit_code) == (None, 130)

        # a flood nobody reads: the host holds PTY_UNREAD_BYTES, the process waits
        flood = await session.pty_exec_start("yes", yield_time_s=0.3)
        assert flood.process_id is not None and len(flood.output) <= PTY_UPDATE_BYTES
        process = inner._pty[flood.process_id].process
        await await_for(lambda: process.unread >= PTY_UNREAD_BYTES, 30, 0.1, "the unread cap")
        assert PTY_UNREAD_BYTES <= process.unread <= PTY_UNREAD_BYTES + E2B_MAX_FRAME
        read = await session.pty_write_stdin(session_id=flood.process_id, chars="", yield_time_s=5)
        assert len(read.output) == PTY_UPDATE_BYTES and read.exit_code is None  # one call's cap
        assert set(read.output) == set(b"y\n") and not process.ended

        # the cap on processes: the one used least recently goes for the newest
        first = piped.process_id
        for _ in range(PTY_MAX_PROCESSES):
            await session.pty_exec_start("sleep 100", yield_time_s=0.25)
        assert len(inner._pty) == PTY_MAX_PROCESSES and first not in inner._pty
        held = [e.process for e in inner._pty.values()]
        await session.pty_terminate_all()
        assert inner._pty == {} and all(p.ended for p in held) and process.ended
        left = await session.exec("grep -l '^sleep' /proc/[0-9]*/cmdline 2>/dev/null | wc -l")
        assert left.stdout.strip() == b"0"  # every process gone from the sandbox
    await client.delete(session)


async def test_paths_stay_in_the_workspace_and_what_we_cannot_do_is_refused(
    docker_engine: object, tmp_path: Path
) -> None:
    """A symlink made in the sandbox cannot lead the SDK's file calls out of the
    workspace (the SDK's own check, run inside the sandbox); a failed write is the SDK's
    error; manifest accounts and host-path grants are refused, not half done; a second
    session on the state of a live one (a resume in the same process) is the same
    sandbox."""
    client = KernelSandboxClient(
        record_dir=tmp_path, snapshot_store=LocalSnapshotStore(tmp_path / "snapshots")
    )
    options = KernelSandboxClientOptions(config={"labels": TEST_LABEL})
    session = await client.create(options=options)
    async with session:
        made = await session.exec("ln -s /etc link && mkdir docs && echo x > inside.txt")
        assert made.ok(), made.stderr
        for attempt in (
            session.read(Path("link/passwd")),
            session.write(Path("link/evil"), io.BytesIO(b"x")),
            session.ls("link"),
            session.mkdir("link/nested", parents=True),
            session.rm("link/passwd"),
        ):
            with pytest.raises(InvalidManifestPathError, match="must not escape root"):
                await attempt
        assert (await session.read(Path("inside.txt"))).read() == b"x\n"
        with pytest.raises(WorkspaceArchiveWriteError):
            await session.write(Path("docs"), io.BytesIO(b"a directory is no file"))
        with pytest.raises(WorkspaceReadNotFoundError):
            await session.read(Path("missing.txt"))

        again = await client.resume(session.state)
        assert again._inner.sandbox is session._inner.sandbox  # type: ignore[attr-defined]
        await session.exec("touch from-first")
        assert (await again.exec("ls from-first")).ok()
    await client.delete(session)

    with pytest.raises(ValueError, match="does not support manifest users or groups"):
        await client.create(manifest=Manifest(users=[User(name="someone")]), options=options)
    grant = SandboxPathGrant(path="/mnt/shared", host_path=str(tmp_path))
    with pytest.raises(ValueError, match="does not support sandbox path grant host_path"):
        await client.create(manifest=Manifest(extra_path_grants=(grant,)), options=options)
