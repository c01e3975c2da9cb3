"""Per-call environment variables (``/execute``'s ``env_vars``) in each kernel language.

E2B sets them for one execution only: the kernel's environment has them while the code
runs and is as before afterwards.  A kernel's environment can only be changed from
inside it, so each language gets two cells, run in the same kernel as the code: one that
keeps the variables' old values in the kernel and sets the new ones, one that puts the
old values back (or removes what was not set).  Names must be environment variable
names; values are quoted as the language's string literals.
"""

from __future__ import annotations

import json
import re
import shlex

from ...errors import ConfigError

__all__ = ["restore_code", "set_code", "supported"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: Where the old values are kept in the kernel between the two cells.
_KEPT = "_kernel_sandbox_env"


def _checked(values: dict[str, str]) -> dict[str, str]:
    bad = [name for name in values if not _NAME.match(name)]
    if bad:
        raise ConfigError(f"env_vars: {bad[0][:64]!r} is not an environment variable name")
    return values


def _literal(value: str) -> str:
    """A string literal Python, R and JavaScript all read as ``value``."""
    return json.dumps(value)


def supported(language: str) -> bool:
    """Whether per-call variables can be set in a kernel of ``language``."""
    return language in _SET


def set_code(language: str, values: dict[str, str]) -> str:
    """The cell that keeps the old values of ``values``' names and sets the new ones."""
    return _SET[language](_checked(values))


def restore_code(language: str, values: dict[str, str]) -> str:
    """The cell that puts back what :func:`set_code` kept."""
    return _RESTORE[language](_checked(values))


def _python_set(values: dict[str, str]) -> str:
    names = [_literal(name) for name in values]
    pairs = ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in values.items())
    return (
        "import os as _os\n"
        f"{_KEPT} = {{_k: _os.environ.get(_k) for _k in [{', '.join(names)}]}}\n"
        f"_os.environ.update({{{pairs}}})\n"
        "del _os"
    )


def _python_restore(values: dict[str, str]) -> str:
    return (
        "import os as _os\n"
        f"for _k, _v in {_KEPT}.items():\n"
        "    _os.environ.pop(_k, None) if _v is None else _os.environ.__setitem__(_k, _v)\n"
        f"del _os, _k, _v, {_KEPT}"
    )


def _r_set(values: dict[str, str]) -> str:
    names = ", ".join(_literal(name) for name in values)
    pairs = ", ".join(f"{_literal(k)} = {_literal(v)}" for k, v in values.items())
    return (
        f".{_KEPT} <- Sys.getenv(c({names}), unset = NA, names = TRUE)\n"
        f"invisible(do.call(Sys.setenv, list({pairs})))"
    )


def _r_restore(values: dict[str, str]) -> str:
    return (
        f"for (.k in names(.{_KEPT})) {{\n"
        f"  .v <- .{_KEPT}[[.k]]\n"
        "  if (is.na(.v)) Sys.unsetenv(.k) else do.call(Sys.setenv, setNames(list(.v), .k))\n"
        "}\n"
        f"rm(.k, .v, .{_KEPT})"
    )


def _js_set(values: dict[str, str]) -> str:
    names = ", ".join(_literal(name) for name in values)
    return (
        f"globalThis.{_KEPT} = Object.fromEntries([{names}].map((k) => [k, Deno.env.get(k)]));\n"
        + "".join(f"Deno.env.set({_literal(k)}, {_literal(v)});\n" for k, v in values.items())
    )


def _js_restore(values: dict[str, str]) -> str:
    return (
        f"for (const [k, v] of Object.entries(globalThis.{_KEPT})) {{\n"
        "  if (v === undefined) Deno.env.delete(k); else Deno.env.set(k, v);\n"
        "}\n"
        f"delete globalThis.{_KEPT};"
    )


def _bash_set(values: dict[str, str]) -> str:
    lines = []
    for name, value in values.items():
        kept = f"{_KEPT}_{name}"
        lines.append(
            f'{kept}_set=${{{name}+x}}; {kept}="${{{name}-}}"; export {name}={shlex.quote(value)}'
        )
    return "\n".join(lines)


def _bash_restore(values: dict[str, str]) -> str:
    lines = []
    for name in values:
        kept = f"{_KEPT}_{name}"
        lines.append(
            f'if [ -n "${kept}_set" ]; then export {name}="${kept}"; else unset {name}; fi; '
            f"unset {kept} {kept}_set"
        )
    return "\n".join(lines)


_SET = {
    "python": _python_set,
    "r": _r_set,
    "javascript": _js_set,
    "typescript": _js_set,
    "bash": _bash_set,
}
_RESTORE = {
    "python": _python_restore,
    "r": _r_restore,
    "javascript": _js_restore,
    "typescript": _js_restore,
    "bash": _bash_restore,
}
