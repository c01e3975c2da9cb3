"""The OpenAI Agents SDK: kernel_sandbox sandboxes behind ``agents.sandbox``.

:class:`KernelSandboxClient` is a ``BaseSandboxClient``: a ``SandboxAgent`` run with
``RunConfig(sandbox=SandboxRunConfig(client=KernelSandboxClient(), options=...))``
gets a kernel_sandbox sandbox — a locked-down container (or pod) with its limits,
egress policy and notebook recording — for the SDK's shell, file and workspace tools.
Commands and files go through the sandbox's own API (as its user, bounded), the
workspace is persisted and hydrated as a tar made inside the sandbox, and a run is
resumed by reattaching to the same sandbox while it is alive.

:class:`KernelPython` is what none of the SDK's own clients offer: a capability that
gives the agent the sandbox's **stateful Python kernel** (``python_executor``) — state
kept across calls, plots returned as images the model sees.  For an ordinary ``Agent``,
:func:`function_tools` turns a sandbox's tools into ``FunctionTool`` s.
"""

from __future__ import annotations

import io
import os
import shlex
import uuid
from pathlib import Path
from typing import Any, Literal

from .._extras import require_extra

with require_extra("openai-agents", "kernel_sandbox.integrations.openai_agents"):
    from agents import FunctionTool, RunContextWrapper
    from agents.sandbox import Capability, Manifest
    from agents.sandbox.errors import (
        ExecTimeoutError,
        ExecTransportError,
        WorkspaceArchiveWriteError,
        WorkspaceReadNotFoundError,
    )
    from agents.sandbox.session import SandboxSession, SandboxSessionState
    from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
    from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
    from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
    from agents.sandbox.types import ExecResult, User
    from agents.tool import Tool as AgentsTool
    from agents.tool import ToolOutputImage, ToolOutputText

from ..config import SandboxConfig
from ..errors import SandboxError, SandboxNotFoundError
from ..notebook.recorder import NotebookRecorder, new_session_path
from ..notebook.storage import sessions_dir
from ..sandbox import AsyncSandbox
from ..tools import ToolResult, ToolSet

__all__ = [
    "KernelPython",
    "KernelSandboxClient",
    "KernelSandboxClientOptions",
    "KernelSandboxSession",
    "KernelSandboxSessionState",
    "function_tools",
    "tool_output",
]

#: Where the workspace tar is staged inside the sandbox while it is persisted/hydrated.
_ARCHIVE = "/tmp/.kernel-sandbox-workspace.tar"


def tool_output(result: ToolResult) -> list[ToolOutputText | ToolOutputImage]:
    """A tool result for the model: the compact JSON, then each image it can see."""
    parts: list[ToolOutputText | ToolOutputImage] = [ToolOutputText(text=result.model_dump_json())]
    for part in result.image_parts():
        parts.append(ToolOutputImage(image_url=part["image_url"]["url"]))
    return parts


def function_tools(toolset: ToolSet, names: list[str] | None = None) -> list[AgentsTool]:
    """The toolset's tools (or the ``names`` among them) as Agents SDK ``FunctionTool`` s.

    The schemas are the toolset's own strict ones; every call goes through
    :meth:`ToolSet.execute`, so bad arguments and failures come back as error results
    the model reads, never as exceptions in the run.
    """
    schemas = toolset.schema_map("responses")
    tools: list[AgentsTool] = []
    for name in names or toolset.names:
        schema = schemas[name]

        async def invoke(
            ctx: RunContextWrapper[Any], arguments: str, name: str = name
        ) -> list[ToolOutputText | ToolOutputImage]:
            return tool_output(await toolset.execute(name, arguments))

        tools.append(
            FunctionTool(
                name=name,
                description=schema["description"],
                params_json_schema=schema["parameters"],
                on_invoke_tool=invoke,
                strict_json_schema=bool(schema.get("strict", True)),
            )
        )
    return tools


class KernelSandboxClientOptions(BaseSandboxClientOptions):
    """How a run's sandbox is made: ``SandboxConfig`` settings and the kernel host.

    ``config`` takes any :class:`~kernel_sandbox.config.SandboxConfig` field (``image``,
    ``memory_limit``, ``network``, ...); ``host`` names the kernel host (``"docker"``,
    ``"kubernetes"``).  The working directory is the manifest's root.
    """

    type: Literal["kernel_sandbox"] = "kernel_sandbox"
    config: dict[str, Any] = {}
    host: str = "docker"


class KernelSandboxSessionState(SandboxSessionState):
    """What the SDK persists of a run's sandbox: its id and how it was made."""

    type: Literal["kernel_sandbox"] = "kernel_sandbox"
    sandbox_id: str = ""
    config: dict[str, Any] = {}
    host: str = "docker"
    notebook: str = ""


class KernelSandboxSession(BaseSandboxSession):
    """One run's sandbox, driven through :class:`~kernel_sandbox.sandbox.AsyncSandbox`."""

    state: KernelSandboxSessionState

    def __init__(
        self,
        *,
        state: KernelSandboxSessionState,
        sandbox: AsyncSandbox,
        recorder: NotebookRecorder | None = None,
    ) -> None:
        self.state = state
        self.sandbox = sandbox
        self.recorder = recorder

    async def _exec_internal(
        self, *command: str | Path, timeout: float | None = None
    ) -> ExecResult:
        try:
            result = await self.sandbox.run_shell(
                shlex.join(str(part) for part in command),
                timeout=timeout,
                cwd=self.state.manifest.root,
            )
        except SandboxError as exc:
            raise ExecTransportError(command=command, cause=exc) from exc
        if result.timed_out:
            raise ExecTimeoutError(command=command, timeout_s=timeout)
        return ExecResult(
            stdout=result.stdout.encode(), stderr=result.stderr.encode(), exit_code=result.exit_code
        )

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        target = self.normalize_path(path)
        try:
            return io.BytesIO(await self.sandbox.files.read(str(target)))
        except SandboxError as exc:
            if not await self.sandbox.files.exists(str(target)):
                raise WorkspaceReadNotFoundError(path=Path(path)) from exc
            raise

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        payload = data.read()
        target = self.normalize_path(path, for_write=True)
        await self.sandbox.files.write(
            str(target), payload if isinstance(payload, bytes | str) else bytes(payload)
        )

    async def running(self) -> bool:
        return not self.sandbox.closed

    async def persist_workspace(self) -> io.IOBase:
        root = shlex.quote(self.state.manifest.root)
        made = await self.sandbox.run_shell(f"tar -C {root} -cf {_ARCHIVE} .")
        if not made.ok:
            raise WorkspaceArchiveWriteError(
                path=Path(self.state.manifest.root), context={"stderr": made.stderr[-2000:]}
            )
        try:
            return io.BytesIO(await self.sandbox.files.read(_ARCHIVE))
        finally:
            await self.sandbox.files.remove(_ARCHIVE)

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        await self.sandbox.files.write(_ARCHIVE, data.read())
        root = shlex.quote(self.state.manifest.root)
        done = await self.sandbox.run_shell(
            f"tar -C {root} -xf {_ARCHIVE}; s=$?; rm -f {_ARCHIVE}; exit $s"
        )
        if not done.ok:
            raise WorkspaceArchiveWriteError(
                path=Path(self.state.manifest.root), context={"stderr": done.stderr[-2000:]}
            )

    async def _shutdown_backend(self) -> None:
        if self.recorder is not None:
            self.recorder.finish("completed", "the Agents SDK run ended")
            self.recorder = None
        await self.sandbox.close()


class KernelSandboxClient(BaseSandboxClient[KernelSandboxClientOptions | None]):
    """Sandbox Agents' client for kernel_sandbox sandboxes (each run recorded).

    ``record_dir`` is where each sandbox's session notebook goes (default
    ``sessions_dir("agents-sessions")``, under ``~/.local/share/kernel-sandbox``).
    """

    backend_id = "kernel_sandbox"
    supports_default_options = True

    def __init__(self, *, record_dir: str | os.PathLike[str] | None = None) -> None:
        default = sessions_dir("agents-sessions")
        self.record_dir = Path(record_dir) if record_dir is not None else default

    async def create(
        self,
        *,
        snapshot: SnapshotSpec | SnapshotBase | None = None,
        manifest: Manifest | None = None,
        options: KernelSandboxClientOptions | None = None,
    ) -> SandboxSession:
        options = options or KernelSandboxClientOptions()
        manifest = self._validate_manifest_for_create(manifest or Manifest())
        session_id = uuid.uuid4()
        config = {**options.config, "working_dir": manifest.root}
        sandbox = await AsyncSandbox.create(SandboxConfig(**config), host=options.host)
        notebook = new_session_path(self.record_dir, "agents")
        state = KernelSandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            sandbox_id=sandbox.id,
            config=config,
            host=options.host,
            notebook=str(notebook),
        )
        return self._wrap_session(self._session(state, sandbox))

    def _session(
        self, state: KernelSandboxSessionState, sandbox: AsyncSandbox
    ) -> KernelSandboxSession:
        recorder = NotebookRecorder.attach(sandbox, state.notebook, title="OpenAI Agents SDK run")
        return KernelSandboxSession(state=state, sandbox=sandbox, recorder=recorder)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        inner = session._inner
        if not isinstance(inner, KernelSandboxSession):
            raise TypeError("KernelSandboxClient.delete expects a KernelSandboxSession")
        await inner.shutdown()
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        """The same sandbox while it runs (variables kept); else a new one that the SDK
        hydrates from the state's workspace snapshot."""
        if not isinstance(state, KernelSandboxSessionState):
            raise TypeError("KernelSandboxClient.resume expects a KernelSandboxSessionState")
        config = SandboxConfig(**state.config)
        try:
            sandbox = await AsyncSandbox.adopt(state.sandbox_id, config, host=state.host)
        except SandboxNotFoundError:
            sandbox = await AsyncSandbox.create(config, host=state.host)
            state = state.model_copy(
                update={"sandbox_id": sandbox.id, "workspace_root_ready": False}
            )
        return self._wrap_session(self._session(state, sandbox))

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, KernelSandboxSessionState)


class KernelPython(Capability):
    """The sandbox's stateful Python kernel as the agent's ``python_executor`` tool.

    Variables, imports and loaded data stay between calls, as in a notebook; plots
    come back as images the model sees.  Bound to a :class:`KernelSandboxSession`.
    """

    type: Literal["kernel_python"] = "kernel_python"
    #: ``python_executor``'s options (``timeout``, ``max_timeout``, ``max_output_chars``).
    options: dict[str, Any] = {}

    def tools(self) -> list[AgentsTool]:
        inner = getattr(self.session, "_inner", self.session)
        if not isinstance(inner, KernelSandboxSession):
            raise ValueError("KernelPython needs a KernelSandboxClient session")
        toolset = ToolSet(inner.sandbox, {"python_executor": self.options})
        return function_tools(toolset, ["python_executor"])

    async def instructions(self, manifest: Manifest) -> str | None:
        return (
            "python_executor runs Python in a persistent Jupyter kernel: variables, imports "
            "and data stay between calls, so build on earlier results instead of recomputing "
            "them; matplotlib figures come back as images."
        )
