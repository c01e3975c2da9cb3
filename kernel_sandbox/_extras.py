"""Optional parts of kernel_sandbox and the extras that install them.

The core install is what a sandbox on a local Docker engine needs.  Everything else is
an extra (``pip install 'kernel-sandbox[server]'``), imported only where it is used,
and every such place imports inside :func:`require_extra`: a missing module then raises
:class:`~kernel_sandbox.errors.MissingExtraError` naming the extra to install, never a
bare ``ModuleNotFoundError`` from deep inside a dependency.

``EXTRAS`` lists the top-level modules each extra brings (pyproject.toml lists the
distributions; ``tests/unit/test_extras.py`` keeps the two in step).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager

from .errors import MissingExtraError

__all__ = ["EXTRAS", "missing_modules", "require_extra"]

#: extra -> the top-level modules it installs that kernel_sandbox imports
EXTRAS: dict[str, tuple[str, ...]] = {
    "agent": ("openai", "tenacity"),
    "client": ("httpx2",),
    "server": ("fastapi", "starlette", "uvicorn", "mcp", "anyio", "connectrpc", "protobuf"),
    "kubernetes": ("kubernetes", "websocket"),
    "notebook": ("nbconvert", "PIL", "numpy"),
    "attach": ("jupyter_console",),
    "openai-agents": ("agents",),
    "langchain": ("langchain_core",),
    "smolagents": ("smolagents",),
}


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here (found without importing)."""
    missing = []
    for module in EXTRAS[extra]:
        try:
            found = importlib.util.find_spec(module) is not None
        except ValueError:  # in sys.modules as None, or without a spec
            found = False
        if not found:
            missing.append(module)
    return missing


def _error(extra: str, what: str, module: str) -> MissingExtraError:
    return MissingExtraError(
        f"{what} needs the '{extra}' extra ({module} is not installed): "
        f"pip install 'kernel-sandbox[{extra}]'",
        name=module,
    )


@contextmanager
def require_extra(extra: str, what: str) -> Iterator[None]:
    """Import an optional part inside this block; a missing module names ``extra``.

    On entry every module of the extra is looked up (cheaply, without importing), so a
    half-installed extra fails here rather than later; an import inside the block that
    fails on one of the extra's modules is turned into the same error.  ``what`` names
    the part for the message (``"kernel-sandbox serve"``, ``"host='kubernetes'"``).
    """
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; known: {', '.join(EXTRAS)}")
    missing = missing_modules(extra)
    if missing:
        raise _error(extra, what, missing[0])
    try:
        yield
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if isinstance(exc, MissingExtraError) or top not in EXTRAS[extra]:
            raise
        raise _error(extra, what, top) from exc
