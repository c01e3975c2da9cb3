"""ms-enclave's own HttpSandboxManager (0.0.8, from its own virtualenv) drives the server."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from tests.integration.serving import KEY_A, ROOT, Server

pytestmark = pytest.mark.integration

CLIENT = r"""
import asyncio, io, json, sys, tarfile
from ms_enclave.sandbox.manager import HttpSandboxManager
from ms_enclave.sandbox.model import DockerSandboxConfig, SandboxType

async def main(url, key):
    out = {}
    async with HttpSandboxManager(base_url=url, api_key=key, timeout=120) as manager:
        out["health"] = await manager.health_check()
        config = DockerSandboxConfig(
            tools_config={"python_executor": {}, "shell_executor": {}, "file_operation": {}}
        )
        sid = await manager.create_sandbox(SandboxType.DOCKER, config)
        info = await manager.get_sandbox_info(sid)
        out["info"] = {"status": info.status.value, "type": info.type,
                       "network": info.config.get("network_enabled"),
                       "memory": info.config.get("memory_limit")}
        tools = await manager.get_sandbox_tools(sid)
        out["tools"] = sorted(tools)
        out["desc"] = tools["python_executor"]["function"]["description"]
        r1 = await manager.execute_tool(sid, "python_executor", {"code": "x = 20"})
        r2 = await manager.execute_tool(sid, "python_executor", {"code": "print(x * 2 + 2)"})
        r3 = await manager.execute_tool(sid, "python_executor", {"code": "1/0"})
        out["python"] = [r1.status.value, r2.status.value, r2.output, r3.status.value, r3.error]
        c = await manager.execute_tool(sid, "file_operation",
            {"operation": "create", "file_path": "hello.txt", "content": "hi there"})
        r = await manager.execute_tool(sid, "file_operation",
            {"operation": "read", "file_path": "hello.txt"})
        s = await manager.execute_tool(sid, "shell_executor", {"command": "cat hello.txt; id -un"})
        out["files"] = [c.status.value, r.output, s.output]
        listed = await manager.execute_tool(
            sid, "shell_executor", {"command": ["cat", "hello.txt", "no such file"]})
        out["argv"] = [listed.status.value, listed.output, listed.error]
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            data = b"print('from the archive')"
            member = tarfile.TarInfo("pkg/run.py"); member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
        out["archive"] = await manager.put_archive(sid, "/sandbox/up", buf.getvalue())
        a = await manager.execute_tool(sid, "shell_executor", {"command": "python up/pkg/run.py"})
        out["archive_run"] = a.output
        out["listed"] = [i.id for i in await manager.list_sandboxes()]
        nb_sid = await manager.create_sandbox(SandboxType.DOCKER_NOTEBOOK,
            {"tools_config": ["notebook_executor"], "image": "kernel-sandbox:python"})
        n1 = await manager.execute_tool(nb_sid, "notebook_executor", {"code": "y = 5"})
        n2 = await manager.execute_tool(nb_sid, "notebook_executor", {"code": "y + 1"})
        out["notebook"] = [n1.status.value, n2.output,
                           sorted(await manager.get_sandbox_tools(nb_sid))]
        out["stop"] = await manager.stop_sandbox(nb_sid)
        stopped = await manager.get_sandbox_info(nb_sid)
        out["stopped"] = stopped.status.value
        out["missing"] = await manager.get_sandbox_info("nope")
        ids = await manager.initialize_pool(pool_size=2, config={"image": "kernel-sandbox:python"})
        code = {"code": "import os; os.getpid()"}
        p = [await manager.execute_tool_in_pool("python_executor", code) for _ in range(3)]
        out["pool"] = [len(ids), [x.status.value for x in p]]
        out["sid"] = sid
    print(json.dumps(out, default=str))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, docker_engine) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    # ms-enclave's client asks for python:3.11-slim (a plain Python): the operator lets
    # the server derive it (off by default), confined like a sandbox.
    srv = Server(f"t-enclave-{os.getpid()}", tmp_path_factory.mktemp("nb"), ["--derive"]).start()
    yield srv
    srv.stop()


def test_ms_enclave_http_manager_drives_the_server_unmodified(
    server: Server, enclave_python: Path
) -> None:
    done = subprocess.run(
        [str(enclave_python), "-c", CLIENT, server.url, KEY_A],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["health"]["healthy"] is True
    # the client's defaults (network on, 4g) met the server's policy
    assert out["info"] == {"status": "running", "type": "docker", "network": False, "memory": "2g"}
    assert out["tools"] == ["file_operation", "python_executor", "shell_executor"]
    assert "State persists between calls" in out["desc"]
    ok1, ok2, text, failed, error = out["python"]
    assert (ok1, ok2, text.strip(), failed) == ("success", "success", "42", "error")
    assert "ZeroDivisionError" in error  # state kept across python_executor calls
    assert out["files"][0] == "success" and "hi there" in out["files"][1]
    assert "hi there" in out["files"][2] and "sandbox" in out["files"][2]
    # a command as a list (ms-enclave's schema allows one): program and verbatim arguments
    status, text, error = out["argv"]
    assert status == "error" and "exited with status 1" in error
    assert "hi there" in text and "cat: 'no such file': No such file" in text  # one argument
    assert out["archive"] is True and "from the archive" in out["archive_run"]
    assert out["sid"] in out["listed"]
    status, value, nb_tools = out["notebook"]
    assert (status, value.strip(), nb_tools) == ("success", "6", ["notebook_executor"])
    assert (out["stop"], out["stopped"], out["missing"]) == (True, "stopped", None)
    assert out["pool"] == [2, ["success"] * 3]
    # every sandbox was recorded; the notebooks are valid and hold the calls
    notebooks = list(Path(server.record_dir).rglob("*.ipynb"))
    assert len(notebooks) >= 4
    nb = nbformat.read(next(p for p in notebooks if out["sid"] in p.name), as_version=4)
    nbformat.validate(nb)
    assert any("x = 20" in cell.source for cell in nb.cells)
