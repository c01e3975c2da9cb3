"""envd's ``/files`` routes: download and upload, as E2B's SDK moves files.

Both are our own streamed file transfer (:meth:`AsyncFiles.read_stream
<kernel_sandbox.files.AsyncFiles.read_stream>` / ``write_stream``): bytes move as the
sandbox user, a piece at a time, never held whole by the server, capped by the
server's ``max_upload_bytes``; an upload goes to a temporary file renamed over the
target once whole.  An upload is either ``application/octet-stream`` (``?path=``; a
``Content-Encoding: gzip`` body is inflated as it comes, the cap counting what it
inflates to) or ``multipart/form-data`` with up to ``E2B_MAX_UPLOAD_FILES`` files,
each named by its path.  ``username`` is accepted and every transfer is the sandbox
user's.  An upload's ``X-Metadata-*`` headers are its files' metadata, kept as envd keeps
it, in ``user.e2b.*`` xattrs (keys lowercased; at most ``E2B_ENTRY_METADATA_BYTES``); a
file uploaded again is a new file, without the old one's.  Errors have envd's shape,
``{"code", "message"}``.
"""

from __future__ import annotations

import contextlib
import re
import zlib
from collections.abc import AsyncIterable, AsyncIterator
from typing import Annotated, Any

from connectrpc.errors import ConnectError
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from starlette.datastructures import UploadFile

from ...errors import (
    AccessDeniedError,
    FileOperationError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxNotFoundError,
)
from ...limits import E2B_ENTRY_METADATA_BYTES, E2B_MAX_UPLOAD_FILES
from ..deps import Opts, status_of
from ..downloads import file_response
from .control import registry
from .filesystem import helper
from .models import e2b_error
from .state import ENVD_PORT

__all__ = ["router"]

router = APIRouter(prefix="/e2b/sandbox", tags=["e2b"])
PathQuery = Annotated[str | None, Query(max_length=4096)]


def _error(exc: SandboxError) -> Response:
    if isinstance(exc, AccessDeniedError):
        return e2b_error(401, str(exc))
    if isinstance(exc, SandboxFileNotFoundError):
        return e2b_error(404, str(exc))
    if isinstance(exc, SandboxNotFoundError):  # the sandbox: E2B's proxy answers 502
        return e2b_error(502, str(exc))
    if isinstance(exc, FileOperationError) and "larger than" in str(exc):
        return e2b_error(413, str(exc))
    return e2b_error(status_of(exc), str(exc))


_META_HEADER = "x-metadata-"
_META_KEY = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+\Z")
_META_VALUE = re.compile(r"[\x20-\x7e]*\Z")


def _metadata(request: Request) -> dict[str, str]:
    """The upload's ``X-Metadata-*`` headers (keys lowercased, as envd's), checked."""
    found = {
        name[len(_META_HEADER) :].lower(): value
        for name, value in request.headers.items()
        if name.lower().startswith(_META_HEADER)
    }
    for key, value in found.items():
        if not _META_KEY.match(key) or not _META_VALUE.match(value):
            raise ValueError(
                f"invalid metadata {key!r}: keys are HTTP tokens, values printable ASCII"
            )
    if sum(len(k) + len(v) for k, v in found.items()) > E2B_ENTRY_METADATA_BYTES:
        raise ValueError(
            f"the metadata is larger than {E2B_ENTRY_METADATA_BYTES} bytes (keys and values; "
            "the server's cap, E2B_ENTRY_METADATA_BYTES)"
        )
    return found


def _written(path: str, metadata: dict[str, str]) -> dict[str, Any]:
    made: dict[str, Any] = {"name": path.rsplit("/", 1)[-1], "type": "file", "path": path}
    if metadata:
        made["metadata"] = metadata
    return made


@router.get("/health", response_model=None)
async def health(request: Request) -> Response:
    """envd's health check: 204 while the sandbox runs."""
    try:
        await registry(request).resolve(request.headers, port=ENVD_PORT, token_required=False)
    except SandboxError as exc:
        return _error(exc)
    return Response(status_code=204)


@router.get("/files", response_model=None)
async def download(
    request: Request, opts: Opts, path: PathQuery = None, username: PathQuery = None
) -> Response:
    """A file's bytes, streamed as the sandbox sends them."""
    reg = registry(request)
    held = contextlib.AsyncExitStack()
    try:
        record, lease = await reg.resolve(request.headers, port=ENVD_PORT)
        if not path:
            raise FileOperationError("the path query parameter is required")
        await held.enter_async_context(reg.tenancy.use(record.owner, lease.id))
        stream = await lease.sandbox.files.read_stream(path, opts.max_upload_bytes)
    except SandboxError as exc:
        await held.aclose()
        return _error(exc)
    held.push_async_callback(stream.close)
    try:
        return await file_response(stream, held)
    except SandboxError as exc:  # a small file that changed while read (/proc, /sys)
        return _error(exc)


async def _inflated(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """A gzip body inflated as it comes (64 KiB of output at a time)."""
    inflater = zlib.decompressobj(wbits=31)
    async for chunk in chunks:
        data = chunk
        while data:
            out = inflater.decompress(data, 1 << 16)
            if out:
                yield out
            data = inflater.unconsumed_tail
    if tail := inflater.flush():
        yield tail


async def _upload_file(file: UploadFile) -> AsyncIterator[bytes]:
    while chunk := await file.read(1 << 20):
        yield chunk


@router.post("/files", response_model=None)
async def upload(
    request: Request, opts: Opts, path: PathQuery = None, username: PathQuery = None
) -> Response:
    """Write one file (octet-stream body) or several (multipart); their paths back."""
    reg = registry(request)
    try:
        record, lease = await reg.resolve(request.headers, port=ENVD_PORT)
    except SandboxError as exc:
        return _error(exc)
    files = lease.sandbox.files
    kind = request.headers.get("content-type", "")
    written: list[dict[str, Any]] = []

    async def wrote(target: str) -> None:
        # a new file (the upload renamed over the old one): no stale metadata to clear
        resolved = lease.sandbox.resolve_path(target)
        if metadata:
            try:
                await helper(lease.sandbox, "setmeta", resolved, 1, metadata=metadata)
            except ConnectError as exc:  # xattrs refused by the sandbox's filesystem
                message = f"cannot set the metadata of {resolved}: {exc.message}"
                raise FileOperationError(message) from exc
        written.append(_written(resolved, metadata))

    try:
        metadata = _metadata(request)
    except ValueError as exc:  # envd's answer to bad metadata
        return e2b_error(400, str(exc))
    try:
        async with reg.tenancy.use(record.owner, lease.id):
            if kind.startswith("multipart/form-data"):
                async with request.form(
                    max_files=E2B_MAX_UPLOAD_FILES, max_fields=E2B_MAX_UPLOAD_FILES
                ) as form:
                    uploads = [v for _, v in form.multi_items() if isinstance(v, UploadFile)]
                    for part in uploads:
                        target = _target(part.filename, path, len(uploads))
                        await files.write_stream(
                            target, _upload_file(part), max_bytes=opts.max_upload_bytes
                        )
                        await wrote(target)
            else:
                if not path:
                    raise FileOperationError("the path query parameter is required")
                body: AsyncIterable[bytes] = request.stream()
                if request.headers.get("content-encoding", "").lower() == "gzip":
                    body = _inflated(body)
                await files.write_stream(path, body, max_bytes=opts.max_upload_bytes)
                await wrote(path)
    except zlib.error as exc:
        return e2b_error(400, f"the gzip body could not be inflated: {exc}")
    except SandboxError as exc:
        return _error(exc)
    return JSONResponse(written)


def _target(filename: str | None, path: str | None, count: int) -> str:
    if count == 1 and path:
        return path
    if not filename:
        raise FileOperationError("a multipart file part needs its path as its filename")
    return filename
