"""The public surface: curated exports, one exception root, sync/async parity."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import kernel_sandbox
import kernel_sandbox.tools
from kernel_sandbox import errors


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
    "client.manager": set(),
    "client.remote": {"RemoteFiles", "raise_for"},
    "config": {
        "DISK_SHARES",
        "KERNEL_PYTHON",
        "LABEL_PREFIX",
        "PING_TIMEOUT",
        "RUNTIME_ENV",
        "describe_invalid",
        "parse_size",
    },
    "contexts": {
        "DEFAULT_CONTEXT",
        "KERNELSPECS_SCRIPT",
        "KNOWN_KERNELS",
        "LANGUAGES",
        "kernel_for",
        "language_of",
        "normalise_language",
        "parse_kernelspecs",
    },
    "errors": set(),  # every exception is catchable from the root
    "events": {"Listener", "current_context", "emit"},
    "files": {"EVENT_DETAIL_CHARS", "LIST_LIMIT", "STREAM_EVENT_CONTENT"},
    "manager": {"SandboxManagerType", "register_manager"},
    "results": {
        "BINARY_PREFIXES",
        "ExecutionStatus",
        "decoded_size",
        "format_size",
        "output_text",
        "strip_ansi",
    },
    "sandbox": {"PING_TIMEOUT"},
    "sync": {"ReadStream", "as_async", "run_sync"},
    "tools": {
        "Artifact",
        "CodeExecutor",
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
        "resume_session",
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
    "snapshots": {"SNAPSHOTS_ENV", "BlobWriter", "default_store"},
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


# -- sync / async parity ------------------------------------------------------------
# The scheme (kernel_sandbox/sync.py): a blocking class ``X`` beside ``AsyncX`` with the
# same method names; a blocking function or method ``name`` beside a coroutine
# ``aname`` in the same module or class.  The pairs are found, not listed.


def _parity_modules() -> list[ModuleType]:
    return _package_modules()


def _own_classes() -> dict[str, type]:
    return {
        name: obj
        for module in _parity_modules()
        for name, obj in vars(module).items()
        if inspect.isclass(obj) and obj.__module__ == module.__name__
    }


def _plain(obj: object) -> Any:
    """The function behind a staticmethod / classmethod / wrapper, or ``obj``."""
    return inspect.unwrap(getattr(obj, "__func__", obj))


def _calls_run_sync(obj: object) -> bool:
    code = getattr(_plain(obj), "__code__", None)
    return code is not None and "run_sync" in code.co_names + code.co_varnames


def _class_pairs() -> list[tuple[type, type]]:
    classes = _own_classes()
    pairs = []
    for name, cls in sorted(classes.items()):
        if name.startswith("Async") and name != "Async":
            blocking = classes.get(name.removeprefix("Async"))
            assert blocking is not None, f"{cls.__module__}.{name} has no blocking twin"
            pairs.append((blocking, cls))
    return pairs


def _namespaces() -> list[tuple[str, dict[str, Any]]]:
    """Every module's own functions, and every own class's own members."""
    out = []
    for module in _parity_modules():
        own = {
            n: f
            for n, f in vars(module).items()
            if inspect.isfunction(f) and f.__module__ == module.__name__
        }
        out.append((module.__name__, own))
    for cls in _own_classes().values():
        out.append((f"{cls.__module__}.{cls.__qualname__}", dict(vars(cls))))
    return out


def _function_pairs() -> list[tuple[str, Any, Any]]:
    pairs = []
    for where, members in _namespaces():
        for name, member in members.items():
            if name.startswith("_") or not inspect.iscoroutinefunction(_plain(member)):
                continue
            if name.startswith("a") and name[1:] in members:
                pairs.append((f"{where}.{name[1:]}", members[name[1:]], member))
    return pairs


def _same_signature(blocking: Any, asynchronous: Any, what: str) -> None:
    assert not inspect.iscoroutinefunction(_plain(blocking)), f"{what}: the blocking twin is async"
    want, got = inspect.signature(asynchronous), inspect.signature(blocking)
    assert [(p.name, p.kind, p.default) for p in want.parameters.values()] == [
        (p.name, p.kind, p.default) for p in got.parameters.values()
    ], f"{what}: {got} differs from the async {want}"


def _public_members(cls: type) -> dict[str, Any]:
    return {n: m for n, m in inspect.getmembers(cls) if not n.startswith("_")}


def test_the_known_pairs_are_found() -> None:
    assert {(b.__name__, a.__name__) for b, a in _class_pairs()} >= {
        ("Sandbox", "AsyncSandbox"),
        ("Files", "AsyncFiles"),
    }
    assert "kernel_sandbox.agent.agent.Agent.run" in {w for w, _, _ in _function_pairs()}


@pytest.mark.parametrize(("blocking", "asynchronous"), _class_pairs(), ids=lambda c: c.__name__)
def test_a_blocking_class_has_every_method_and_property_of_its_async_twin(
    blocking: type, asynchronous: type
) -> None:
    mine, theirs = _public_members(blocking), _public_members(asynchronous)
    missing = set(theirs) - set(mine)
    assert not missing, f"{blocking.__name__} lacks {sorted(missing)} of {asynchronous.__name__}"
    for name, member in theirs.items():
        if isinstance(member, property):
            assert isinstance(mine[name], property), f"{blocking.__name__}.{name}"
        elif callable(member):
            _same_signature(mine[name], member, f"{blocking.__name__}.{name}")


@pytest.mark.parametrize(
    ("where", "blocking", "asynchronous"),
    _function_pairs(),
    ids=lambda v: v if isinstance(v, str) else v.__qualname__,  # the same in every process
)
def test_a_blocking_function_has_the_signature_of_its_async_twin(
    where: str, blocking: Any, asynchronous: Any
) -> None:
    _same_signature(blocking, asynchronous, where)


def test_every_blocking_wrapper_is_named_by_the_scheme() -> None:
    """Anything that hands a coroutine to run_sync must be one half of a found pair."""
    paired = {w for w, _, _ in _function_pairs()}
    twins = {cls for cls, _ in _class_pairs()}
    for where, members in _namespaces():
        for name, member in members.items():
            if f"{where}.{name}" in paired or f"{where}.{name}" == "kernel_sandbox.sync.run_sync":
                continue
            if any(where == f"{c.__module__}.{c.__qualname__}" for c in twins):
                continue  # a method of a blocking class: checked against its AsyncX
            assert not _calls_run_sync(member), (
                f"{where}.{name} wraps a coroutine with run_sync but has no async twin "
                f"named a{name} (or a class twin Async...): see kernel_sandbox/sync.py"
            )


def test_replay_takes_a_sandbox_like_its_async_twin() -> None:
    """``replay`` / ``areplay`` are a pair of the scheme the parity test above checks."""
    assert "sandbox" in inspect.signature(kernel_sandbox.replay).parameters
    assert "sandbox" in inspect.signature(kernel_sandbox.areplay).parameters


def test_public_names_have_docstrings() -> None:
    for name in kernel_sandbox.__all__:
        obj = getattr(kernel_sandbox, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__doc__, f"{name} has no docstring"
