"""The Agents SDK's own sandbox scenarios, on our client, through the SDK's public API.

The SDK's sandbox tests themselves run unmodified on our client in
``test_agents_sdk_suite.py`` (from its source distribution; the wheel ships only
``agents.testing``); they are not parametrised over a client but built on its
``UnixLocalSandboxClient``, and some of the scenarios that hold for any provider assert
that client's name.  These are such scenarios, run the same way (``Runner``, the
``ScriptedModel`` of ``agents.testing``, the ``Shell`` and ``Filesystem`` capabilities,
``RunState`` pause and resume), on :class:`KernelSandboxClient` and real sandboxes:

- ``tests/sandbox/test_run_cwd.py``: ``test_concurrent_runs_scope_relative_paths_with_``
  ``shared_live_session`` and ``test_resumed_apply_patch_uses_current_run_cwd``;
- ``tests/sandbox/test_runtime.py``: ``test_runner_persists_workspace_and_tool_choice_``
  ``state_across_sandbox_resume`` (with a manifest of files and directories materialised
  first).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
from pathlib import Path
from typing import Any

import pytest
from agents import (
    ModelSettings,
    RunConfig,
    Runner,
    ToolOutputImage,
    function_tool,
    set_tracing_disabled,
)
from agents.items import ToolCallOutputItem
from agents.run_state import RunState
from agents.sandbox import Manifest, SandboxAgent, SandboxRunConfig
from agents.sandbox.capabilities import Filesystem, FilesystemToolSet, Shell
from agents.sandbox.entries import Dir, File
from agents.sandbox.errors import WorkspaceReadNotFoundError
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.testing import ScriptedModel, assistant_message, function_call
from openai.types.responses import ResponseCustomToolCall

from kernel_sandbox.integrations.openai_agents import (
    KernelPython,
    KernelSandboxClient,
    KernelSandboxClientOptions,
)
from kernel_sandbox.snapshots import LocalSnapshotStore
from tests.conftest import TEST_LABEL

pytestmark = pytest.mark.integration
set_tracing_disabled(True)  # nothing leaves this machine

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mP8/x8AAwMCAO+a84QAAAAASUVORK5CYII="
)
SVG = b'<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"></svg>'
IMAGES = {"task-a": ("image/png", PNG), "task-b": ("image/svg+xml", SVG)}
OPTIONS = KernelSandboxClientOptions(config={"labels": TEST_LABEL})


def _patch(call_id: str, name: str, body: str) -> ResponseCustomToolCall:
    """An apply_patch call adding ``name`` with ``body`` (the SDK's V4A patch format)."""
    return ResponseCustomToolCall(
        id=f"{call_id}_item",
        type="custom_tool_call",
        name="apply_patch",
        call_id=call_id,
        input=f"*** Begin Patch\n*** Add File: {name}\n+{body}\n*** End Patch\n",
    )


async def _read(session: BaseSandboxSession, path: str) -> bytes:
    data = (await session.read(Path(path))).read()
    return data if isinstance(data, bytes) else data.encode()


async def test_concurrent_runs_on_one_live_sandbox_keep_to_their_working_directories(
    docker_engine: object, tmp_path: Path
) -> None:
    """Two runs at once on one sandbox, each in its cwd: a shell copy, view_image (the
    image as the model gets it) and apply_patch all land in the run's own directory."""
    client = KernelSandboxClient(
        record_dir=tmp_path, snapshot_store=LocalSnapshotStore(tmp_path / "snapshots")
    )
    session = await client.create(manifest=Manifest(), options=OPTIONS)

    def model(task: str) -> ScriptedModel:
        return ScriptedModel(
            [
                [function_call("exec_command", {"cmd": "cp seed.png plot.png"}, call_id="sh")],
                [function_call("view_image", {"path": "plot.png"}, call_id="image")],
                [_patch("patch", "notes.md", task)],
                [assistant_message("done")],
            ]
        )

    models = {task: model(task) for task in IMAGES}
    try:
        async with session:
            for task, (_, data) in IMAGES.items():
                await session.mkdir(f"tasks/{task}", parents=True)
                await session.write(Path(f"tasks/{task}/seed.png"), io.BytesIO(data))
            results = await asyncio.gather(
                *(
                    Runner.run(
                        SandboxAgent(name=task, model=m, capabilities=[Shell(), Filesystem()]),
                        "Make the task's files.",
                        run_config=RunConfig(
                            sandbox=SandboxRunConfig(session=session, cwd=f"tasks/{task}")
                        ),
                    )
                    for task, m in models.items()
                )
            )
            for (task, (mime, data)), result in zip(IMAGES.items(), results, strict=True):
                assert result.final_output == "done"
                items = [i for i in result.new_items if isinstance(i, ToolCallOutputItem)]
                outputs = {i.call_id: i.output for i in items}
                image = outputs["image"]
                assert isinstance(image, ToolOutputImage)
                assert image.image_url == f"data:{mime};base64,{base64.b64encode(data).decode()}"
                assert outputs["patch"] == "Created notes.md"
                assert await _read(session, f"tasks/{task}/plot.png") == data
                assert await _read(session, f"tasks/{task}/notes.md") == task.encode()
                models[task].assert_complete()
            for stray in ("plot.png", "notes.md"):
                with pytest.raises(WorkspaceReadNotFoundError):
                    await session.read(Path(stray))
    finally:
        await client.delete(session)


@pytest.mark.parametrize("serialize", [False, True], ids=["in-memory", "json"])
async def test_an_approved_patch_resumes_in_the_resumed_runs_working_directory(
    docker_engine: object, tmp_path: Path, serialize: bool
) -> None:
    """A patch that needs approval interrupts the run; approved (the RunState kept in
    memory or through JSON), it is applied in the cwd of the run that resumes it."""
    client = KernelSandboxClient(
        record_dir=tmp_path, snapshot_store=LocalSnapshotStore(tmp_path / "snapshots")
    )
    session = await client.create(manifest=Manifest(), options=OPTIONS)

    def needs_approval(toolset: FilesystemToolSet) -> None:
        toolset.apply_patch.needs_approval = True

    model = ScriptedModel([[_patch("patch", "marker.txt", "resumed")], [assistant_message("done")]])
    agent = SandboxAgent(
        name="patcher", model=model, capabilities=[Filesystem(configure_tools=needs_approval)]
    )

    def in_dir(cwd: str) -> RunConfig:
        return RunConfig(sandbox=SandboxRunConfig(session=session, cwd=cwd))

    try:
        async with session:
            await session.mkdir("tasks/a", parents=True)
            await session.mkdir("tasks/b", parents=True)
            first = await Runner.run(agent, "Make the marker.", run_config=in_dir("tasks/a"))
            assert len(first.interruptions) == 1
            state = first.to_state()
            if serialize:
                state = await RunState.from_json(agent, state.to_json())
            state.approve(state.get_interruptions()[0])
            resumed = await Runner.run(agent, state, run_config=in_dir("tasks/b"))
            assert resumed.final_output == "done"
            assert await _read(session, "tasks/b/marker.txt") == b"resumed"
            with pytest.raises(WorkspaceReadNotFoundError):
                await session.read(Path("tasks/a/marker.txt"))
            model.assert_complete()
    finally:
        await client.delete(session)


async def test_a_runs_workspace_and_tool_choice_survive_a_json_resume(
    docker_engine: object, tmp_path: Path
) -> None:
    """A run of the client's own sandbox (manifest materialised: a file, a directory
    with a file) stops at an approval; its RunState goes through JSON and a new runner
    resumes it on our client: the file the first run wrote is read back in the resumed
    run, and ``tool_choice="required"`` is reset as the SDK does after a tool call.  Ours
    too: the kernel's variables come back in the new sandbox (a portable snapshot taken
    when the workspace was persisted)."""

    @function_tool(name_override="approval_tool", needs_approval=True)
    def approval_tool() -> str:
        return "approved"

    manifest = Manifest(
        entries={
            "README.md": File(content=b"the repo's contract"),
            "data": Dir(children={"a.txt": File(content=b"kept")}),
        }
    )
    write = {"cmd": "cat README.md data/a.txt > note.txt && echo ' + persist me' >> note.txt"}
    model = ScriptedModel(
        [
            [function_call("python_executor", {"code": "x = 21"}, call_id="kernel")],
            [function_call("exec_command", write, call_id="write")],
            [function_call("approval_tool", {}, call_id="approval")],
        ]
    )

    def agent(scripted: ScriptedModel) -> SandboxAgent[Any]:
        return SandboxAgent(
            name="sandbox",
            model=scripted,
            instructions="Base instructions.",
            tools=[approval_tool],
            capabilities=[Shell(), KernelPython()],
            model_settings=ModelSettings(tool_choice="required"),
        )

    client = KernelSandboxClient(
        record_dir=tmp_path, snapshot_store=LocalSnapshotStore(tmp_path / "snapshots")
    )

    def run_config() -> RunConfig:
        sandbox = SandboxRunConfig(client=client, options=OPTIONS, manifest=manifest)
        return RunConfig(sandbox=sandbox)

    first = await Runner.run(agent(model), "hello", run_config=run_config())
    assert len(first.interruptions) == 1
    state = first.to_state()
    assert state._sandbox is not None and state._sandbox["backend_id"] == "kernel_sandbox"
    first_sandbox = state._sandbox["session_state"]["sandbox_id"]
    state_json = state.to_json()
    json.dumps(state_json)  # plain JSON all through

    read = {"cmd": "cat note.txt"}
    resumed_model = ScriptedModel(
        [
            [function_call("exec_command", read, call_id="read")],
            [function_call("python_executor", {"code": "x * 2"}, call_id="kernel2")],
            [assistant_message("done")],
        ]
    )
    second = agent(resumed_model)
    restored = await RunState.from_json(second, state_json)
    restored.approve(restored.get_interruptions()[0])
    resumed = await Runner.run(second, restored, run_config=run_config())

    assert resumed.final_output == "done"
    assert resumed_model.calls[-1].model_settings.tool_choice is None
    items = [i for i in resumed.new_items if isinstance(i, ToolCallOutputItem)]
    outputs = {i.call_id: str(i.output) for i in items}
    assert outputs["approval"] == "approved"
    assert "the repo's contractkept + persist me" in outputs["read"]
    # ours beyond the SDK's scenario: the first run's sandbox is gone (the runner
    # removed it), and the new one was restored from the kernel's snapshot
    assert resumed.to_state()._sandbox["session_state"]["sandbox_id"] != first_sandbox
    (answer,) = [i.output for i in items if i.call_id == "kernel2"]
    assert json.loads(answer[0].text)["output"] == "42"
