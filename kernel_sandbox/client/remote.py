"""RemoteSandbox: a sandbox on a ``kernel-sandbox serve`` host, with the local API.

::

    async with await RemoteSandbox.create("http://host:8000", api_key="...") as sb:
        ex = await sb.run_python("x = 41; x + 1")          # an Execution, as locally
        await sb.files.write("data.csv", "a,b\\n1,2\\n")
        print(ex.text, (await sb.run_shell("ls")).stdout)

Method names, signatures and result types are those of
:class:`~kernel_sandbox.AsyncSandbox` (a parity test keeps them so); ``on_output``
sees each output as the kernel sends it (Server-Sent Events).  Events go to
``listeners`` as locally, so a :class:`~kernel_sandbox.NotebookRecorder`, a
:class:`~kernel_sandbox.ToolSet` and the agent loop work over it unchanged.  Server
errors become the same ``SandboxError`` subclasses a local sandbox raises.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import posixpath
import time
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx2

from ..config import PING_TIMEOUT, SandboxConfig
from ..contexts import Context, KernelSpecInfo
from ..errors import (
    ConfigError,
    ContextNotFoundError,
    FileOperationError,
    SandboxClosedError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxNotFoundError,
    SnapshotError,
    SnapshotNotFoundError,
)
from ..events import Listener, PythonExecuted, ShellExecuted, emit
from ..kernel.client import OutputCallback
from ..limits import LIST_LIMIT, MAX_EVENT_BYTES, MAX_SNAPSHOT_BYTES
from ..results import CommandResult, Execution, FileInfo
from ..snapshots import Snapshot
from ..transfer import AsyncReadStream, download_file, upload_file
from ..wire import command_from, execution_from, file_info_from

__all__ = ["RemoteFiles", "RemoteSandbox", "RemoteSnapshots", "raise_for"]


def _headers(api_key: str | None) -> dict[str, str]:
    return {"X-API-Key": api_key} if api_key else {}


def raise_for(response: httpx2.Response, what: str) -> None:
    """Turn an error response into the ``SandboxError`` a local call would raise."""
    if response.status_code < 400:
        return
    try:
        detail = response.json().get("detail", response.text)
    except ValueError:
        detail = response.text
    message = f"{what}: {detail} (HTTP {response.status_code})"
    status = response.status_code
    if status == 404 and "file" in str(detail).lower():
        raise SandboxFileNotFoundError(message)
    if status == 404 and "snapshot" in str(detail).lower():
        raise SnapshotNotFoundError(message)
    if status == 409:
        raise SnapshotError(message)
    if status == 404 and "no context" in str(detail).lower():
        raise ContextNotFoundError(message)
    if status == 404:
        raise SandboxNotFoundError(message)
    if status in (400, 413, 422, 429):
        raise (FileOperationError if "file" in what else ConfigError)(message)
    if status == 401:
        raise ConfigError(f"{message}; pass the server's api_key")
    raise SandboxError(message)


class RemoteFiles:
    """``sandbox.files`` of a remote sandbox: the methods of :class:`~kernel_sandbox.AsyncFiles`."""

    def __init__(self, sandbox: RemoteSandbox) -> None:
        self._sb = sandbox

    def _url(self) -> str:
        return f"/v1/sandboxes/{self._sb.id}/file"

    async def read(self, path: str) -> bytes:
        """The file's bytes (at most the sandbox's ``max_file_bytes``)."""
        response = await self._sb._request(
            "GET", self._url(), f"read {path}", params={"path": self._sb.resolve_path(path)}
        )
        return response.content

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """The file decoded as text."""
        return (await self.read(path)).decode(encoding)

    async def write(self, path: str, data: bytes | str, encoding: str = "utf-8") -> None:
        """Create or replace a file (parent directories are created)."""
        body = data.encode(encoding) if isinstance(data, str) else data
        where = {"path": self._sb.resolve_path(path)}
        await self._sb._request("PUT", self._url(), f"write {path}", content=body, params=where)

    async def append(self, path: str, data: bytes | str, encoding: str = "utf-8") -> None:
        """Append to a file (created if missing)."""
        body = data.encode(encoding) if isinstance(data, str) else data
        where = {"path": self._sb.resolve_path(path), "append": "true"}
        await self._sb._request("PUT", self._url(), f"append {path}", content=body, params=where)

    async def list(self, path: str = ".", limit: int = LIST_LIMIT) -> list[FileInfo]:
        """The entries of a directory; more than ``limit`` are refused, as locally."""
        response = await self._sb._request(
            "GET",
            f"/v1/sandboxes/{self._sb.id}/list",
            f"list {path}",
            params={"path": path, "limit": limit},
        )
        return [file_info_from(row) for row in response.json()]

    async def exists(self, path: str) -> bool:
        """Whether the path exists."""
        response = await self._sb._request(
            "GET", f"/v1/sandboxes/{self._sb.id}/exists", f"exists {path}", params={"path": path}
        )
        return bool(response.json()["exists"])

    async def remove(self, path: str) -> None:
        """Remove a file or directory."""
        where = {"path": self._sb.resolve_path(path)}
        await self._sb._request("DELETE", self._url(), f"remove {path}", params=where)

    async def mkdir(self, path: str) -> None:
        """Create a directory and its parents."""
        await self._sb._request(
            "POST", f"/v1/sandboxes/{self._sb.id}/mkdir", f"mkdir {path}", json={"path": path}
        )

    async def read_stream(self, path: str, max_bytes: int | None = None) -> AsyncReadStream:
        """The file as a stream, as the server sends it (refusals raise here)."""
        sb = self._sb
        sb.check_open()
        where = {"path": sb.resolve_path(path)}
        try:
            response = await sb._client.send(
                sb._client.build_request("GET", self._url(), params=where), stream=True
            )
        except httpx2.HTTPError as exc:
            raise SandboxError(
                f"read {path}: the server at {sb.url} cannot be reached: {exc}"
            ) from exc
        if response.status_code >= 400:
            await response.aread()
            await response.aclose()
            raise_for(response, f"read file {path}")
        size = int(response.headers.get("content-length", "-1"))
        if max_bytes is not None and size > max_bytes:
            await response.aclose()
            raise FileOperationError(f"{path} is {size} bytes, more than max_bytes={max_bytes}")

        async def pieces() -> AsyncIterator[bytes]:
            try:
                async for piece in response.aiter_bytes():
                    yield piece
            except httpx2.HTTPError as exc:  # the server ended it short: the file changed
                raise FileOperationError(f"read {path}: the transfer broke: {exc}") from exc
            finally:
                await response.aclose()

        return AsyncReadStream(size, pieces())

    async def write_stream(
        self,
        path: str,
        chunks: AsyncIterable[bytes],
        *,
        append: bool = False,
        max_bytes: int | None = None,
    ) -> int:
        """Create or replace (``append``: add to) a file from chunks, sent as they come.

        The server writes a temporary file and renames it once whole; past ``max_bytes``
        (or the server's cap) the upload is broken off and nothing changes.
        """
        where = {"path": self._sb.resolve_path(path), **({"append": "true"} if append else {})}

        async def capped() -> AsyncIterator[bytes]:
            sent = 0
            async for chunk in chunks:
                sent += len(chunk)
                if max_bytes is not None and sent > max_bytes:
                    # raised, not returned: an ended body would be a complete, short file
                    raise FileOperationError(f"{path}: more than max_bytes={max_bytes} to send")
                yield chunk

        operation = "append" if append else "write"
        response = await self._sb._request(
            "PUT", self._url(), f"{operation} file {path}", content=capped(), params=where
        )
        return int(response.json()["bytes"])

    async def upload(self, local: str | Path, remote: str) -> None:
        """Copy a local file into the sandbox, streamed."""
        await upload_file(self, local, remote)

    async def download(self, remote: str, local: str | Path) -> None:
        """Copy a sandbox file here, streamed (parent directories are created)."""
        await download_file(self, remote, local)


class RemoteSandbox:
    """A sandbox served by ``kernel-sandbox serve``, used like an ``AsyncSandbox``."""

    def __init__(
        self, url: str, api_key: str | None, view: dict[str, Any], client: httpx2.AsyncClient
    ) -> None:
        self.url = url.rstrip("/")
        self.id: str = view["id"]
        self.image: str = view["image"]
        self.config = SandboxConfig.model_validate(
            {k: v for k, v in view["config"].items() if k in SandboxConfig.model_fields}
        )
        self.files = RemoteFiles(self)
        self.created_at = time.time()
        #: Called with every :mod:`~kernel_sandbox.events` event, as on a local sandbox.
        self.listeners: list[Listener] = []
        #: The container lives on the server's engine; no local handle.
        self.container_id: str | None = None
        self._client = client
        self._api_key = api_key
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------

    @classmethod
    async def create(
        cls,
        url: str,
        config: SandboxConfig | None = None,
        *,
        api_key: str | None = None,
        timeout: float = 600.0,
        **overrides: Any,
    ) -> RemoteSandbox:
        """Start a sandbox on the server; ``overrides`` as for ``AsyncSandbox.create``.

        The server's policy applies (network, limits, images); what it changed is in
        the sandbox's notes.  ``pool=True`` takes a warm sandbox of the server's pool.
        """
        body: dict[str, Any] = {}
        if config is not None:
            body.update(config.model_dump(include=_CREATE_FIELDS, exclude_none=True))
        body.update(overrides)
        client = httpx2.AsyncClient(
            base_url=url, headers=_headers(api_key), timeout=httpx2.Timeout(timeout, connect=10)
        )
        try:
            response = await client.post("/v1/sandboxes", json=body)
            raise_for(response, "create a sandbox")
        except BaseException:
            await client.aclose()
            raise
        return cls(url, api_key, response.json(), client)

    @classmethod
    async def connect(
        cls,
        url: str,
        sandbox_id: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = 600.0,
    ) -> RemoteSandbox:
        """A sandbox of this key that exists already, or a new one without an id."""
        if sandbox_id is None:
            return await cls.create(url, api_key=api_key, timeout=timeout)
        client = httpx2.AsyncClient(
            base_url=url, headers=_headers(api_key), timeout=httpx2.Timeout(timeout, connect=10)
        )
        try:
            response = await client.get(f"/v1/sandboxes/{quote(sandbox_id, safe='')}")
            raise_for(response, f"connect to sandbox {sandbox_id}")
        except BaseException:
            await client.aclose()
            raise
        return cls(url, api_key, response.json(), client)

    async def close(self) -> None:
        """Remove the sandbox on the server (its notebook stays there).  Safe twice."""
        if self._closed:
            return
        self._closed = True
        try:
            response = await self._client.delete(f"/v1/sandboxes/{self.id}")
            if response.status_code != 404:
                raise_for(response, f"remove sandbox {self.id}")
        finally:
            await self._client.aclose()

    async def detach(self) -> None:
        """Let go of the sandbox without removing it (it stays on the server)."""
        if not self._closed:
            self._closed = True
            await self._client.aclose()

    async def __aenter__(self) -> RemoteSandbox:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    @property
    def working_dir(self) -> str:
        """Where relative paths start inside the sandbox."""
        return self.config.working_dir

    def check_open(self) -> None:
        """Raise :class:`SandboxClosedError` once the sandbox is closed."""
        if self._closed:
            raise SandboxClosedError(f"sandbox {self.id} is closed; create a new one")

    async def health(self) -> str | None:
        """None while the server still has this sandbox for this key, else why not."""
        if self._closed:
            return "it was closed"
        try:
            await self._request("GET", f"/v1/sandboxes/{self.id}", f"look up sandbox {self.id}")
        except SandboxError as exc:
            return str(exc)
        return None

    async def ping(self, timeout: float = PING_TIMEOUT) -> bool:
        """True when the server answers for this sandbox within ``timeout`` seconds."""
        try:
            return await asyncio.wait_for(self.health(), timeout) is None
        except TimeoutError:
            return False

    async def _request(self, method: str, path: str, what: str, **kwargs: Any) -> httpx2.Response:
        self.check_open()
        try:
            response = await self._client.request(method, path, **kwargs)
        except httpx2.HTTPError as exc:
            raise SandboxError(
                f"{what}: the server at {self.url} cannot be reached: {exc}"
            ) from exc
        raise_for(response, what)
        return response

    # -- python and shell --------------------------------------------------------------

    async def run_code(
        self,
        code: str,
        language: str | None = None,
        *,
        context: Context | str | None = None,
        timeout: float | None = None,
        on_output: Any = None,
    ) -> Execution:
        """Run code in a remote kernel (``context``, else the first of ``language``, else
        the sandbox's own); ``on_output`` sees outputs as they come."""
        context_id = context.id if isinstance(context, Context) else context
        body = {"code": code, "timeout": timeout, "language": language, "context": context_id}
        return await self._run(f"/v1/sandboxes/{self.id}/code", code, body, on_output)

    async def run_python(
        self, code: str, timeout: float | None = None, on_output: OutputCallback | None = None
    ) -> Execution:
        """Run code in the remote python kernel; ``on_output`` sees outputs as they come."""
        body = {"code": code, "timeout": timeout}
        return await self._run(f"/v1/sandboxes/{self.id}/python", code, body, on_output)

    async def _run(self, path: str, code: str, body: dict[str, Any], on_output: Any) -> Execution:
        wall = time.time()
        if on_output is None:
            response = await self._request("POST", path, "run_code", json=body)
            execution = execution_from(response.json())
        else:
            execution = await self._stream(path, body, on_output)
        if self.listeners:
            language = body.get("language") or "python"
            await emit(
                self.listeners,
                PythonExecuted(self.id, code, execution, wall, language=language),
            )
        return execution

    async def kernelspecs(self) -> dict[str, KernelSpecInfo]:
        """The Jupyter kernels the sandbox's image holds, by kernelspec name."""
        response = await self._request("GET", f"/v1/sandboxes/{self.id}/kernels", "kernelspecs")
        return {name: KernelSpecInfo(**spec) for name, spec in response.json().items()}

    async def languages(self) -> list[str]:
        """The languages the image has kernels for, sorted."""
        return sorted({spec.speaks for spec in (await self.kernelspecs()).values()})

    async def list_contexts(self) -> list[Context]:
        """The sandbox's own kernel, then every context made since."""
        response = await self._request("GET", f"/v1/sandboxes/{self.id}/contexts", "contexts")
        return [Context(**c) for c in response.json()]

    async def create_context(
        self, language: str | None = None, *, kernel: str | None = None, cwd: str | None = None
    ) -> Context:
        """Start another kernel in the remote sandbox (same files, its own variables)."""
        body = {"language": language, "kernel": kernel, "cwd": cwd}
        path = f"/v1/sandboxes/{self.id}/contexts"
        return Context(**(await self._request("POST", path, "create_context", json=body)).json())

    async def restart_context(self, context: Context | str) -> None:
        """Restart one context's kernel: its variables end, files stay."""
        context_id = context.id if isinstance(context, Context) else context
        path = f"/v1/sandboxes/{self.id}/contexts/{context_id}/restart"
        await self._request("POST", path, "restart_context")

    async def remove_context(self, context: Context | str) -> None:
        """End a context's kernel."""
        context_id = context.id if isinstance(context, Context) else context
        path = f"/v1/sandboxes/{self.id}/contexts/{context_id}"
        await self._request("DELETE", path, "remove_context")

    async def _stream(self, path: str, body: dict[str, Any], on_output: Any) -> Execution:
        if self._closed:
            raise SandboxClosedError(f"sandbox {self.id} is closed; create a new one")
        event, result = "", None
        try:
            async with self._client.stream("POST", path, json=body, params={"stream": "true"}) as r:
                if r.status_code >= 400:
                    await r.aread()
                    raise_for(r, "run_python")
                async for line in r.aiter_lines():
                    if len(line) > MAX_EVENT_BYTES:
                        raise SandboxError("run_python: an event from the server is too large")
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: "):
                        data = json.loads(line[6:])
                        if event == "output":
                            called = on_output(data)
                            if inspect.isawaitable(called):
                                await called
                        elif event == "result":
                            result = execution_from(data)
        except httpx2.HTTPError as exc:
            raise SandboxError(f"run_python: the stream from {self.url} broke: {exc}") from exc
        if result is None:
            raise SandboxError("run_python: the server ended the stream without a result")
        return result

    async def interrupt(self, context: Context | str | None = None) -> None:
        """Interrupt the running cell of a context (default: the sandbox's own kernel);
        variables stay."""
        context_id = context.id if isinstance(context, Context) else context
        params = {"context": context_id} if context_id else {}
        path = f"/v1/sandboxes/{self.id}/interrupt"
        await self._request("POST", path, "interrupt", params=params)

    async def restart(self) -> None:
        """Restart the kernel: variables and processes end, files stay."""
        await self._request("POST", f"/v1/sandboxes/{self.id}/restart", "restart")

    async def run_shell(
        self,
        command: str,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> CommandResult:
        """Run a shell command beside the kernel, as the sandbox user."""
        wall = time.time()
        body = {"command": command, "timeout": timeout, "cwd": cwd, "env": env}
        response = await self._request(
            "POST", f"/v1/sandboxes/{self.id}/shell", "run_shell", json=body
        )
        result = command_from(response.json())
        if self.listeners:
            await emit(self.listeners, ShellExecuted(self.id, command, result, wall, cwd))
        return result

    def resolve_path(self, path: str) -> str:
        """An absolute path in the sandbox; relative paths start at the working directory."""
        if "\0" in path:
            raise FileOperationError(f"a path cannot contain a NUL byte: {path!r}")
        return posixpath.normpath(posixpath.join(self.config.working_dir, path))

    # -- durable state ----------------------------------------------------------------

    async def snapshot(
        self,
        name: str | None = None,
        exact: bool | None = None,
        *,
        store: Any = None,
        tmp: bool = False,
        max_bytes: int = MAX_SNAPSHOT_BYTES,
    ) -> Snapshot:
        """Save the remote sandbox's state in the server's store (``store`` and
        ``max_bytes`` are the server's: its own cap applies)."""
        body = {"name": name, "exact": exact, "tmp": tmp}
        response = await self._request(
            "POST", f"/v1/sandboxes/{self.id}/snapshot", "snapshot", json=body
        )
        return Snapshot.from_json(response.json())

    @classmethod
    async def restore(
        cls,
        snapshot: Snapshot | str,
        *,
        store: RemoteSnapshots | None = None,
        host: str | None = None,
        **overrides: Any,
    ) -> RemoteSandbox:
        """A new sandbox on the server from one of the caller's snapshots; ``store``
        (a :class:`RemoteSnapshots`) says which server and key (``host`` is the
        server's choice, ``overrides`` are not taken: the snapshot's settings are)."""
        remote = _remote_store(store)
        snap_id = snapshot.id if isinstance(snapshot, Snapshot) else snapshot
        return await remote.open("POST", f"/v1/snapshots/{quote(snap_id, safe='')}/restore")

    async def fork(self, n: int, *, store: Any = None) -> list[RemoteSandbox]:
        """``n`` new sandboxes on the server with this one's state (child notebooks)."""
        response = await self._request(
            "POST", f"/v1/sandboxes/{self.id}/fork", "fork", json={"n": n}
        )
        return [
            type(self)(self.url, self._api_key, view, self._new_client())
            for view in response.json()
        ]

    async def pause(self, *, store: Any = None, tmp: bool = True) -> Snapshot:
        """Pause the remote sandbox (its container goes); any later call resumes it."""
        response = await self._request("POST", f"/v1/sandboxes/{self.id}/pause", "pause")
        return Snapshot.from_json(response.json())

    @classmethod
    async def resume(
        cls,
        sandbox_id: str,
        *,
        store: RemoteSnapshots | None = None,
        host: str | None = None,
        **overrides: Any,
    ) -> RemoteSandbox:
        """Bring a paused sandbox of the caller back now, under its id (any call would)."""
        remote = _remote_store(store)
        return await remote.open("POST", f"/v1/sandboxes/{quote(sandbox_id, safe='')}/resume")

    def _new_client(self) -> httpx2.AsyncClient:
        return _client(self.url, self._api_key, self._client.timeout.read or 600.0)

    async def notebook(self) -> dict[str, Any]:
        """The server's recorded notebook of this sandbox (nbformat JSON)."""
        response = await self._request("GET", f"/v1/sandboxes/{self.id}/notebook", "notebook")
        return response.json()  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<RemoteSandbox {self.id} at {self.url} image={self.image!r} {state}>"


def _client(url: str, api_key: str | None, timeout: float) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(
        base_url=url, headers=_headers(api_key), timeout=httpx2.Timeout(timeout, connect=10)
    )


def _remote_store(store: RemoteSnapshots | None) -> RemoteSnapshots:
    if not isinstance(store, RemoteSnapshots):
        raise ConfigError(
            "a remote restore or resume needs store=RemoteSnapshots(url, api_key=...): "
            "which server, and whose snapshots"
        )
    return store


class RemoteSnapshots:
    """The caller's snapshots on a server: list, get, delete, prune (``kernel-sandbox
    snapshots``), and where :meth:`RemoteSandbox.restore` / ``resume`` look."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout

    async def _call(self, method: str, path: str, what: str) -> httpx2.Response:
        async with _client(self.url, self.api_key, self.timeout) as client:
            try:
                response = await client.request(method, path)
            except httpx2.HTTPError as exc:
                raise SandboxError(
                    f"{what}: the server at {self.url} cannot be reached: {exc}"
                ) from exc
            raise_for(response, what)
            return response

    async def open(self, method: str, path: str) -> RemoteSandbox:
        """A sandbox the server answers with (restored or resumed), with its own client."""
        client = _client(self.url, self.api_key, self.timeout)
        try:
            response = await client.request(method, path)
            raise_for(response, path.rsplit("/", 1)[-1])
        except BaseException:
            await client.aclose()
            raise
        return RemoteSandbox(self.url, self.api_key, response.json(), client)

    async def list(self) -> list[Snapshot]:
        """The caller's snapshots on the server, oldest first."""
        response = await self._call("GET", "/v1/snapshots", "list snapshots")
        return [Snapshot.from_json(row) for row in response.json()]

    async def get(self, snapshot_id: str) -> Snapshot:
        """One snapshot's record."""
        path = f"/v1/snapshots/{quote(snapshot_id, safe='')}"
        return Snapshot.from_json((await self._call("GET", path, f"snapshot {snapshot_id}")).json())

    async def delete(self, snapshot_id: str) -> None:
        """Delete one of the caller's snapshots."""
        path = f"/v1/snapshots/{quote(snapshot_id, safe='')}"
        await self._call("DELETE", path, f"delete snapshot {snapshot_id}")


_CREATE_FIELDS = {
    "image",
    "timeout",
    "memory_limit",
    "cpu_limit",
    "disk_limit",
    "network_enabled",
    "network",
    "env_vars",
}


if TYPE_CHECKING:  # mypy holds the remote twins to the seams
    from ..protocols import FilesLike, SandboxLike

    def _is_sandbox_like(sandbox: RemoteSandbox) -> SandboxLike:
        return sandbox

    def _is_files_like(files: RemoteFiles) -> FilesLike:
        return files
