"""The public surface: curated exports, one exception root, sync/async parity."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path
from types import ModuleType

import pytest

import kernel_sandbox
import kernel_sandbox.tools
from kernel_sandbox import errors
from kernel_sandbox.files import AsyncFiles
from kernel_sandbox.sandbox import AsyncSandbox
from kernel_sandbox.sync import Files, Sandbox


def test_all_is_sorted_unique_and_importable() -> None:
    names = kernel_sandbox.__all__
    assert len(names) == len(set(names))
    for name in names:
        assert getattr(kernel_sandbox, name) is not None


#: Names of a re-exported module's ``__all__`` that stay in that module on purpose
#: (reach them as ``kernel_sandbox.<module>.<name>``): helpers, constants and the
#: finer-grained types of a subpackage.  Every other name must be in the root's
#: ``__all__``, so a new public class or function forces a decision here.
SUBMODULE_ONLY: dict[str, set[str]] = {
    "config": {"DISK_SHARES", "KERNEL_PYTHON", "LABEL_PREFIX", "describe_invalid", "parse_size"},
    "errors": set(),  # every exception is catchable from the root
    "events": {"Listener", "emit"},
    "files": set(),
    "manager": {"SandboxManagerType", "register_manager"},
    "results": {
        "BINARY_PREFIXES",
        "ExecutionStatus",
        "decoded_size",
        "format_size",
        "output_text",
        "strip_ansi",
    },
    "sandbox": {"runtime_root"},
    "sync": {"run_sync"},
    "tools": {
        "Artifact",
        "FileOperation",
        "FileOperationOptions",
        "PythonExecutor",
        "PythonExecutorOptions",
        "ShellExecutor",
        "ShellExecutorOptions",
        "ToolOptions",
        "ToolStatus",
        "available_tools",
        "make_tools",
        "truncate_middle",
    },
    "agent": {
        "AgentEvent",
        "AgentListener",
        "AgentStatus",
        "AnswerGiven",
        "BudgetExhausted",
        "BudgetHit",
        "BudgetTracker",
        "DEFAULT_MODEL",
        "MODEL_ENV",
        "ModelFailed",
        "ModelResponded",
        "ModelRetrying",
        "SessionEnded",
        "SessionStarted",
        "TokenUsage",
        "ToolCallFinished",
        "ToolCallStarted",
        "TurnStarted",
        "system_prompt",
    },
    "notebook": {
        "CellReplay",
        "Comparison",
        "DEFAULT_SESSION_DIR",
        "META_KEY",
        "compare_outputs",
        "new_session_path",
        "normalise_outputs",
        "normalise_text",
        "read_notebook",
        "replayed_path",
        "validate_notebook",
        "write_notebook_atomic",
    },
    "pool": {"POOL_LABEL", "PoolStats"},
}


def _reexported_modules() -> set[str]:
    """Submodules the root imports from, eagerly (``from .x import``) or lazily."""
    tree = ast.parse(Path(kernel_sandbox.__file__).read_text())
    eager = {
        node.module.split(".")[0]
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
    }
    return eager | set(kernel_sandbox._LAZY.values())


def _package_modules() -> list[ModuleType]:
    """Every module of the package, imported."""
    names = [m.name for m in pkgutil.walk_packages(kernel_sandbox.__path__, "kernel_sandbox.")]
    return [importlib.import_module(name) for name in ["kernel_sandbox", *names]]


def test_every_reexported_module_is_accounted_for() -> None:
    assert _reexported_modules() == set(SUBMODULE_ONLY)


@pytest.mark.parametrize("module", sorted(SUBMODULE_ONLY))
def test_every_public_name_of_a_reexported_module_is_exported_or_kept_there(module: str) -> None:
    public = set(importlib.import_module(f"kernel_sandbox.{module}").__all__)
    kept = SUBMODULE_ONLY[module]
    assert kept <= public, f"stale names in SUBMODULE_ONLY[{module!r}]: {kept - public}"
    missing = public - kept - set(kernel_sandbox.__all__)
    assert not missing, f"kernel_sandbox.{module} names missing from kernel_sandbox.__all__"
    for name in public - kept:
        assert getattr(kernel_sandbox, name) is getattr(
            importlib.import_module(f"kernel_sandbox.{module}"), name
        )


def test_every_sandbox_error_anywhere_in_the_package_is_exported() -> None:
    _package_modules()  # a subclass exists only once its module is imported

    def subclasses(cls: type) -> list[type]:
        return [c for sub in cls.__subclasses__() for c in (sub, *subclasses(sub))]

    found = [
        c for c in subclasses(errors.SandboxError) if c.__module__.startswith("kernel_sandbox")
    ]
    assert len(found) >= 13
    for cls in [errors.SandboxError, *found]:
        assert cls.__name__ in kernel_sandbox.__all__, cls
        assert getattr(kernel_sandbox, cls.__name__) is cls


def test_every_class_and_function_imported_into_the_root_is_exported() -> None:
    public = {
        n
        for n, v in vars(kernel_sandbox).items()
        if not n.startswith("_") and (inspect.isclass(v) or inspect.isfunction(v))
    }
    assert public <= set(kernel_sandbox.__all__)


def test_names_the_issue_found_missing_are_exported() -> None:
    for name in ["ContainerStoppedError", "ContainerRemovedError", "NotebookError"]:
        assert name in kernel_sandbox.__all__
    assert kernel_sandbox.Tool is kernel_sandbox.tools.Tool
    assert kernel_sandbox.register_tool is kernel_sandbox.tools.register_tool


def test_every_exception_descends_from_the_one_root_and_is_drawn_in_the_tree() -> None:
    doc = errors.__doc__ or ""
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.SandboxError)
        assert name in doc, f"{name} missing from the tree in errors.py's docstring"


def _public_methods(cls: type) -> dict[str, inspect.Signature]:
    out = {}
    for name, member in inspect.getmembers(cls):
        if name.startswith("_") or isinstance(member, property):
            continue
        if callable(member):
            out[name] = inspect.signature(member)
    return out


@pytest.mark.parametrize(("sync_cls", "async_cls"), [(Sandbox, AsyncSandbox), (Files, AsyncFiles)])
def test_sync_facade_has_the_same_methods_and_signatures(sync_cls: type, async_cls: type) -> None:
    sync_methods, async_methods = _public_methods(sync_cls), _public_methods(async_cls)
    assert set(async_methods) <= set(sync_methods)
    for name, sig in async_methods.items():
        assert list(sig.parameters) == list(sync_methods[name].parameters), name
        for param in sig.parameters:
            assert sig.parameters[param].default == sync_methods[name].parameters[param].default, (
                f"{name}({param})"
            )


def test_public_names_have_docstrings() -> None:
    for name in kernel_sandbox.__all__:
        obj = getattr(kernel_sandbox, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__doc__, f"{name} has no docstring"
