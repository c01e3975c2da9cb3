"""The public surface: curated exports, one exception root, sync/async parity."""

from __future__ import annotations

import inspect

import pytest

import kernel_sandbox
from kernel_sandbox import errors
from kernel_sandbox.files import AsyncFiles
from kernel_sandbox.sandbox import AsyncSandbox
from kernel_sandbox.sync import Files, Sandbox


def test_all_is_sorted_unique_and_importable() -> None:
    names = kernel_sandbox.__all__
    assert len(names) == len(set(names))
    for name in names:
        assert getattr(kernel_sandbox, name) is not None


def test_every_public_class_and_function_is_exported() -> None:
    public = {
        n
        for n, v in vars(kernel_sandbox).items()
        if not n.startswith("_") and (inspect.isclass(v) or inspect.isfunction(v))
    }
    assert public <= set(kernel_sandbox.__all__)


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


def test_sync_and_async_functions_come_in_pairs_with_the_same_parameters() -> None:
    """``X`` / ``async_X``, as nbclient's ``execute`` / ``async_execute``."""
    pairs = [
        (kernel_sandbox.replay, kernel_sandbox.async_replay),
    ]
    for sync_fn, async_fn in pairs:
        assert inspect.iscoroutinefunction(async_fn) and not inspect.iscoroutinefunction(sync_fn)
        assert async_fn.__name__ == f"async_{sync_fn.__name__}"
        sync_sig, async_sig = inspect.signature(sync_fn), inspect.signature(async_fn)
        assert list(sync_sig.parameters) == list(async_sig.parameters), sync_fn.__name__
        for name, param in async_sig.parameters.items():
            assert sync_sig.parameters[name].default == param.default, f"{sync_fn.__name__}({name})"
            assert sync_sig.parameters[name].kind == param.kind, f"{sync_fn.__name__}({name})"
    assert "sandbox" in inspect.signature(kernel_sandbox.replay).parameters


def test_public_names_have_docstrings() -> None:
    for name in kernel_sandbox.__all__:
        obj = getattr(kernel_sandbox, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__doc__, f"{name} has no docstring"
