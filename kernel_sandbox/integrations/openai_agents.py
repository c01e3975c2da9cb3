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

import asyncio
import contextlib
import io
import logging
import os
import shlex
import time
import uuid
import weakref
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .._extras import require_extra

with require_extra("openai-agents", "kernel_sandbox.integrations.openai_agents"):
    from agents import FunctionTool, RunContextWrapper
    from agents.sandbox import Capability, Manifest
    from agents.sandbox.errors import (
        ExecTimeoutError,
        ExecTransportError,
        WorkspaceArchiveReadError,
        WorkspaceArchiveWriteError,
        WorkspaceReadNotFoundError,
    )
    from agents.sandbox.materialization import MaterializationResult
    from agents.sandbox.session import (
        Dependencies,
        Instrumentation,
        SandboxSession,
        SandboxSessionState,
    )
    from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
    from agents.sandbox.session.pty_output import collect_pty_output
    from agents.sandbox.session.pty_types import (
        PtyExecUpdate,
        allocate_pty_process_id,
        clamp_pty_yield_time_ms,
        process_id_to_prune_from_meta,
        resolve_pty_write_yield_time_ms,
    )
    from agents.sandbox.session.runtime_helpers import (
        RESOLVE_WORKSPACE_PATH_HELPER,
        RuntimeHelperScript,
    )
    from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
    from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
    from agents.sandbox.types import ExecResult, User
    from agents.tool import Tool as AgentsTool
    from agents.tool import ToolOutputImage, ToolOutputText

from ..config import SandboxConfig
from ..errors import SandboxError, SandboxNotFoundError
from ..limits import PTY_MAX_PROCESSES, PTY_UPDATE_BYTES
from ..notebook.recorder import NotebookRecorder, new_session_path
from ..notebook.storage import sessions_dir
from ..processes import InteractiveProcess
from ..sandbox import AsyncSandbox
from ..snapshots import SnapshotStore, default_store
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

log = logging.getLogger(__name__)

#: Where the workspace tar is staged inside the sandbox while it is persisted/hydrated.
_ARCHIVE = "/tmp/.kernel-sandbox-workspace.tar"

#: The sandboxes this process's clients hold, by id: a resume of one of them (its state
#: handed to a run while its first session is still open) takes the same sandbox, as no
#: second owner can adopt it beside this one.
_LIVE: weakref.WeakValueDictionary[str, AsyncSandbox] = weakref.WeakValueDictionary()


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
    #: Keep the kernel's variables when a run resumes in a new sandbox (the old one
    #: gone): each persist of the workspace also takes a portable snapshot.
    kernel_state: bool = True


class KernelSandboxSessionState(SandboxSessionState):
    """What the SDK persists of a run's sandbox: its id and how it was made."""

    type: Literal["kernel_sandbox"] = "kernel_sandbox"
    sandbox_id: str = ""
    config: dict[str, Any] = {}
    host: str = "docker"
    notebook: str = ""
    kernel_state: bool = True
    #: The id of the last portable snapshot of the kernel, in the client's store.
    kernel_snapshot: str = ""


@dataclass
class _Pty:
    """One of a session's interactive processes, as the SDK's PTY calls see it."""

    process: InteractiveProcess
    last_used: float = field(default_factory=time.monotonic)
    #: Output taken from the process but not yet returned (an incomplete UTF-8 tail).
    chunks: deque[bytes] = field(default_factory=deque)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class KernelSandboxSession(BaseSandboxSession):
    """One run's sandbox, driven through :class:`~kernel_sandbox.sandbox.AsyncSandbox`.

    PTY: ``exec_command`` and ``write_stdin`` (the SDK's ``Shell`` capability) run
    :class:`~kernel_sandbox.processes.InteractiveProcess` es beside the kernel, on a
    terminal when asked (``tty=True``): a REPL or a prompt keeps running between calls,
    at most :data:`~kernel_sandbox.limits.PTY_MAX_PROCESSES` at once.
    """

    state: KernelSandboxSessionState

    def __init__(
        self,
        *,
        state: KernelSandboxSessionState,
        sandbox: AsyncSandbox,
        recorder: NotebookRecorder | None = None,
        store: SnapshotStore | None = None,
    ) -> None:
        self.state = state
        self.sandbox = sandbox
        self.recorder = recorder
        self.store = store
        self._pty: dict[int, _Pty] = {}
        self._pty_lock = asyncio.Lock()

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

    def supports_pty(self) -> bool:
        return True

    async def pty_exec_start(
        self,
        *command: str | Path,
        timeout: float | None = None,
        shell: bool | list[str] = True,
        user: str | User | None = None,
        tty: bool = False,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        argv = self._prepare_exec_command(*command, shell=shell, user=None)  # one user
        process = InteractiveProcess(self.sandbox, argv, cwd=self.state.manifest.root, tty=tty)
        try:
            await process.start()
        except SandboxError as exc:
            raise ExecTransportError(command=command, cause=exc) from exc
        async with self._pty_lock:
            process_id = allocate_pty_process_id(set(self._pty))
            pruned = self._pty_to_prune()
            self._pty[process_id] = _Pty(process)
        if pruned is not None:
            await pruned.process.kill()
        yield_ms = 10_000 if yield_time_s is None else int(yield_time_s * 1000)
        return await self._pty_update(
            process_id, clamp_pty_yield_time_ms(yield_ms), max_output_tokens
        )

    async def pty_write_stdin(
        self,
        *,
        session_id: int,
        chars: str,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        async with self._pty_lock:
            entry = self._resolve_pty_session_entry(pty_processes=self._pty, session_id=session_id)
        if chars:
            if not entry.process.tty:
                raise RuntimeError("stdin is not available for this process")
            with contextlib.suppress(SandboxError):  # ended meanwhile: the update says how
                await entry.process.write(chars.encode())
        entry.last_used = time.monotonic()
        yield_ms = 250 if yield_time_s is None else int(yield_time_s * 1000)
        wait = resolve_pty_write_yield_time_ms(yield_time_ms=yield_ms, input_empty=not chars)
        return await self._pty_update(session_id, wait, max_output_tokens)

    async def pty_terminate_all(self) -> None:
        async with self._pty_lock:
            entries = list(self._pty.values())
            self._pty.clear()
        await asyncio.gather(*(entry.process.kill() for entry in entries))

    def _pty_to_prune(self) -> _Pty | None:
        """The process to end before one more starts (the SDK's choice), if at the cap."""
        if len(self._pty) < PTY_MAX_PROCESSES:
            return None
        meta = [(pid, e.last_used, e.process.ended) for pid, e in self._pty.items()]
        chosen = process_id_to_prune_from_meta(meta)
        return self._pty.pop(chosen, None) if chosen is not None else None

    async def _pty_update(
        self, process_id: int, yield_ms: int, max_output_tokens: int | None
    ) -> PtyExecUpdate:
        """What the process printed within ``yield_ms`` (or until it ended)."""
        entry = self._pty[process_id]
        process = entry.process
        taken = 0  # at most PTY_UPDATE_BYTES per update: the rest waits in the process

        async def poll(deadline: float) -> None:
            nonlocal taken
            if taken < PTY_UPDATE_BYTES and (piece := await process.take(PTY_UPDATE_BYTES - taken)):
                taken += len(piece)
                entry.chunks.append(piece)

        def finished() -> bool:
            return process.ended and not process.unread

        output, tokens, _ = await collect_pty_output(
            output_chunks=entry.chunks,
            output_lock=entry.lock,
            output_notify=asyncio.Event(),
            is_done=lambda: taken >= PTY_UPDATE_BYTES or finished(),
            yield_time_ms=yield_ms,
            max_output_tokens=max_output_tokens,
            poll_output=poll,
            wait_for_output=process.wait_output,
        )
        if not finished() or entry.chunks:
            return PtyExecUpdate(process_id, output, None, tokens)
        async with self._pty_lock:
            self._pty.pop(process_id, None)
        await process.kill()  # ended: waits until it is recorded
        return PtyExecUpdate(None, output, process.exit_code, tokens)

    # Paths: the SDK's check inside the sandbox (its helper resolves symlinks there), as
    # its remote providers do, so a link in the workspace cannot lead a read, write,
    # listing or removal outside the root and its grants.
    def _runtime_helpers(self) -> tuple[RuntimeHelperScript, ...]:
        return (RESOLVE_WORKSPACE_PATH_HELPER,)

    def _current_runtime_helper_cache_key(self) -> object | None:
        return self.state.sandbox_id

    async def _validate_path_access(self, path: Path | str, *, for_write: bool = False) -> Path:
        return await self._validate_remote_path_access(path, for_write=for_write)

    async def _apply_manifest(
        self, *, only_ephemeral: bool = False, provision_accounts: bool = True
    ) -> MaterializationResult:
        _refuse_accounts(self.state.manifest)
        return await super()._apply_manifest(
            only_ephemeral=only_ephemeral, provision_accounts=provision_accounts
        )

    async def provision_manifest_accounts(self) -> None:
        _refuse_accounts(self.state.manifest)
        await super().provision_manifest_accounts()

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        target = await self._validate_path_access(path)
        try:
            return io.BytesIO(await self.sandbox.files.read(str(target)))
        except SandboxError as exc:
            if not await self.sandbox.files.exists(str(target)):
                raise WorkspaceReadNotFoundError(path=Path(path), cause=exc) from exc
            raise WorkspaceArchiveReadError(path=Path(path), cause=exc) from exc

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        payload = data.read()
        target = await self._validate_path_access(path, for_write=True)
        try:
            await self.sandbox.files.write(
                str(target), payload if isinstance(payload, bytes | str) else bytes(payload)
            )
        except SandboxError as exc:
            raise WorkspaceArchiveWriteError(path=target, cause=exc) from exc

    async def running(self) -> bool:
        return not self.sandbox.closed

    async def persist_workspace(self) -> io.IOBase:
        await self._snapshot_kernel()
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

    async def _snapshot_kernel(self) -> None:
        """A portable snapshot of the kernel's variables (and files) for a resume in a
        new sandbox; the previous one is removed.  A failure is logged, never raised:
        the workspace is persisted all the same."""
        if not self.state.kernel_state or self.store is None:
            return
        try:
            snap = await self.sandbox.snapshot(
                f"agents-{self.state.session_id}", exact=False, store=self.store
            )
        except SandboxError as exc:
            log.warning("the kernel of sandbox %s was not snapshotted: %s", self.sandbox.id, exc)
            return
        previous, self.state.kernel_snapshot = self.state.kernel_snapshot, snap.id
        if previous:
            with contextlib.suppress(SandboxError, OSError):
                await self.store.delete(previous)

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


def _refuse_accounts(manifest: Manifest) -> None:
    if manifest.users or manifest.groups:
        raise ValueError(
            "KernelSandboxSession does not support manifest users or groups: a sandbox runs "
            "everything as its one unprivileged user, which cannot add accounts"
        )


class KernelSandboxClient(BaseSandboxClient[KernelSandboxClientOptions | None]):
    """Sandbox Agents' client for kernel_sandbox sandboxes (each run recorded).

    ``record_dir`` is where each sandbox's session notebook goes (default
    ``sessions_dir("agents-sessions")``, under ``~/.local/share/kernel-sandbox``).
    ``instrumentation`` and ``dependencies`` are the SDK's, as every shipped client takes
    them: the sandbox events' sinks, and the values its capabilities resolve per session.
    """

    backend_id = "kernel_sandbox"
    supports_default_options = True

    def __init__(
        self,
        *,
        record_dir: str | os.PathLike[str] | None = None,
        snapshot_store: SnapshotStore | None = None,
        instrumentation: Instrumentation | None = None,
        dependencies: Dependencies | None = None,
    ) -> None:
        self._instrumentation = instrumentation
        self._dependencies = dependencies
        default = sessions_dir("agents-sessions")
        self.record_dir = Path(record_dir) if record_dir is not None else default
        self.snapshot_store = snapshot_store or default_store()

    async def create(
        self,
        *,
        snapshot: SnapshotSpec | SnapshotBase | None = None,
        manifest: Manifest | None = None,
        options: KernelSandboxClientOptions | None = None,
    ) -> SandboxSession:
        options = options or KernelSandboxClientOptions()
        manifest = self._validate_manifest_for_create(manifest or Manifest())
        _refuse_accounts(manifest)  # before a sandbox is made for it
        shared = [g.path for g in manifest.extra_path_grants if g.host_path is not None]
        if shared:
            raise ValueError(
                f"KernelSandboxClient does not support sandbox path grant host_path for "
                f"{shared[0]!r}: no host directory is mounted into a running sandbox; omit "
                "host_path (a path of the sandbox itself) or copy the files in"
            )
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
            kernel_state=options.kernel_state,
        )
        return self._wrap_session(
            self._session(state, sandbox), instrumentation=self._instrumentation
        )

    def _session(
        self, state: KernelSandboxSessionState, sandbox: AsyncSandbox
    ) -> KernelSandboxSession:
        _LIVE[sandbox.id] = sandbox
        recorder = next(
            (
                r
                for r in sandbox.listeners
                if isinstance(r, NotebookRecorder) and str(r.path) == state.notebook
            ),
            None,
        ) or NotebookRecorder.attach(sandbox, state.notebook, title="OpenAI Agents SDK run")
        return KernelSandboxSession(
            state=state, sandbox=sandbox, recorder=recorder, store=self.snapshot_store
        )

    async def delete(self, session: SandboxSession) -> SandboxSession:
        inner = session._inner
        if not isinstance(inner, KernelSandboxSession):
            raise TypeError("KernelSandboxClient.delete expects a KernelSandboxSession")
        await inner.shutdown()
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        """The same sandbox while it runs (variables kept) — this process's own object
        for it when one of its sessions holds it, else adopted —; else a new one restored
        from the kernel's last snapshot (variables and files back, where it has one)
        that the SDK then hydrates from the state's workspace snapshot."""
        if not isinstance(state, KernelSandboxSessionState):
            raise TypeError("KernelSandboxClient.resume expects a KernelSandboxSessionState")
        config = SandboxConfig(**state.config)
        live = _LIVE.get(state.sandbox_id)
        if live is not None and not live.closed:
            return self._wrap_session(
                self._session(state, live), instrumentation=self._instrumentation
            )
        try:
            sandbox = await AsyncSandbox.adopt(state.sandbox_id, config, host=state.host)
        except SandboxNotFoundError:
            sandbox = await self._restored(state, config)
            state = state.model_copy(
                update={"sandbox_id": sandbox.id, "workspace_root_ready": False}
            )
        return self._wrap_session(
            self._session(state, sandbox), instrumentation=self._instrumentation
        )

    async def _restored(
        self, state: KernelSandboxSessionState, config: SandboxConfig
    ) -> AsyncSandbox:
        """A new sandbox: from the kernel's snapshot when there is one, else empty."""
        if state.kernel_snapshot:
            try:
                return await AsyncSandbox.restore(
                    state.kernel_snapshot, store=self.snapshot_store, host=state.host
                )
            except (SandboxError, OSError) as exc:
                log.warning("snapshot %s not restored: %s", state.kernel_snapshot, exc)
        return await AsyncSandbox.create(config, host=state.host)

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
