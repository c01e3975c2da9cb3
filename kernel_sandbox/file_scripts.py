"""The shell scripts ``sandbox.files`` runs inside the sandbox, as the sandbox user.

Each takes the path as ``$1`` and reports a refusal by its exit status (the constants
below), which :class:`~kernel_sandbox.files.AsyncFiles` turns into a clear error.  They
are ``sh -c`` scripts run by :meth:`~kernel_sandbox.backends.base.KernelHost.exec`, so
they use only POSIX sh, coreutils, find and realpath, which every image has.
"""

from __future__ import annotations

import shlex

__all__ = [
    "COMMIT",
    "IS_DIR",
    "LIST",
    "MISSING",
    "MKDIR",
    "NOT_DIR",
    "NOT_FILE",
    "PROTECTED",
    "READ",
    "READ_STREAM",
    "REMOVE",
    "TOO_LARGE",
    "WRITE",
    "WRITE_TEMP",
    "prelude",
]

# Exit statuses of the scripts below.
MISSING, NOT_DIR, IS_DIR, PROTECTED, NOT_FILE, TOO_LARGE = 3, 4, 5, 6, 7, 8

# ``fail`` exits with a status; a write's ``fail`` first drains its input: the engine
# resets a connection whose input was not read, and the reason would be lost.
_EXIT = 'fail() { exit "$1"; }; '
_DRAIN_EXIT = 'fail() { cat >/dev/null; exit "$1"; }; '
# Sizes come from find, not coreutils' stat: gVisor's runsc of 2022-12 refuses the statx
# flag that coreutils 9 passes (AT_NO_AUTOMOUNT) with EINVAL.
_READ_CHECKS = (
    f'test -e "$1" || exit {MISSING}; test -d "$1" && exit {IS_DIR}; '
    f'test -f "$1" || exit {NOT_FILE}; s=$(find -L "$1" -prune -printf %s) || exit 1; '
    f'if [ "$s" -gt "$2" ]; then echo "$s" >&2; exit {TOO_LARGE}; fi; '
)
# one byte more than allowed tells a file that grew since (or lied about its size)
READ = _READ_CHECKS + 'exec head -c "$(($2 + 1))" -- "$1"'
# A stream starts with the size on a line of its own, once the file is open: what
# fails later (it shrank, grew) is told by the count.
READ_STREAM = _READ_CHECKS + 'exec 3< "$1" || exit 1; echo "$s"; exec head -c "$(($2 + 1))" <&3'
# A write's target is a regular file or nothing yet; its folder is made.
_WRITE_CHECKS = (
    f'test -d "$1" && fail {IS_DIR}; test -e "$1" && ! test -f "$1" && fail {NOT_FILE}; '
    'mkdir -p -- "$(dirname -- "$1")" || fail 1; '
)
# $2 is the temporary file (beside $1, so the rename is atomic), $3 the mode; a new
# file gets the umask's mode, a replaced one keeps its own.
WRITE_TEMP = _WRITE_CHECKS + (
    'set -C; : > "$2" || fail 1; set +C; '
    'if [ -e "$1" ]; then chmod --reference="$1" -- "$2" || fail 1; fi; '
    'if [ "$3" = append ] && [ -e "$1" ]; then cat -- "$1" >> "$2" || fail 1; fi; '
    'cat >> "$2"'
)
COMMIT = f'test -d "$1" && exit {IS_DIR}; exec mv -fT -- "$2" "$1"'
WRITE = _WRITE_CHECKS + (
    'if [ "$2" = append ]; then cat >> "$1" || fail $?; else cat > "$1" || fail $?; fi'
)
# '/' separates the fields and NUL ends an entry: neither can be in a file name.
LIST = (
    f'test -e "$1" || exit {MISSING}; test -d "$1" || exit {NOT_DIR}; '
    'find "$1" -mindepth 1 -maxdepth 1 -printf \'%y/%s/%f\\0\' | head -zn "$2"'
)
REMOVE = f'test -e "$1" || test -L "$1" || exit {MISSING}; rm -rf -- "$1"'
MKDIR = 'mkdir -p -- "$1"'


def prelude(protected: tuple[str, ...], drain: bool) -> str:
    """What every script starts with: ``fail`` (draining stdin first for a write) and
    the refusal of a ``$1`` that resolves into one of the host's ``protected`` paths."""
    start = _DRAIN_EXIT if drain else _EXIT
    if not protected:
        return start
    cases = "|".join(f"{shlex.quote(p)}|{shlex.quote(p)}/*" for p in protected)
    return start + (
        'r=$(realpath -m -- "$1" 2>/dev/null || readlink -f -- "$1"); '
        f'case "$r" in {cases}) fail {PROTECTED};; esac; '
    )
