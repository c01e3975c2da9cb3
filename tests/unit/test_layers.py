"""The layers a newcomer draws from the folder listing hold in the code.

Read from the source (every ``import``, also those inside functions; only ``if
TYPE_CHECKING:`` blocks, which never run, are left out): every module sits in one of
ARCHITECTURE.md's layers and imports only its own and those below (so the sandbox
layer reaches no server, client or egress proxy), no import cycle between modules, and
nothing above the kernel host interface reaches the Docker SDK or the Docker host.
One subprocess then imports those layers and checks that ``docker`` really stays
unloaded.  (The Kubernetes client is held to the same rule.)
"""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

import kernel_sandbox

ROOT = Path(kernel_sandbox.__file__).parent
PACKAGE = "kernel_sandbox"

#: Where a Docker-only import is the point: the ``images`` command group builds Docker
#: images.
DOCKER_WIRING = {"kernel_sandbox.cli.images"}
DOCKER_HOST = "kernel_sandbox.backends.docker"


@cache
def modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = [PACKAGE, *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


@cache
def imports(module: str) -> tuple[tuple[str, bool], ...]:
    """``(imported module, at module level)`` for every import that can run."""
    path = modules()[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: list[tuple[str, bool]] = []

    def walk(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for other in child.orelse:
                    walk(other, top)
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, top) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package[: len(package) - child.level + 1]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                subs = [
                    f"{target}.{a.name}" for a in child.names if f"{target}.{a.name}" in modules()
                ]
                if len(subs) < len(child.names):  # names defined in the module itself
                    found.append((target, top))
                found.extend((sub, top) for sub in subs)
            inner = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            walk(child, top and not inner)

    walk(ast.parse(path.read_text()), True)
    return tuple(found)


def cycles() -> set[frozenset[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm)."""
    graph = {m: {t for t, _ in imports(m) if t in modules() and t != m} for m in sorted(modules())}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: set[frozenset[str]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.add(frozenset(group))

    for v in graph:
        if v not in index:
            visit(v)
    return groups


def test_the_import_graph_is_read_from_every_module() -> None:
    assert len(modules()) > 100
    assert ("kernel_sandbox.client.remote", True) in imports("kernel_sandbox.client")
    assert ("kernel_sandbox.sandbox", False) in imports("kernel_sandbox.notebook.replay")


#: ARCHITECTURE.md's layers, lowest first: a module may import its own layer and those
#: below it, never one above.  Each entry is a module or package (with its submodules).
LAYERS: list[tuple[str, set[str]]] = [
    (
        "values",
        {
            "_extras",
            "errors",
            "limits",
            "results",
            "threads",
            "network",
            "config",
            "events",
            "wire",
            "rundirs",
            "transfer",
            "file_scripts",
            "contexts",
        },
    ),
    ("kernel", {"kernel"}),
    ("kernel host", {"backends", "testing", "programs"}),
    (
        "sandbox",
        {
            "sandbox",
            "sync",
            "files",
            "shell",
            "processes",
            "judgement",
            "snapshots",
            "protocols",
            "running",
        },
    ),
    ("tools and pool", {"tools", "pool", "manager_models"}),
    ("notebook", {"notebook"}),
    ("agent", {"agent"}),
    ("client", {"client"}),
    ("manager", {"manager"}),
    ("fronts", {"", "server", "mcp", "jupyter", "cli", "integrations"}),
]
#: The layers that make up "the sandbox layer" and everything under it.
SANDBOX_LAYERS = {"values", "kernel", "kernel host", "sandbox"}


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of a ``kernel_sandbox`` module."""
    rest = module.removeprefix(PACKAGE).removeprefix(".")
    head = rest.split(".")[0]
    for index, (_, members) in enumerate(LAYERS):
        if head in members:
            return index
    raise AssertionError(f"{module} is in no layer of LAYERS: place it there")


def test_every_module_sits_in_one_layer_and_imports_only_downwards() -> None:
    offenders = [
        f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
        for module in sorted(modules())
        for target, _ in imports(module)
        if target in modules() and layer_of(target) > layer_of(module)
    ]
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize(
    "above",
    ["kernel_sandbox.server", "kernel_sandbox.client", "kernel_sandbox.backends.docker.egress"],
)
def test_the_sandbox_layer_imports_no_server_client_or_egress(above: str) -> None:
    """Said once more by name: the sandbox layer and all below it (but the Docker host,
    which runs the egress proxy) reach none of them."""
    sandbox_layer = [
        m
        for m in modules()
        if LAYERS[layer_of(m)][0] in SANDBOX_LAYERS and not m.startswith(DOCKER_HOST)
    ]
    assert "kernel_sandbox.config" in sandbox_layer and "kernel_sandbox.sandbox" in sandbox_layer
    offenders = [
        f"{m} imports {t}"
        for m in sandbox_layer
        for t, _ in imports(m)
        if t == above or t.startswith(above + ".")
    ]
    assert not offenders


def test_no_import_cycle_not_even_inside_functions() -> None:
    found = cycles()
    assert not found, f"import cycles: {[sorted(c) for c in found]}"


#: Each engine's SDK and the host package that alone may use it.
ENGINES = {"docker": DOCKER_HOST, "kubernetes": "kernel_sandbox.backends.kubernetes"}


@pytest.mark.parametrize("sdk", sorted(ENGINES))
def test_nothing_above_the_host_interface_imports_an_engine(sdk: str) -> None:
    """Only the engine's host package (and, for Docker, the wiring above) may name it."""
    host = ENGINES[sdk]
    wiring = DOCKER_WIRING if sdk == "docker" else set()
    offenders = [
        f"{module} imports {target}"
        for module in modules()
        if not module.startswith(host) and module not in wiring
        for target, _ in imports(module)
        if target == sdk or target.startswith((f"{sdk}.", host))
    ]
    assert not offenders


def test_importing_the_layers_above_the_hosts_loads_no_docker() -> None:
    """What the source says, checked in a fresh interpreter: ``docker`` stays unloaded."""
    layers = sorted(
        m
        for m in modules()
        if not m.startswith((DOCKER_HOST, "kernel_sandbox.cli", "kernel_sandbox.server"))
        and not m.endswith("_program")  # programs run inside containers, not imported here
        and ".programs." not in m
        and "._setup" not in m
    )
    code = (
        "import importlib, sys\n"
        f"for name in {layers!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m == 'docker' or m.startswith("
        f"('docker.', {DOCKER_HOST!r}))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", f"loaded with {len(layers)} modules: {result.stdout}"
