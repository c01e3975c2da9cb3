"""The native API through RemoteSandbox and our HttpSandboxManager; keys A and B; 413."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import nbformat
import pytest

from kernel_sandbox import NotebookRecorder, SandboxManagerFactory, ToolSet
from kernel_sandbox.client.remote import RemoteSandbox
from kernel_sandbox.errors import SandboxFileNotFoundError
from tests.integration.serving import KEY_A, KEY_B, Server, client

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, docker_engine) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    srv = Server(
        f"t-native-{os.getpid()}",
        tmp_path_factory.mktemp("nb"),
        ["--max-upload-bytes", str(2 * 1024 * 1024), "--max-sandboxes-per-key", "3"],
    ).start()
    yield srv
    srv.stop()


async def test_remote_sandbox_works_like_a_local_one(server: Server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    async with await RemoteSandbox.create(server.url, api_key=KEY_A, network_enabled=True) as sb:
        assert sb.config.network_enabled is False  # the server's policy
        recorder = NotebookRecorder.attach(sb, tmp_path / "client.ipynb")
        seen: list[dict] = []
        await sb.run_python("import time\nx = 41")
        ex = await sb.run_python(
            "for i in range(3):\n    print(i, flush=True); time.sleep(0.3)\nx + 1",
            on_output=seen.append,
        )
        assert ex.status == "ok" and ex.stdout == "0\n1\n2\n" and ex.result is not None
        assert [o.get("text") for o in seen[:3]] == ["0\n", "1\n", "2\n"]  # as they came
        err = await sb.run_python("raise ValueError('bad')")
        assert err.status == "error" and err.error is not None and err.error.ename == "ValueError"
        sh = await sb.run_shell("echo out; echo err >&2; exit 3")
        assert (sh.exit_code, sh.stdout, sh.stderr) == (3, "out\n", "err\n")
        blob = bytes(range(256)) * 4096  # 1 MiB, binary
        await sb.files.write("data/blob.bin", blob)
        assert await sb.files.read("data/blob.bin") == blob
        await sb.files.append("data/t.txt", "a")
        await sb.files.append("data/t.txt", "b")
        assert await sb.files.read_text("data/t.txt") == "ab"
        assert {i.name for i in await sb.files.list("data")} == {"blob.bin", "t.txt"}
        assert await sb.files.exists("data/t.txt")
        await sb.files.write("odd/line\nbreak.txt", "x")  # a name with a newline lists whole
        assert [i.name for i in await sb.files.list("odd")] == ["line\nbreak.txt"]
        await sb.files.remove("data/t.txt")
        assert not await sb.files.exists("data/t.txt")
        with pytest.raises(SandboxFileNotFoundError):  # as a local sandbox raises
            await sb.files.read("nope.txt")
        # interrupt a long cell: KeyboardInterrupt in it, variables kept
        import asyncio

        started = asyncio.Event()
        running = asyncio.ensure_future(
            sb.run_python(
                "print('started', flush=True); time.sleep(60)", on_output=lambda _: started.set()
            )
        )
        await asyncio.wait_for(started.wait(), 60)  # the cell runs: now interrupt it
        await sb.interrupt()
        stopped = await asyncio.wait_for(running, 30)
        assert stopped.status == "error" and stopped.error.ename == "KeyboardInterrupt"  # type: ignore[union-attr]
        assert (await sb.run_python("x")).result["data"]["text/plain"] == "41"  # type: ignore[index]
        await sb.restart()
        assert (await sb.run_python("x")).status == "error"
        # tools and the recorder work over the remote sandbox unchanged
        tools = ToolSet(sb, {"python_executor": {}, "file_operation": {}})
        result = await tools.execute("python_executor", {"code": "y = 2; y * 21"})
        assert result.ok and "42" in result.output
        assert recorder.steps >= 6
        nbformat.validate(nbformat.read(tmp_path / "client.ipynb", as_version=4))
        server_nb = nbformat.from_dict(await sb.notebook())
        nbformat.validate(server_nb)
        assert any("x = 41" in c.source for c in server_nb.cells)


async def test_keys_see_and_touch_only_their_own_sandboxes(server: Server) -> None:
    async with await RemoteSandbox.create(server.url, api_key=KEY_A) as mine:
        async with client(server, KEY_B) as b:
            assert [s["id"] for s in (await b.get("/v1/sandboxes")).json()] == []
            assert (await b.get("/sandboxes")).json() == []
            sid = mine.id
            v1 = f"/v1/sandboxes/{sid}"
            routes = [
                ("GET", f"/sandbox/{sid}"), ("POST", f"/sandbox/{sid}/stop"),
                ("DELETE", f"/sandbox/{sid}"), ("GET", f"/sandbox/{sid}/tools"),
                ("GET", v1), ("DELETE", v1), ("POST", f"{v1}/interrupt"),
                ("POST", f"{v1}/restart"), ("GET", f"{v1}/file?path=a.txt"),
                ("DELETE", f"{v1}/file?path=a"), ("GET", f"{v1}/list"), ("GET", f"{v1}/notebook"),
            ]  # fmt: skip
            for method, path in routes:
                assert (await b.request(method, path)).status_code == 404, path
            for path, body in [
                (f"/v1/sandboxes/{sid}/python", {"code": "1"}),
                (f"/v1/sandboxes/{sid}/shell", {"command": "true"}),
                ("/sandbox/tool/execute", {"sandbox_id": sid, "tool_name": "python_executor",
                                           "parameters": {"code": "1"}}),
            ]:  # fmt: skip
                assert (await b.post(path, json=body)).status_code == 404, path
            put = await b.put(f"/v1/sandboxes/{sid}/file", params={"path": "x.txt"}, content=b"hi")
            assert put.status_code == 404
        assert (await mine.run_python("1 + 1")).status == "ok"  # untouched
        assert not await mine.files.exists("x.txt")


async def test_caps_oversized_uploads_and_the_http_manager(server: Server) -> None:
    async with (
        await RemoteSandbox.create(server.url, api_key=KEY_B) as sb,
        client(server, KEY_B) as b,
    ):
        big = b"x" * (3 * 1024 * 1024)
        assert (await b.put(f"/v1/sandboxes/{sb.id}/file?path=big", content=big)).status_code == 413

        async def chunks():  # no Content-Length: cut off at the cap
            for _ in range(3):
                yield b"y" * (1024 * 1024)

        assert (
            await b.put(f"/v1/sandboxes/{sb.id}/file?path=big", content=chunks())
        ).status_code == 413
        assert not await sb.files.exists("big")
        async with SandboxManagerFactory.create_manager(base_url=server.url, api_key=KEY_B) as m:
            one = await m.create_sandbox("docker", {"tools_config": ["python_executor"]})
            two = await m.create_sandbox("docker", {})
            refused = await b.post("/sandbox/create", params={"sandbox_type": "docker"}, json={})
            assert refused.status_code == 429  # 3 per key
            r1 = await m.execute_tool(one, "python_executor", {"code": "z = 7"})
            r2 = await m.execute_tool(one, "python_executor", {"code": "z * 6"})
            assert r1.ok and r2.output.strip() == "42"
            assert {i.id for i in await m.list_sandboxes()} >= {one, two}
            remote = await m.get_sandbox(one)
            assert (await remote.run_python("z")).result["data"]["text/plain"] == "7"  # type: ignore[index]
        async with client(server, KEY_B) as again:
            left = {s["id"] for s in (await again.get("/v1/sandboxes")).json()}
        assert left == {sb.id}  # the manager removed what it created


async def test_idle_sandboxes_are_reaped_and_pool_creation(docker_engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    srv = Server(
        f"t-idle-{os.getpid()}", tmp_path, ["--idle-timeout", "3", "--pool-size", "1"]
    ).start()
    try:
        async with client(srv) as c:
            warm = (await c.post("/v1/sandboxes", json={"pool": True})).json()
            assert warm["pooled"] is True
            busy = (await c.post("/v1/sandboxes", json={"memory_limit": "512m"})).json()["id"]
            # a call longer than the idle time keeps its sandbox: it is in use
            long = await c.post(
                f"/v1/sandboxes/{busy}/python", json={"code": "import time; time.sleep(5)"}
            )
            assert long.json()["status"] == "ok"
            assert (await c.get(f"/v1/sandboxes/{busy}")).status_code == 200
            ids = {warm["id"], busy}
            for _ in range(100):  # reaped after 3 s unused (checked every ~0.75 s)
                left = {s["id"] for s in (await c.get("/v1/sandboxes")).json()}
                if not left & ids:
                    break
                await asyncio.sleep(0.2)
            assert not left & ids
            assert (await c.get(f"/v1/sandboxes/{busy}/notebook")).status_code == 404
        assert list(tmp_path.rglob(f"{busy}.ipynb"))  # the notebook stays on the server
    finally:
        srv.stop()


async def test_the_agent_loop_runs_on_a_remote_sandbox(server: Server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from kernel_sandbox.agent import Agent
    from tests.openai_server import ScriptedOpenAIServer, call, text, tool_calls

    script = [
        tool_calls(call("python_executor", {"code": "x = 6 * 7", "timeout": None}, id="c1")),
        tool_calls(call("python_executor", {"code": "print(x)", "timeout": None}, id="c2")),
        lambda req: text(f"x is {req.tool_results()[-1]['output'].strip()}"),
    ]
    async with await RemoteSandbox.create(server.url, api_key=KEY_A) as sb:
        with ScriptedOpenAIServer(script) as llm:
            agent = Agent(
                base_url=llm.base_url,
                model="scripted",
                sandbox=sb,
                tools_config={"python_executor": {}},
                notebook_dir=tmp_path / "sessions",
            )
            result = await agent.arun("compute x")
        assert result.status == "completed" and result.answer == "x is 42"
        local = nbformat.read(next((tmp_path / "sessions").glob("*.ipynb")), as_version=4)
        nbformat.validate(local)  # the agent's own notebook, written on this side
        assert [c.source for c in local.cells if c.cell_type == "code"][:2] == [
            "x = 6 * 7",
            "print(x)",
        ]
        assert (await sb.run_python("x")).result["data"]["text/plain"] == "42"  # type: ignore[index]


async def test_files_stream_both_ways_and_a_refused_upload_changes_nothing(
    server: Server, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    source = tmp_path / "up.bin"
    source.write_bytes(os.urandom(1_800_000))  # under the 2 MiB cap, in many pieces
    async with (
        await RemoteSandbox.create(server.url, api_key=KEY_A) as sb,
        client(server) as c,
    ):
        await sb.files.upload(source, "in/up.bin")
        got = tmp_path / "down" / "up.bin"
        await sb.files.download("in/up.bin", got)
        assert got.read_bytes() == source.read_bytes()
        # the response is a stream with the file's length, read piece by piece
        async with c.stream(
            "GET", f"/v1/sandboxes/{sb.id}/file", params={"path": "in/up.bin"}
        ) as r:
            assert r.headers["content-length"] == "1800000"
            pieces = [piece async for piece in r.aiter_raw()]
        assert b"".join(pieces) == source.read_bytes() and len(pieces) > 1
        # a client that leaves mid-download stops the transfer: the sandbox goes on
        async with c.stream(
            "GET", f"/v1/sandboxes/{sb.id}/file", params={"path": "in/up.bin"}
        ) as r:
            async for _ in r.aiter_raw():
                break
        assert (await sb.run_python("1 + 1")).result["data"]["text/plain"] == "2"  # type: ignore[index]
        assert await sb.files.read("in/up.bin") == source.read_bytes()

        # past the cap: 413, the old file intact, no temporary file left beside it
        async def chunks():  # type: ignore[no-untyped-def]
            for _ in range(3):
                yield os.urandom(1024 * 1024)

        put = await c.put(
            f"/v1/sandboxes/{sb.id}/file", params={"path": "in/up.bin"}, content=chunks()
        )
        assert put.status_code == 413
        assert await sb.files.read("in/up.bin") == source.read_bytes()
        assert [i.name for i in await sb.files.list("in")] == ["up.bin"]
        # a refused download answers before any byte, and leaves nothing here
        with pytest.raises(SandboxFileNotFoundError):
            await sb.files.download("in/missing.bin", tmp_path / "down" / "missing.bin")
        assert sorted(p.name for p in (tmp_path / "down").iterdir()) == ["up.bin"]
        # the session notebook records the upload once, by size (too large to embed)
        sources = ["".join(c.source) for c in nbformat.from_dict(await sb.notebook()).cells]
        assert len([s for s in sources if "`write` `/sandbox/in/up.bin` (1757.8 KB)" in s]) == 1


async def test_streamed_outputs_are_nbformat_outputs(server: Server) -> None:
    code = (
        "from IPython.display import display, HTML, JSON, Image\n"
        "import base64\n"
        "png = base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNg'\n"
        "                       'YGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg==')\n"
        "print('text', flush=True)\n"
        "display(HTML('<b>bold</b>'))\n"
        "display(JSON({'a': [1, 2]}))\n"
        "display(Image(data=png))\n"
        "{'k': 1}"
    )
    async with await RemoteSandbox.create(server.url, api_key=KEY_A) as sb:
        seen: list[dict] = []
        ex = await sb.run_python(code, on_output=seen.append)
        assert ex.status == "ok"
        kinds = [(o["output_type"], sorted(o.get("data", {}))) for o in seen]
        assert ("stream", []) in kinds
        assert ("display_data", ["text/html", "text/plain"]) in kinds
        assert ("display_data", ["application/json", "text/plain"]) in kinds
        assert ("display_data", ["image/png", "text/plain"]) in kinds
        assert kinds[-1] == ("execute_result", ["text/plain"])
        json_out = next(o for o in seen if "application/json" in o.get("data", {}))
        assert json_out["data"]["application/json"] == {"a": [1, 2]}  # a dict, not a string
        png_out = next(o for o in seen if "image/png" in o.get("data", {}))
        assert png_out["data"]["image/png"].startswith("iVBORw0KGgo")
        # every streamed output is a valid nbformat output, the same as in the result
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code, outputs=seen)])
        nbformat.validate(nb)
        assert seen == ex.outputs
