"""network="packages": pip installs through the host's egress proxy; nothing else goes.

Traffic leaves this machine only for the package index the host's pip uses (the
install tests); every refusal here is decided by the proxy before any name is
resolved or any connection opened, which the tests check in the proxy's decisions.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import nbformat
import pytest

from kernel_sandbox.backends.docker import DockerHost
from kernel_sandbox.backends.docker.egress import CONTAINER_EGRESS_DIR, RELAY_PORT, SandboxEgress
from kernel_sandbox.notebook import NotebookRecorder
from kernel_sandbox.sandbox import AsyncSandbox
from kernel_sandbox.tools import ToolSet

from .conftest import PYTHON_IMAGE

pytestmark = pytest.mark.integration


def egress_of(sandbox: AsyncSandbox) -> SandboxEgress:
    """The sandbox's egress (its Docker host's proxy and directory)."""
    host = sandbox.host
    assert isinstance(host, DockerHost) and host.egress is not None
    return host.egress


INTERFACES = "import os; print(sorted(os.listdir('/sys/class/net')))"


async def test_pip_install_in_a_cell_and_in_the_shell_with_only_lo(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    sb: AsyncSandbox = await make_sandbox(image=PYTHON_IMAGE, network="packages", timeout=180)
    interfaces = await sb.run_python(INTERFACES)
    assert interfaces.stdout.strip() == "['lo']"

    installed = await sb.run_python("%pip install tomli-w")
    assert installed.status == "ok", installed.text
    assert "Successfully installed tomli-w" in installed.text
    used = await sb.run_python("import tomli_w\nprint(tomli_w.dumps({'a': 1}), tomli_w.__file__)")
    assert used.status == "ok", used.text
    assert "a = 1" in used.stdout and "/home/sandbox/.local/" in used.stdout

    tools = ToolSet(sb)
    description = json.dumps(tools.schema_map())
    assert "Network access is limited to:" in description and "pip install NAME" in description
    shell = await tools.execute(
        "shell_executor", {"command": "pip install iniconfig", "timeout": 170}
    )
    assert shell.status == "success", shell.model_dump_json()
    after = await sb.run_python("import iniconfig; print(iniconfig.__name__)")
    assert after.stdout.strip() == "iniconfig", after.text

    # the packages live in the writable area and survive a restart of the kernel
    await sb.restart()  # every process ends, the relay too: it is started again
    again = await sb.run_python("import tomli_w, iniconfig; print('still here')")
    assert again.stdout.strip() == "still here", again.text
    relay = await sb.run_shell("pip download --no-deps -d /tmp/dl tomli-w", timeout=180)
    assert relay.exit_code == 0, relay.stderr

    decisions = egress_of(sb).proxy.decisions
    assert decisions and all(d.allowed for d in decisions), decisions
    allowed = {h.name for h in egress_of(sb).policy.patterns}
    assert {d.host for d in decisions} <= allowed


_FETCH = """
import socket, urllib.request, urllib.error
for url in {urls!r}:
    if url.startswith("http://127."):  # NO_PROXY keeps clients off the relay: go by hand
        s = socket.create_connection(("127.0.0.1", {port}))
        s.sendall(("GET " + url + " HTTP/1.1\\r\\n\\r\\n").encode())
        print(url, s.recv(300).decode().splitlines()[0])
        continue
    try:
        urllib.request.urlopen(url, timeout=20)
        print(url, "REACHED")
    except urllib.error.HTTPError as e:
        print(url, e.code, e.reason)
    except Exception as e:
        print(url, type(e).__name__, e)
"""


async def test_refusals_come_back_as_403_and_as_notebook_notes(
    make_sandbox, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    sb: AsyncSandbox = await make_sandbox(image=PYTHON_IMAGE, network="packages")
    recorder = NotebookRecorder.attach(sb, tmp_path / "session.ipynb")
    urls = [
        "https://outside.example.net/",  # a host outside the policy (https: CONNECT)
        "http://10.20.30.40/",  # a private address (plain http)
        "http://127.0.0.1:2375/version",  # the host's loopback (seen from the proxy)
        "https://169.254.169.254/",  # a metadata service
    ]
    ex = await sb.run_python(_FETCH.format(urls=urls, port=RELAY_PORT))
    assert ex.status == "ok", ex.text
    for url in urls:
        line = next(line for line in ex.stdout.splitlines() if line.startswith(url))
        assert "REACHED" not in line
        assert "refused by the sandbox's network policy (packages)" in line, line
    decisions = list(egress_of(sb).proxy.decisions)
    assert len(decisions) == len(urls) and not any(d.allowed for d in decisions)
    # decided before anything went out: no decision names a resolved address
    assert all("resolves to" not in d.detail for d in decisions)

    fetch = "import urllib.request as u; u.urlopen('https://outside.example.net/')"
    shell = await sb.run_shell(f'python3 -c "{fetch}" 2>&1 | tail -1')
    assert "403" in shell.stdout, shell.stdout

    recorder.finish()
    notebook = nbformat.read(tmp_path / "session.ipynb", as_version=4)
    notes = [
        c.source
        for c in notebook.cells
        if c.cell_type == "markdown" and "network policy" in c.source
    ]
    assert notes and "outside.example.net:443" in notes[0] and "10.20.30.40:80" in notes[0]


async def test_a_sandbox_cannot_use_another_sandboxs_proxy(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    first: AsyncSandbox = await make_sandbox(image=PYTHON_IMAGE, network="packages")
    second: AsyncSandbox = await make_sandbox(image=PYTHON_IMAGE, network=["files.example.org"])
    other_socket = str(egress_of(first).proxy.socket_path)
    index = egress_of(first).policy.patterns[0].text
    probe = f"""
import json, os, socket
seen = {{}}
for path in [{other_socket!r}, {CONTAINER_EGRESS_DIR!r} + "/proxy.sock"]:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        s.sendall(b"CONNECT " + {index!r}.encode() + b" HTTP/1.1\\r\\n\\r\\n")
        seen[path] = s.recv(200).decode(errors="replace").splitlines()[0]
    except OSError as e:
        seen[path] = type(e).__name__
try:
    open({CONTAINER_EGRESS_DIR!r} + "/planted", "w")
    seen["write"] = "written"
except OSError as e:
    seen["write"] = type(e).__name__
print(json.dumps(seen))
"""
    ex = await second.run_python(probe)
    seen = json.loads(ex.stdout)
    assert seen[other_socket] == "FileNotFoundError"  # the first sandbox's socket is not there
    # its own socket answers with its own policy, which does not allow the index
    assert seen[CONTAINER_EGRESS_DIR + "/proxy.sock"].startswith("HTTP/1.1 403"), seen
    assert "network=['files.example.org']" in seen[CONTAINER_EGRESS_DIR + "/proxy.sock"]
    assert seen["write"] in ("OSError", "PermissionError")  # read-only mount
    assert not egress_of(first).proxy.decisions


async def test_egress_directory_goes_with_the_sandbox(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    sb: AsyncSandbox = await make_sandbox(image=PYTHON_IMAGE, network="packages")
    directory = egress_of(sb).host_dir
    assert (directory / "proxy.sock").exists()
    await sb.close()
    assert not directory.exists()


_FLOOD = """
import socket, time
chunk = b"X-Flood: " + b"a" * 65536
sockets = []
for _ in range(300):
    try:
        s = socket.create_connection(("127.0.0.1", {port}))
        s.setblocking(False)
        sockets.append(s)
    except OSError:
        pass
end = time.monotonic() + 3
while time.monotonic() < end:
    for s in sockets:
        try:
            s.send(chunk)
        except OSError:
            pass
print("flood done", len(sockets))
"""


async def test_a_flood_from_inside_holds_a_bounded_number_of_connections(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    sb: AsyncSandbox = await make_sandbox(image=PYTHON_IMAGE, network=["files.example.org"])
    proxy = egress_of(sb).proxy
    peak = 0

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, proxy.active_connections)
            await asyncio.sleep(0.005)

    watcher = asyncio.ensure_future(watch())
    try:
        flood = await sb.run_python(_FLOOD.format(port=RELAY_PORT), timeout=120)
    finally:
        watcher.cancel()
    assert flood.stdout.startswith("flood done"), flood.text
    print("peak connections held by the proxy:", peak, flood.stdout.strip())
    assert 0 < peak <= proxy.limits.max_connections
    assert proxy.bytes_relayed == 0  # nothing went anywhere
    # the proxy still answers afterwards
    after = await sb.run_python(
        "import urllib.request as u\ntry:\n    u.urlopen('https://outside.example.net/')\n"
        "except Exception as e:\n    print(e)"
    )
    assert "403 refused" in after.stdout, after.text


async def test_the_relay_comes_back_with_a_restarted_container(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    sb: AsyncSandbox = await make_sandbox(image=PYTHON_IMAGE, network=["files.example.org"])
    assert sb.container_id is not None
    subprocess.run(["docker", "kill", sb.container_id], check=True, capture_output=True)
    died = await sb.run_python("1")
    assert died.status == "kernel_died" and "restarted" in died.message
    again = await sb.run_python(
        "import urllib.request as u\ntry:\n    u.urlopen('https://outside.example.net/')\n"
        "except Exception as e:\n    print(e)"
    )
    assert "403 refused by the sandbox's network policy" in again.stdout, again.text
