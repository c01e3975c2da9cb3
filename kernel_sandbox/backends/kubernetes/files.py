"""File transfer through the exec API, as the pod's user (uid 1000, never root).

A read is ``head -c`` of a regular file after its size was checked, so a FIFO, a link to
``/dev/zero`` or a file that grows on the way cannot make the host wait or read more than
``max_bytes + 1``.  A write goes to a temporary file beside the target and is renamed
over it, so a full writable area leaves no half-written file; on any failure the rest
of the input is drained, so the sender is never left blocked.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ...errors import FileOperationError, SandboxFileNotFoundError
from ...results import format_size
from ..base import ExecResult

__all__ = ["read_file", "write_file"]

#: ``exec(argv, stdin=..., max_output_bytes=...)`` of one host.
Exec = Callable[..., Awaitable[ExecResult]]

# Exit statuses of the scripts below.
_MISSING, _IS_DIR, _NOT_FILE, _TOO_BIG, _UNREADABLE = 3, 4, 5, 6, 7
_READ = (
    'test -e "$1" || exit 3; test -d "$1" && exit 4; test -f "$1" || exit 5; '
    'test -r "$1" || exit 7; s=$(stat -L -c %s -- "$1") || exit 7; '
    '[ "$s" -gt "$2" ] && { echo "$s"; exit 6; }; exec head -c "$(($2 + 1))" -- "$1"'
)
_WRITE = (
    'p=$1; test -d "$p" && { cat >/dev/null; exit 4; }; d=$(dirname -- "$p"); '
    'mkdir -p -- "$d" || { cat >/dev/null; exit 8; }; t="$d/.kernel-sandbox-write.$$"; '
    'if cat > "$t"; then mv -f -- "$t" "$p" && exit 0; else cat >/dev/null; fi; '
    'rm -f -- "$t"; exit 9'
)
#: What a failing write script may say (its last line is kept).
_ERROR_OUTPUT = 64 * 1024


async def read_file(exec_: Exec, path: str, max_bytes: int) -> bytes:
    """The bytes of the regular file at ``path``; larger than ``max_bytes`` is refused."""
    result = await exec_(
        ["sh", "-c", _READ, "sh", path, str(max_bytes)], max_output_bytes=max_bytes + 1
    )
    code = result.exit_code
    if code == _TOO_BIG or (code == 0 and len(result.stdout) > max_bytes):
        size = result.stdout.decode(errors="replace").strip() if code == _TOO_BIG else ""
        what = f"{path} is {format_size(int(size))}" if size.isdigit() else f"{path} is larger"
        raise FileOperationError(
            f"{what}; files are read whole into memory and the limit is "
            f"{format_size(max_bytes)} (SandboxConfig.max_file_bytes): read a part with the "
            "shell (head -c, tail -c, split) or raise max_file_bytes"
        )
    if code != 0:
        raise _file_error(code, path, result.stderr, "read")
    return result.stdout


async def write_file(exec_: Exec, path: str, data: bytes) -> None:
    """Create or replace the file at ``path`` whole (see the module)."""
    result = await exec_(
        ["sh", "-c", _WRITE, "sh", path], stdin=data, max_output_bytes=_ERROR_OUTPUT
    )
    if result.exit_code != 0:
        raise _file_error(result.exit_code, path, result.stderr, "write")


def _file_error(code: int, path: str, stderr: bytes, action: str) -> FileOperationError:
    if code == _MISSING:
        return SandboxFileNotFoundError(f"no such file or directory in the sandbox: {path}")
    if code == _IS_DIR:
        return FileOperationError(f"is a directory, not a file: {path}")
    if code == _NOT_FILE:
        return FileOperationError(f"not a regular file: {path}")
    if code == _UNREADABLE:
        return FileOperationError(f"cannot {action} {path}: permission denied")
    text = stderr.decode(errors="replace").strip()
    detail = text.splitlines()[-1] if text else f"exit status {code}"
    if "no space left" in detail.lower():
        detail = "no space left on device"
    return FileOperationError(f"cannot {action} {path}: {detail}")
