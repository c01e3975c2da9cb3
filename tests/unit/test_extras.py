"""Optional parts: the core imports none of them, and each says which extra to install.

A missing module is simulated in a fresh interpreter by ``sys.modules[name] = None``
(what Python itself treats as "this module cannot be imported"), then the part is used
the way a user would: importing it, asking for its kernel host, running its command.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
import tomllib
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from kernel_sandbox import _extras
from kernel_sandbox.errors import MissingExtraError, SandboxError

ROOT = Path(__file__).resolve().parents[2]
EVERY_EXTRA_MODULE = sorted({m for modules in _extras.EXTRAS.values() for m in modules})


def run(code: str, *, hide: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter where the modules ``hide`` cannot be imported."""
    prelude = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in hide)
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def expect_missing(code: str, hide: str, extra: str) -> None:
    """``code`` raises MissingExtraError naming ``extra`` and ``hide`` (a SandboxError)."""
    done = run(
        f"""
        from kernel_sandbox.errors import MissingExtraError, SandboxError
        try:
            {textwrap.indent(textwrap.dedent(code), "            ").strip()}
        except MissingExtraError as exc:
            assert isinstance(exc, SandboxError) and isinstance(exc, ModuleNotFoundError)
            print(exc)
        else:
            print("NO ERROR")
        """,
        hide=(hide,),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    message = done.stdout.strip()
    assert f"pip install 'kernel-sandbox[{extra}]'" in message, message
    assert f"({hide} is not installed)" in message, message


def test_the_core_imports_no_extra() -> None:
    """What a local Docker sandbox loads: the API, the blocking twin, the Docker host,
    the tools, the manager, the recorder and the CLI's entry point."""
    done = run(
        """
        import kernel_sandbox, kernel_sandbox.sync, kernel_sandbox.backends.docker
        import kernel_sandbox.tools, kernel_sandbox.manager, kernel_sandbox.pool
        import kernel_sandbox.notebook, kernel_sandbox.cli.main
        print(" ".join(sorted({name.split(".")[0] for name in sys.modules})))
        """
    )
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = set(done.stdout.split())
    assert loaded.isdisjoint(EVERY_EXTRA_MODULE), loaded & set(EVERY_EXTRA_MODULE)


@pytest.mark.parametrize(
    ("hide", "extra", "code"),
    [
        ("openai", "agent", "import kernel_sandbox.agent"),
        ("tenacity", "agent", "from kernel_sandbox import Agent"),
        ("fastapi", "server", "import kernel_sandbox.server.app"),
        ("mcp", "server", "import kernel_sandbox.mcp"),
        ("uvicorn", "server", "from kernel_sandbox.server import ServerSettings"),
        ("httpx2", "client", "from kernel_sandbox import RemoteSandbox"),
        ("httpx2", "client", "import kernel_sandbox.client.manager"),
        ("connectrpc", "server", "import kernel_sandbox.server.e2b"),
        ("kubernetes", "kubernetes", "import kernel_sandbox.backends.kubernetes"),
        (
            "kubernetes",
            "kubernetes",
            "from kernel_sandbox.backends.factory import host_class; host_class('kubernetes')",
        ),
        (
            "nbconvert",
            "notebook",
            "from kernel_sandbox.notebook import export_notebook; "
            "export_notebook('notebooks/example-analysis.ipynb', 'html', '/dev/null')",
        ),
        (
            "PIL",
            "notebook",
            "from kernel_sandbox.notebook.media import decode_raster; decode_raster('iVBORw0K')",
        ),
        ("agents", "openai-agents", "import kernel_sandbox.integrations.openai_agents"),
        ("langchain_core", "langchain", "import kernel_sandbox.integrations.langchain"),
        ("smolagents", "smolagents", "import kernel_sandbox.integrations.smolagents"),
    ],
)
def test_a_missing_extra_is_named(hide: str, extra: str, code: str) -> None:
    expect_missing(code, hide, extra)


@pytest.mark.parametrize(
    ("hide", "extra", "argv"),
    [
        ("uvicorn", "server", ["serve", "--port", "0"]),
        ("mcp", "server", ["mcp"]),
        ("openai", "agent", ["agent", "hello"]),
        ("jupyter_console", "attach", ["attach", "0123456789ab"]),
    ],
)
def test_a_command_names_its_extra_in_one_line(hide: str, extra: str, argv: list[str]) -> None:
    done = run(
        f"from kernel_sandbox.cli.main import main; main({argv!r})",
        hide=(hide,),
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"pip install 'kernel-sandbox[{extra}]'" in done.stderr, done.stderr


def test_an_installed_extra_passes_and_other_import_errors_stay_themselves() -> None:
    with _extras.require_extra("server", "test"):
        import fastapi  # noqa: F401  (installed here: nothing raised)
    with pytest.raises(ModuleNotFoundError) as caught, _extras.require_extra("server", "t"):
        import kernel_sandbox_no_such_module  # type: ignore[import-not-found]  # noqa: F401
    assert not isinstance(caught.value, MissingExtraError)
    with pytest.raises(ValueError, match="unknown extra"), _extras.require_extra("nope", "t"):
        pass


def test_every_extra_is_declared_and_brings_its_modules() -> None:
    """_extras.EXTRAS and pyproject.toml agree: each extra's modules come from a
    distribution that extra requires (directly, or as a requirement of one)."""
    with (ROOT / "pyproject.toml").open("rb") as handle:
        optional = tomllib.load(handle)["project"]["optional-dependencies"]
    assert set(_extras.EXTRAS) <= set(optional)
    assert {"agent", "server", "kubernetes", "notebook", "attach", "all", "dev"} <= set(optional)
    owners = packages_distributions()

    def names(extra: str) -> set[str]:
        found = set()
        for text in optional[extra]:
            req = Requirement(text)
            if req.name == "kernel-sandbox":
                for included in req.extras:
                    found |= names(included)
            else:
                found.add(canonicalize_name(req.name))
        return found

    for extra, modules in _extras.EXTRAS.items():
        direct = names(extra)
        reachable = set(direct)
        for dist in direct:
            with contextlib.suppress(PackageNotFoundError):
                reachable |= {canonicalize_name(Requirement(r).name) for r in requires(dist) or []}
        for module in modules:
            dists = {canonicalize_name(d) for d in owners.get(module, [])}
            assert dists & reachable, f"{module} ({dists}) is not brought by [{extra}]"
    assert names("all") >= set().union(*(names(e) for e in _extras.EXTRAS))
    assert names("dev") >= names("all")


def test_missing_extra_error_is_in_the_one_tree() -> None:
    assert issubclass(MissingExtraError, SandboxError)
    assert issubclass(MissingExtraError, ModuleNotFoundError)
