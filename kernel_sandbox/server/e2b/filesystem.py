"""envd's ``filesystem.Filesystem`` service: stat, list, mkdir, move, remove, watch.

Every call is a process beside the kernel as the sandbox user, like every file
operation of ours: ``Remove`` is :meth:`AsyncFiles.remove <kernel_sandbox.files.AsyncFiles.remove>`
itself, the rest run ``programs/e2b_files.py`` (E2B's entries carry owner, mode, times
and link targets that our own listing does not).  The host's protected paths (the
kernel's connection) are refused whatever link leads there.  Listings are capped at
``E2B_LIST_LIMIT`` entries, depths at ``E2B_MAX_DEPTH``.

Watching a directory is inotify inside the sandbox, one process per watcher (at most
``E2B_MAX_WATCHERS`` per sandbox): ``WatchDir`` streams its events; ``CreateWatcher``
keeps up to ``E2B_WATCHER_EVENTS`` of them for ``GetWatcherEvents`` (the sync SDK's
way), dropping the oldest past that.  Events are named as envd's (fsnotify's) are: a
file the file API wrote is created, chmod-ed and written, as envd's upload makes it; a
recursive watcher lists a directory that appears (at most ``E2B_WATCH_SCAN_ENTRIES``
entries) so what was made in it before its own watch began is told as created.  Entries
of symlinks carry their target's type and the path they resolve to, as envd's do; every
entry carries its metadata (its ``user.e2b.*`` xattrs, up to ``E2B_ENTRY_METADATA_BYTES``)
and, asked with ``include_entry``, each event its entry where the path still exists.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import posixpath
import secrets
from collections.abc import AsyncIterator
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from protobuf import Oneof
from protobuf.wkt import Timestamp

from ...errors import SandboxError, SandboxFileNotFoundError
from ...kernel.programs import program
from ...limits import (
    E2B_ENTRY_BYTES,
    E2B_ENTRY_METADATA_BYTES,
    E2B_FILE_OP_DEADLINE,
    E2B_LIST_LIMIT,
    E2B_MAX_DEPTH,
    E2B_MAX_FRAME,
    E2B_MAX_WATCHERS,
    E2B_SUBSCRIBER_QUEUE,
    E2B_WATCH_SCAN_ENTRIES,
    E2B_WATCHER_EVENTS,
)
from ...sandbox import AsyncSandbox
from .envd.filesystem import filesystem_pb as pb
from .envd.filesystem.filesystem_connect import Filesystem, FilesystemASGIApplication
from .rpc import CODECS, call_deadline, connect_error, deadline_passed, resolve
from .state import E2bRegistry, E2bSandbox

__all__ = ["FilesystemService", "Watcher", "build_filesystem_app", "entry_info"]

_PROGRAM = program("e2b_files.py")
#: Runs the helper with the sandbox's Python, isolated (``-I``): a module in the working
#: directory (the sandbox's) never runs in place of its imports, nor of its path checks.
_RUN = 'p=/opt/venv/bin/python; [ -x "$p" ] || p=python3; exec "$p" -I -c "$0" "$1"'
#: The helper's exit statuses (``programs/e2b_files.py``) as Connect's codes.
_CODES = {
    3: Code.NOT_FOUND,
    4: Code.INVALID_ARGUMENT,  # not a directory
    5: Code.INVALID_ARGUMENT,  # a request the file system refuses
    6: Code.INVALID_ARGUMENT,  # the host's protected paths
    7: Code.PERMISSION_DENIED,
    8: Code.RESOURCE_EXHAUSTED,
    9: Code.ALREADY_EXISTS,
}
_TYPES = {"file": pb.FileType.FILE, "directory": pb.FileType.DIRECTORY}
_EVENTS = {
    "create": pb.EventType.CREATE,
    "write": pb.EventType.WRITE,
    "remove": pb.EventType.REMOVE,
    "rename": pb.EventType.RENAME,
    "chmod": pb.EventType.CHMOD,
}


#: Seconds between keep-alives of a quiet ``WatchDir`` stream.
_WATCH_KEEPALIVE = 50.0

#: E2B's name for its sandboxes' user: what the sandbox's own user is called in entries.
E2B_USER = "user"


def entry_info(found: dict[str, Any], sandbox: AsyncSandbox) -> pb.EntryInfo:
    """A JSON entry of the helper as E2B's ``EntryInfo`` (the sandbox's user, who runs
    every E2B call, named as E2B names it)."""
    target = found.get("symlink_target")
    ours = sandbox.config.user
    owner, group = (
        E2B_USER if str(found[k]) == ours else str(found[k]) for k in ("owner", "group")
    )
    return pb.EntryInfo(
        name=str(found["name"]),
        type=_TYPES.get(str(found["type"]), pb.FileType.UNSPECIFIED),
        path=str(found["path"]),
        size=int(found["size"]),
        mode=int(found["mode"]),
        permissions=str(found["permissions"]),
        owner=E2B_USER if owner == ours else owner,
        group=E2B_USER if group == ours else group,
        modified_time=Timestamp.from_nanos(int(found["mtime_ns"])),
        symlink_target=str(target) if target is not None else None,
        metadata={str(k): str(v) for k, v in (found.get("metadata") or {}).items()},
    )


def _refusal(code: int, stderr: str, path: str) -> ConnectError:
    message = stderr.strip().splitlines()[-1] if stderr.strip() else f"cannot use {path}"
    return ConnectError(_CODES.get(code, Code.INTERNAL), message)


async def helper(sandbox: AsyncSandbox, op: str, path: str, most: int, **fields: Any) -> list[Any]:
    """Run one op of the helper as the sandbox user; its JSON lines (at most ``most``)."""
    spec = {
        "op": op,
        "path": path,
        "protected": list(sandbox.host.protected_paths),
        "meta_bytes": E2B_ENTRY_METADATA_BYTES,
        **fields,
    }
    try:
        result = await sandbox.host.exec(
            ["sh", "-c", _RUN, _PROGRAM, json.dumps(spec)],
            max_output_bytes=most * E2B_ENTRY_BYTES,
            deadline=E2B_FILE_OP_DEADLINE,
        )
    except SandboxError as exc:
        raise connect_error(exc) from exc
    if result.exit_code != 0:
        raise _refusal(result.exit_code, result.stderr.decode(errors="replace"), path)
    if result.truncated_bytes:
        raise ConnectError(Code.RESOURCE_EXHAUSTED, f"the listing of {path} is too large")
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


class Watcher:
    """One directory watched inside the sandbox (a process running inotify)."""

    def __init__(
        self, sandbox: AsyncSandbox, path: str, recursive: bool, keep: int, entries: bool = False
    ) -> None:
        self.id = secrets.token_hex(8)
        self.path = path
        self._sandbox = sandbox
        self._recursive = recursive
        self._entries = entries
        #: Events not taken yet (non-streaming watchers), the oldest dropped past ``keep``.
        self.kept: collections.deque[pb.FilesystemEvent] = collections.deque(maxlen=keep)
        self.queue: asyncio.Queue[pb.FilesystemEvent | None] = asyncio.Queue(E2B_SUBSCRIBER_QUEUE)
        self._streaming = keep == 0
        self._pending = bytearray()
        self._ready = asyncio.get_running_loop().create_future()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start watching; raises the helper's refusal (no such directory, ...)."""
        self._task = asyncio.create_task(self._run())
        await asyncio.shield(self._ready)

    async def _run(self) -> None:
        spec = {
            "op": "watch",
            "path": self.path,
            "recursive": self._recursive,
            "scan": E2B_WATCH_SCAN_ENTRIES,
            "entry": self._entries,
            "meta_bytes": E2B_ENTRY_METADATA_BYTES,
            "protected": list(self._sandbox.host.protected_paths),
        }
        try:
            result = await self._sandbox.host.exec_stream(
                ["sh", "-c", _RUN, _PROGRAM, json.dumps(spec)],
                stdout=self._feed,
                max_output_bytes=1 << 16,
            )
            if not self._ready.done():
                stderr = result.stderr.decode(errors="replace")
                self._ready.set_exception(_refusal(result.exit_code, stderr, self.path))
        except (SandboxError, ValueError) as exc:
            if not self._ready.done():
                self._ready.set_exception(ConnectError(Code.INTERNAL, str(exc)))
        finally:
            if self._streaming:
                await self.queue.put(None)

    async def _feed(self, piece: bytes) -> None:
        self._pending += piece
        if len(self._pending) > E2B_MAX_FRAME:
            raise ValueError("the watcher's helper sent a line past E2B_MAX_FRAME")
        while b"\n" in self._pending:
            line, _, rest = bytes(self._pending).partition(b"\n")
            self._pending = bytearray(rest)
            found = json.loads(line)
            if found.get("start"):
                if not self._ready.done():
                    self._ready.set_result(None)
                continue
            if "name" not in found:
                continue  # the helper's heartbeat
            event = pb.FilesystemEvent(
                name=str(found["name"]),
                type=_EVENTS.get(str(found["type"]), pb.EventType.WRITE),
                entry=entry_info(found["entry"], self._sandbox) if "entry" in found else None,
            )
            if self._streaming:
                await self.queue.put(event)
            else:
                self.kept.append(event)

    def take(self) -> list[pb.FilesystemEvent]:
        """The events kept since the last call (non-streaming watchers)."""
        events = list(self.kept)
        self.kept.clear()
        return events

    async def stop(self) -> None:
        """Stop watching (the helper ends when its next write finds no reader)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task


class FilesystemService(Filesystem):
    """The ``filesystem.Filesystem`` Connect service over the E2B registry."""

    def __init__(self, registry: E2bRegistry) -> None:
        self.registry = registry

    async def stat(
        self, request: pb.StatRequest, ctx: RequestContext[pb.StatRequest, pb.StatResponse]
    ) -> pb.StatResponse:
        """One entry's information."""
        _, lease = await resolve(self.registry, ctx)
        path = _path(lease.sandbox, request.path)
        found = await helper(lease.sandbox, "stat", path, 1)
        return pb.StatResponse(entry=entry_info(found[0], lease.sandbox))

    async def make_dir(
        self, request: pb.MakeDirRequest, ctx: RequestContext[pb.MakeDirRequest, pb.MakeDirResponse]
    ) -> pb.MakeDirResponse:
        """Create a directory and its parents (``ALREADY_EXISTS`` if it is there)."""
        _, lease = await resolve(self.registry, ctx)
        path = _path(lease.sandbox, request.path)
        found = await helper(lease.sandbox, "mkdir", path, 1)
        lease.recorder.add_file_operation("mkdir", path)
        return pb.MakeDirResponse(entry=entry_info(found[0], lease.sandbox))

    async def move(
        self, request: pb.MoveRequest, ctx: RequestContext[pb.MoveRequest, pb.MoveResponse]
    ) -> pb.MoveResponse:
        """Rename an entry (the destination's folders are made)."""
        _, lease = await resolve(self.registry, ctx)
        source = _path(lease.sandbox, request.source)
        target = _path(lease.sandbox, request.destination)
        found = await helper(lease.sandbox, "move", source, 1, destination=target)
        lease.recorder.add_file_operation("move", f"{source} -> {target}")
        return pb.MoveResponse(entry=entry_info(found[0], lease.sandbox))

    async def list_dir(
        self, request: pb.ListDirRequest, ctx: RequestContext[pb.ListDirRequest, pb.ListDirResponse]
    ) -> pb.ListDirResponse:
        """A directory's entries, ``depth`` levels down (1: its own entries)."""
        _, lease = await resolve(self.registry, ctx)
        path = _path(lease.sandbox, request.path)
        depth = min(max(request.depth, 1), E2B_MAX_DEPTH)
        found = await helper(
            lease.sandbox, "list", path, E2B_LIST_LIMIT + 1, depth=depth, limit=E2B_LIST_LIMIT
        )
        if len(found) > E2B_LIST_LIMIT:
            raise ConnectError(
                Code.RESOURCE_EXHAUSTED,
                f"{path} holds more than {E2B_LIST_LIMIT} entries at depth {depth} (the "
                "server's cap, E2B_LIST_LIMIT); list a smaller part",
            )
        # as envd walks: each directory's entries by name, a directory's own below it
        found.sort(key=lambda e: str(e["path"]).split("/"))
        return pb.ListDirResponse(entries=[entry_info(e, lease.sandbox) for e in found])

    async def remove(
        self, request: pb.RemoveRequest, ctx: RequestContext[pb.RemoveRequest, pb.RemoveResponse]
    ) -> pb.RemoveResponse:
        """Remove a file or a directory with everything in it (nothing there: done, as
        envd's remove-all answers)."""
        _, lease = await resolve(self.registry, ctx)
        try:
            await lease.sandbox.files.remove(_path(lease.sandbox, request.path))
        except SandboxFileNotFoundError:
            pass
        except SandboxError as exc:
            raise connect_error(exc) from exc
        return pb.RemoveResponse()

    async def _watcher(
        self,
        record: E2bSandbox,
        sandbox: AsyncSandbox,
        request: pb.WatchDirRequest | pb.CreateWatcherRequest,
        keep: int,
    ) -> Watcher:
        if len(record.watchers) >= E2B_MAX_WATCHERS:
            raise ConnectError(
                Code.RESOURCE_EXHAUSTED,
                f"this sandbox has {E2B_MAX_WATCHERS} watchers already (the server's cap, "
                "E2B_MAX_WATCHERS); stop one first",
            )
        # allow_network_mounts: nothing is refused here for being a network mount
        path = _path(sandbox, request.path)
        watcher = Watcher(sandbox, path, request.recursive, keep, request.include_entry)
        record.watchers[watcher.id] = watcher
        try:
            await watcher.start()
        except BaseException:
            record.watchers.pop(watcher.id, None)
            await watcher.stop()
            raise
        return watcher

    async def watch_dir(
        self,
        request: pb.WatchDirRequest,
        ctx: RequestContext[pb.WatchDirRequest, pb.WatchDirResponse],
    ) -> AsyncIterator[pb.WatchDirResponse]:
        """A directory's events as they happen, until the client closes the stream or its
        timeout passes (``DEADLINE_EXCEEDED``, as envd's)."""
        record, lease = await resolve(self.registry, ctx)
        async with self.registry.tenancy.use(record.owner, lease.id):
            watcher = await self._watcher(record, lease.sandbox, request, 0)
            try:
                start = pb.WatchDirResponse.StartEvent()
                yield pb.WatchDirResponse(event=Oneof(field="start", value=start))  # type: ignore[arg-type]
                loop, deadline = asyncio.get_running_loop(), call_deadline(ctx)
                while True:
                    wait = _WATCH_KEEPALIVE
                    if deadline is not None:
                        wait = min(wait, deadline - loop.time())
                        if wait <= 0:  # the SDK's watch timeout (60 s unless given)
                            raise deadline_passed()
                    try:
                        event = await asyncio.wait_for(watcher.queue.get(), wait)
                    except TimeoutError:
                        if deadline is None or loop.time() < deadline:
                            alive = pb.WatchDirResponse.KeepAlive()
                            yield pb.WatchDirResponse(event=Oneof(field="keepalive", value=alive))  # type: ignore[arg-type]
                        continue
                    if event is None:
                        return
                    yield pb.WatchDirResponse(event=Oneof(field="filesystem", value=event))  # type: ignore[arg-type]
            finally:
                record.watchers.pop(watcher.id, None)
                await watcher.stop()

    async def create_watcher(
        self,
        request: pb.CreateWatcherRequest,
        ctx: RequestContext[pb.CreateWatcherRequest, pb.CreateWatcherResponse],
    ) -> pb.CreateWatcherResponse:
        """Start a watcher whose events ``GetWatcherEvents`` collects."""
        record, lease = await resolve(self.registry, ctx)
        watcher = await self._watcher(record, lease.sandbox, request, E2B_WATCHER_EVENTS)
        return pb.CreateWatcherResponse(watcher_id=watcher.id)

    async def get_watcher_events(
        self,
        request: pb.GetWatcherEventsRequest,
        ctx: RequestContext[pb.GetWatcherEventsRequest, pb.GetWatcherEventsResponse],
    ) -> pb.GetWatcherEventsResponse:
        """The events a watcher saw since the last call."""
        record, _ = await resolve(self.registry, ctx)
        watcher = record.watchers.get(request.watcher_id)
        if watcher is None:
            raise ConnectError(Code.NOT_FOUND, f"watcher {request.watcher_id!r} not found")
        return pb.GetWatcherEventsResponse(events=watcher.take())

    async def remove_watcher(
        self,
        request: pb.RemoveWatcherRequest,
        ctx: RequestContext[pb.RemoveWatcherRequest, pb.RemoveWatcherResponse],
    ) -> pb.RemoveWatcherResponse:
        """Stop a watcher."""
        record, _ = await resolve(self.registry, ctx)
        watcher = record.watchers.pop(request.watcher_id, None)
        if watcher is None:
            raise ConnectError(Code.NOT_FOUND, f"watcher {request.watcher_id!r} not found")
        await watcher.stop()
        return pb.RemoveWatcherResponse()


def _path(sandbox: AsyncSandbox, path: str) -> str:
    if not path or len(path) > 4096:
        raise ConnectError(Code.INVALID_ARGUMENT, "a path of 1 to 4096 characters is required")
    try:
        return posixpath.normpath(sandbox.resolve_path(path))
    except SandboxError as exc:
        raise connect_error(exc) from exc


def build_filesystem_app(registry: E2bRegistry, read_max_bytes: int) -> FilesystemASGIApplication:
    """The service as an ASGI app (Connect over HTTP/1.1, JSON and protobuf bodies)."""
    return FilesystemASGIApplication(
        FilesystemService(registry), read_max_bytes=read_max_bytes, codecs=CODECS
    )
