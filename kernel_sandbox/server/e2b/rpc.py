"""What both envd Connect services share: the sandbox of a call, and errors as codes.

A call's sandbox comes from E2B's routing headers and its envd access token
(:meth:`~.state.E2bRegistry.resolve`); our errors become Connect error codes that
E2B's SDK maps onto its own exceptions (``NOT_FOUND`` -> ``NotFoundException``,
``INVALID_ARGUMENT`` -> ``InvalidArgumentException``, ``UNAUTHENTICATED`` ->
``AuthenticationException``, ...).  Connect's own runtime (``connectrpc``, the library
E2B's SDK speaks through) handles the wire: JSON or protobuf bodies, envelopes,
server streams, deadlines, and the cap on a request message's size.  A body that
does not decode is the caller's ``INVALID_ARGUMENT`` (:data:`CODECS`), as envd's
connect-go says it, not the ``unknown`` (HTTP 500) of an exception nobody meant.
"""

from __future__ import annotations

import asyncio
from typing import Any

from connectrpc.code import Code
from connectrpc.codec import Codec, proto_binary_codec, proto_json_codec
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext

from ...errors import (
    AccessDeniedError,
    CapacityError,
    FileOperationError,
    FileOperationTimeoutError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxNotFoundError,
)
from ..tenancy import Lease
from .state import ENVD_PORT, E2bRegistry, E2bSandbox

__all__ = ["CODECS", "call_deadline", "connect_error", "deadline_passed", "resolve"]


class _CallersCodec:
    """One of Connect's codecs, whose failure to decode a request is the caller's."""

    def __init__(self, codec: Codec[Any, Any]) -> None:
        self._codec = codec

    def name(self) -> str:
        return self._codec.name()

    def encode(self, message: Any) -> bytes:
        return self._codec.encode(message)

    def decode(self, data: bytes | bytearray, message_class: type[Any]) -> Any:
        try:
            return self._codec.decode(data, message_class)
        except ConnectError:
            raise
        except Exception as exc:  # anything the decoder of a client's bytes raises
            raise ConnectError(
                Code.INVALID_ARGUMENT, f"unmarshal into {message_class.__name__}: {exc}"
            ) from exc


#: The codecs both services speak (protobuf and JSON), bad bodies answered as bad input.
CODECS: tuple[Codec[Any, Any], ...] = (
    _CallersCodec(proto_binary_codec()),
    _CallersCodec(proto_json_codec()),
)


def call_deadline(ctx: RequestContext[Any, Any]) -> float | None:
    """When the call's ``Connect-Timeout-Ms`` passes (loop time), None without one."""
    left = ctx.timeout_ms
    return None if left is None else asyncio.get_running_loop().time() + left / 1000


def deadline_passed() -> ConnectError:
    """What a stream ends with at its call's deadline (envd's: the handler's context)."""
    return ConnectError(Code.DEADLINE_EXCEEDED, "the call's timeout passed (Connect-Timeout-Ms)")


def connect_error(exc: SandboxError) -> ConnectError:
    """Our error as the Connect error E2B's SDK expects for it."""
    if isinstance(exc, AccessDeniedError):
        return ConnectError(Code.UNAUTHENTICATED, str(exc))
    if isinstance(exc, SandboxFileNotFoundError):
        return ConnectError(Code.NOT_FOUND, str(exc))
    if isinstance(exc, SandboxNotFoundError):  # the sandbox, as E2B's proxy says it
        return ConnectError(Code.UNAVAILABLE, str(exc))
    if isinstance(exc, CapacityError):
        return ConnectError(Code.RESOURCE_EXHAUSTED, str(exc))
    if isinstance(exc, FileOperationTimeoutError):  # as envd's handler past its context's
        return ConnectError(Code.DEADLINE_EXCEEDED, str(exc))
    if isinstance(exc, FileOperationError):
        return ConnectError(Code.INVALID_ARGUMENT, str(exc))
    return ConnectError(Code.UNAVAILABLE, str(exc))


async def resolve(registry: E2bRegistry, ctx: RequestContext[Any, Any]) -> tuple[E2bSandbox, Lease]:
    """The sandbox an envd call is for (its token checked), or a Connect error."""
    try:
        record, lease = await registry.resolve(ctx.request_headers, port=ENVD_PORT)
    except SandboxError as exc:
        raise connect_error(exc) from exc
    lease.sandbox.check_open()
    return record, lease
