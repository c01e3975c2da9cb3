"""E2B's own SDKs (``e2b`` 2.63, ``e2b-code-interpreter`` 2.11, from their own
virtualenv, unmodified) drive ``kernel-sandbox serve`` through its E2B API.

Each test runs one client program in that virtualenv with the three environment
variables a user sets (``E2B_API_URL``, ``E2B_SANDBOX_URL``, ``E2B_API_KEY``) and
checks what it printed, and what the server recorded.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import nbformat
import pytest

from kernel_sandbox.limits import (
    E2B_LIST_LIMIT,
    E2B_MAX_DEPTH,
    E2B_MAX_PROCESSES,
    E2B_MAX_TIMEOUT,
    E2B_MAX_UPLOAD_FILES,
    E2B_MAX_WATCHERS,
    E2B_WATCHER_EVENTS,
)
from tests.integration.serving import KEY_A, KEY_B, ROOT, Server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, docker_engine) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    # E2B's code interpreter has matplotlib and pandas: so has our datascience image
    template = ["--e2b-template", "code-interpreter-v1=kernel-sandbox:datascience"]
    template += ["--e2b-template", "polyglot=kernel-sandbox:polyglot"]
    # every running E2B command and watcher is a stream its SDK holds open: caps above one
    # sandbox's E2B_MAX_PROCESSES + E2B_MAX_WATCHERS, so that those are the caps reached
    streams = str(E2B_MAX_PROCESSES + E2B_MAX_WATCHERS + 4)
    caps = ["--max-streams-per-key", streams, "--max-calls-per-key", streams]
    caps += ["--snapshot-dir", str(tmp_path_factory.mktemp("snapshots"))]
    srv = Server(f"t-e2b-{os.getpid()}", tmp_path_factory.mktemp("nb"), template + caps).start()
    yield srv
    srv.stop()


def e2b_env(server: Server, key: str = KEY_A) -> dict[str, str]:
    """The environment a user of E2B's SDK sets to use this server."""
    return {
        **os.environ,
        "E2B_API_URL": f"{server.url}/e2b",
        "E2B_SANDBOX_URL": f"{server.url}/e2b/sandbox",
        "E2B_API_KEY": key,
        "E2B_VALIDATE_API_KEY": "false",
    }


def run_client(python: Path, server: Server, program: str, key: str = KEY_A) -> Any:
    """Run ``program`` with E2B's SDK; the JSON it printed last."""
    done = subprocess.run(
        [str(python), "-c", program],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=e2b_env(server, key),
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


CODE = r"""
import json
from e2b_code_interpreter import Sandbox
out = {}
sb = Sandbox.create(timeout=120, metadata={"suite": "code"})
out["id"] = sb.sandbox_id
first = sb.run_code("x = 41\nprint('hello')\nx + 1")
out["first"] = [first.text, first.logs.stdout, first.execution_count]
out["state"] = sb.run_code("x * 2").text
seen = []
sb.run_code("import sys\nprint('a'); print('b', file=sys.stderr)",
            on_stdout=lambda m: seen.append(["out", m.line]),
            on_stderr=lambda m: seen.append(["err", m.line]))
out["callbacks"] = seen
err = sb.run_code("1/0")
out["error"] = [err.error.name, err.error.value, "ZeroDivisionError" in err.error.traceback]
plot = sb.run_code(
    "import matplotlib\nmatplotlib.use('agg')\nimport matplotlib.pyplot as plt\n"
    "%matplotlib inline\nplt.plot([1, 2, 3]); plt.show()")
out["png"] = [r.png[:40] for r in plot.results if r.png]
html = sb.run_code("from IPython.display import HTML, Markdown\n"
                   "display(HTML('<b>hi</b>')); Markdown('**md**')")
out["formats"] = [[r.html, r.markdown, r.is_main_result] for r in html.results]
out["env"] = sb.run_code("import os; os.environ.get('PER_CALL')", envs={"PER_CALL": "yes"}).text
out["env_after"] = sb.run_code("import os; os.environ.get('PER_CALL')").text
ctx = sb.create_code_context(cwd="/tmp")
out["context"] = [sb.run_code("import os; os.getcwd()", context=ctx).text,
                  sb.run_code("x", context=ctx).error.name]
out["contexts"] = [c.language for c in sb.list_code_contexts()]
sb.remove_code_context(ctx)
out["contexts_after"] = len(sb.list_code_contexts())
try:
    sb.run_code("import time; time.sleep(30)", timeout=2)
except Exception as exc:
    out["timeout"] = type(exc).__name__
out["after_timeout"] = sb.run_code("x").text
print(json.dumps(out))
"""


def test_run_code_keeps_state_streams_plots_and_errors(server: Server, e2b_python: Path) -> None:
    out = run_client(e2b_python, server, CODE)
    assert out["first"] == ["42", ["hello\n"], 1]
    assert out["state"] == "82"
    assert out["callbacks"] == [["out", "a\n"], ["err", "b\n"]]
    assert out["error"] == ["ZeroDivisionError", "division by zero", True]
    assert len(out["png"]) == 1
    assert base64.b64decode(out["png"][0] + "==")[:4] == b"\x89PNG"
    assert out["formats"] == [["<b>hi</b>", None, False], [None, "**md**", True]]
    assert out["env"] == "yes"
    assert out["env_after"] is None  # gone again after the call: no value to show
    # a context is a kernel of its own in the same sandbox
    assert out["context"] == ["/tmp", "NameError"]
    assert out["contexts"] == ["python", "python"]
    assert out["contexts_after"] == 1
    # the client's own timeout interrupted the cell; the kernel kept its variables
    assert out["timeout"] == "TimeoutException"
    assert out["after_timeout"] == "41"
    # every call was recorded in the session's notebook, like any other session
    notebook = httpx2.get(
        f"{server.url}/v1/sandboxes/{out['id']}/notebook",
        headers={"X-API-Key": KEY_A},
        timeout=30,
    )
    assert notebook.status_code == 200
    nb = nbformat.reads(notebook.text, as_version=4)
    sources = [cell.source for cell in nb.cells if cell.cell_type == "code"]
    assert "x = 41\nprint('hello')\nx + 1" in sources
    assert "1/0" in sources


LANGUAGES = r"""
import json
from e2b_code_interpreter import Sandbox
out = {}
sb = Sandbox.create("polyglot", timeout=120, envs={"KEPT": "sandbox"})
out["contexts"] = sorted(c.language for c in sb.list_code_contexts())
show = {"python": "import os; print(os.environ.get('{0}', 'unset'))",
        "r": "cat(Sys.getenv('{0}', 'unset'), '\\n', sep = '')",
        "javascript": "console.log(Deno.env.get('{0}') ?? 'unset')",
        "bash": "echo ${{{0}:-unset}}"}
for language, code in show.items():
    during = sb.run_code(code.format("PER_CALL") + "\n" + code.format("KEPT"), language=language,
                         envs={"PER_CALL": "it's \"1\" $HOME", "KEPT": "call"})
    after = sb.run_code(code.format("PER_CALL") + "\n" + code.format("KEPT"), language=language)
    out[language] = [during.logs.stdout, after.logs.stdout]
frame = sb.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', 'z']})")
out["data"] = frame.results[0].data
image = sb.run_code("import numpy\nfrom PIL import Image\n"
                    "Image.fromarray(numpy.zeros((4, 4, 3), 'uint8')).show()\nprint('shown')")
out["image"] = [bool(r.png) for r in image.results]
chart = sb.run_code("import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\n"
                    "ax.bar(['a', 'b'], [1, 2]); ax.set_title('t')\nplt.show()")
out["chart"] = [[r.chart.type.value, r.chart.title, bool(r.png)] for r in chart.results]
try:
    sb.run_code("1", language="java")
except Exception as exc:
    out["java"] = [type(exc).__name__, str(exc)]
sb.kill()
print(json.dumps(out))
"""


def test_e2b_conventions_in_every_language(server: Server, e2b_python: Path) -> None:
    """What E2B's own suites check beyond Jupyter: per-call envs in each language,
    restored after the call; DataFrames with their columns; charts read from matplotlib
    figures; PIL's show() displays;
    the javascript default context; a language without a kernel is a clear 400."""
    out = run_client(e2b_python, server, LANGUAGES)
    assert out["contexts"] == ["javascript", "python"]
    for language in ("python", "r", "javascript", "bash"):
        during, after = out[language]
        assert "".join(during).split("\n")[:2] == ['it\'s "1" $HOME', "call"], language
        assert "".join(after).split("\n")[:2] == ["unset", "sandbox"], language
    assert out["data"] == {"a": [1, 2, 3], "b": ["x", "y", "z"]}
    assert out["image"] == [True]
    assert out["chart"] == [["bar", "t", True]]  # e2b_charts read the figure; its PNG too
    assert out["java"][0] == "SandboxException" and "no 'java' kernel" in out["java"][1]


SNAPSHOTS = r"""
import json
from e2b_code_interpreter import Sandbox
out = {}
sb = Sandbox.create(timeout=120)
sb.files.write("/home/user/kept.txt", "from the original")
sb.run_code("x = 41")
snap = sb.create_snapshot(name="mine")
out["names"] = snap.names
listed = Sandbox.list_snapshots(sandbox_id=sb.sandbox_id).next_items()
out["listed"] = [s.snapshot_id for s in listed]
out["by_name"] = len(Sandbox.list_snapshots(name="mine").next_items())
copy = Sandbox.create(snap.snapshot_id, timeout=60)
out["copy"] = [copy.files.read("/home/user/kept.txt"), copy.run_code("x + 1").text]
forks = sb.fork(count=2)
out["forks"] = [f.run_code("x").text for f in forks]
out["deleted"] = [Sandbox.delete_snapshot(snap.snapshot_id) for _ in range(2)]
for s in [sb, copy, *forks]:
    s.kill()
print(json.dumps(out))
"""


def test_snapshots_and_forks_are_the_servers_own(server: Server, e2b_python: Path) -> None:
    """E2B's snapshot calls on our portable snapshots: a snapshot's id starts sandboxes
    with its files and variables, lists by source and name, deletes once; forks too."""
    out = run_client(e2b_python, server, SNAPSHOTS)
    assert out["names"] == ["mine:default"]
    assert len(out["listed"]) == 1 and out["by_name"] == 1
    assert out["copy"] == ["from the original", "42"]
    assert out["forks"] == ["41", "41"]
    assert out["deleted"] == [True, False]


FILES = r"""
import asyncio, json, os
from e2b import AsyncSandbox, FileType
from e2b.sandbox.filesystem.watch_handle import FilesystemEventType

async def main():
    out = {}
    sb = await AsyncSandbox.create(timeout=120)
    info = await sb.files.write("notes/a.txt", "alpha")
    out["write"] = [info.name, info.path]
    out["read"] = await sb.files.read("notes/a.txt")
    await sb.files.write_files([{"path": "/home/user/m1.bin", "data": b"\x00\x01"},
                                {"path": "m2.txt", "data": "two"}])
    out["bytes"] = list(await sb.files.read("/home/user/m1.bin", format="bytes"))
    await sb.files.write("big", b"z" * 3_000_000)
    out["big"] = len(await sb.files.read("big", format="bytes"))
    out["exists"] = [await sb.files.exists("m2.txt"), await sb.files.exists("nope")]
    out["list"] = sorted((e.name, e.type.value) for e in await sb.files.list("."))
    out["deep"] = [e.path for e in await sb.files.list(".", depth=2)]
    out["mkdir"] = [await sb.files.make_dir("d1/d2"), await sb.files.make_dir("d1/d2")]
    moved = await sb.files.rename("m2.txt", "d1/moved.txt")
    out["rename"] = [moved.path, await sb.files.read("d1/moved.txt")]
    stat = await sb.files.get_info("d1/moved.txt")
    try:  # the file system's refusal is the caller's error, not the server's
        await sb.files.rename("d1", "d1/d2/d1")
    except Exception as exc:
        out["into_itself"] = [type(exc).__name__, str(exc)]
    out["stat"] = [stat.size, stat.type.value, stat.permissions, stat.owner]
    await sb.files.remove("d1")
    await sb.files.remove("never-there")  # as envd's remove-all: nothing there, done
    out["removed"] = await sb.files.exists("d1")
    try:
        await sb.files.read("missing.txt")
    except Exception as exc:
        out["missing"] = type(exc).__name__
    events = []
    handle = await sb.files.watch_dir("notes", on_event=lambda e: events.append(
        [e.name, e.type.value]))
    await sb.files.write("notes/new.txt", "x")
    await sb.files.remove("notes/a.txt")
    for _ in range(100):
        names = {(n, t) for n, t in events}
        if ("new.txt", FilesystemEventType.CREATE.value) in names and (
                "a.txt", FilesystemEventType.REMOVE.value) in names:
            break
        await asyncio.sleep(0.1)
    await handle.stop()
    out["events"] = sorted({tuple(e) for e in events})
    ended = asyncio.get_running_loop().create_future()
    await sb.files.watch_dir("notes", on_event=lambda e: None, timeout=1, on_exit=lambda err: (
        ended.done() or ended.set_result(type(err).__name__ if err else None)))
    out["watch_ended"] = await asyncio.wait_for(ended, 30)  # the watch's own timeout
    await sb.kill()
    print(json.dumps(out), flush=True)

asyncio.run(main())
# pyqwest (the SDK's HTTP stack) now and then aborts at interpreter exit after a
# cancelled stream (the watch); everything was printed by now
os._exit(0)
"""


def test_files_write_read_list_move_and_watch(server: Server, e2b_python: Path) -> None:
    out = run_client(e2b_python, server, FILES)
    assert out["write"] == ["a.txt", "/home/user/notes/a.txt"]
    assert out["read"] == "alpha"
    assert out["bytes"] == [0, 1]
    assert out["big"] == 3_000_000
    assert out["exists"] == [True, False]
    assert ("notes", "dir") in [tuple(e) for e in out["list"]]
    assert ("m2.txt", "file") in [tuple(e) for e in out["list"]]
    assert "/home/user/notes/a.txt" in out["deep"]
    assert out["deep"] == sorted(out["deep"], key=lambda p: p.split("/"))  # envd's walk order
    assert out["mkdir"] == [True, False]
    assert out["rename"] == ["/home/user/d1/moved.txt", "two"]
    assert out["stat"] == [3, "file", "-rw-r--r--", "user"]  # the sandbox user, as E2B names it
    assert out["into_itself"][0] == "InvalidArgumentException", out["into_itself"]
    assert "Invalid argument: /home/user/d1" in out["into_itself"][1], out["into_itself"]
    assert out["removed"] is False
    assert out["missing"] == "FileNotFoundException"
    assert ["new.txt", "create"] in [list(e) for e in out["events"]]
    assert ["a.txt", "remove"] in [list(e) for e in out["events"]]
    assert out["watch_ended"] == "TimeoutException"


COMMANDS = r"""
import json, time
from e2b import Sandbox, CommandExitException
out = {}
sb = Sandbox.create(timeout=120, envs={"FROM_CREATE": "c"})
r = sb.commands.run("echo out; echo err >&2; pwd; echo $FROM_CREATE $MINE", envs={"MINE": "m"})
out["fg"] = [r.exit_code, r.stdout, r.stderr]
try:
    sb.commands.run("exit 3")
except CommandExitException as exc:
    out["exit"] = exc.exit_code
bg = sb.commands.run("sleep 0.5; echo done", background=True)
out["bg"] = [bg.pid > 0, bg.wait().stdout]
cat = sb.commands.run("cat", background=True, stdin=True)
sb.commands.send_stdin(cat.pid, "typed\n")
sb.commands.close_stdin(cat.pid)
out["stdin"] = cat.wait().stdout
long = sb.commands.run("sleep 60", background=True)
out["listed"] = long.pid in [p.pid for p in sb.commands.list()]
out["kill"] = sb.commands.kill(long.pid)
try:
    long.wait()
except CommandExitException as exc:
    out["killed"] = [exc.exit_code, exc.error]
out["after"] = long.pid in [p.pid for p in sb.commands.list()]
out["cwd"] = sb.commands.run("pwd", cwd="/tmp").stdout
out["refused"] = []
for bad in ({"envs": {"NUL": "a\0b"}}, {"envs": {"A=B": "c"}}, {"cwd": "/tmp\0x"}):
    try:
        sb.commands.run("true", **bad)
    except Exception as exc:
        out["refused"].append([type(exc).__name__, str(exc)])
sb.kill()
print(json.dumps(out))
"""


def test_commands_foreground_background_stdin_and_kill(server: Server, e2b_python: Path) -> None:
    out = run_client(e2b_python, server, COMMANDS)
    assert out["fg"] == [0, "out\n/home/user\nc m\n", "err\n"]
    assert out["exit"] == 3
    # what no exec can take is the caller's error before anything starts
    assert [name for name, _ in out["refused"]] == ["InvalidArgumentException"] * 3, out
    assert "NUL byte" in out["refused"][0][1] and "'A=B'" in out["refused"][1][1], out
    assert out["bg"] == [True, "done\n"]
    assert out["stdin"] == "typed\n"
    assert out["listed"] is True
    assert out["kill"] is True
    assert out["killed"][0] == -1
    assert out["after"] is False
    assert out["cwd"] == "/tmp\n"


CAPS = r"""
import json, time
from e2b import Sandbox
MAX_PROCESSES, MAX_WATCHERS = PROCESSES_CAP, WATCHERS_CAP
def refused(call):
    try:
        call()
    except Exception as exc:
        return type(exc).__name__ + ": " + str(exc)[:300]
    return "allowed"
out = {}
sb = Sandbox.create(timeout=10**7)
info = sb.get_info()
out["lives"] = (info.end_at - info.started_at).total_seconds()
sb.commands.run("mkdir -p w many deep/" + "/".join(["d"] * 40))
sb.commands.run("cd many && seq 1 10050 | xargs touch")
out["list"] = refused(lambda: sb.files.list("many"))
deep = sb.files.list("deep", depth=100)
out["depth"] = max(len(e.path.split("/deep/")[1].split("/")) for e in deep)
watching = sb.files.watch_dir("w")
sb.commands.run("cd w && seq 1 1500 | xargs touch")
for _ in range(10):  # time for the events to arrive, without idling past the keep-alive
    time.sleep(0.5)
    sb.files.exists("w")
out["events"] = len(watching.get_new_events())
watching.stop()
files = [{"path": f"up/{i}", "data": "x"} for i in range(101)]
out["upload"] = refused(lambda: sb.files.write_files(files))
out["uploaded"] = len(sb.files.write_files(files[:100]))
# as many background commands as the cap allows: each one a process and a host thread
pids = [sb.commands.run("sleep 600", background=True).pid for _ in range(MAX_PROCESSES)]
out["commands"] = refused(lambda: sb.commands.run("sleep 600", background=True))
out["kill"] = sb.commands.kill(pids[0])
for _ in range(50):  # the killed command's end reaches the server
    again = refused(lambda: sb.commands.run("echo again"))
    if again == "allowed":
        break
    time.sleep(0.1)
out["after_kill"] = again
watchers = [sb.files.watch_dir("w") for _ in range(MAX_WATCHERS)]
out["watchers"] = refused(lambda: sb.files.watch_dir("w"))
watchers[0].stop()
out["watcher_after_stop"] = refused(lambda: sb.files.watch_dir("w"))
sb.kill()
print(json.dumps(out))
"""


def test_one_sandboxs_lifetime_listings_watch_events_uploads_commands_and_watchers_are_capped(
    server: Server, e2b_python: Path
) -> None:
    program = CAPS.replace("PROCESSES_CAP", str(E2B_MAX_PROCESSES))
    out = run_client(e2b_python, server, program.replace("WATCHERS_CAP", str(E2B_MAX_WATCHERS)))
    assert abs(out["lives"] - E2B_MAX_TIMEOUT) < 60  # 10**7 s asked: clamped
    assert f"more than {E2B_LIST_LIMIT} entries" in out["list"], out["list"]
    assert out["depth"] == E2B_MAX_DEPTH
    assert out["events"] == E2B_WATCHER_EVENTS  # 1500 files created: the oldest dropped
    assert out["upload"] != "allowed" and out["uploaded"] == E2B_MAX_UPLOAD_FILES
    # every command up to the cap runs at once (each holds a host thread of its own, not
    # one of the key's few executor threads), the next is refused saying so, and a kill
    # still works with the cap full; watchers likewise
    assert "E2B_MAX_PROCESSES" in out["commands"], out["commands"]
    assert out["kill"] is True and out["after_kill"] == "allowed", out
    assert "E2B_MAX_WATCHERS" in out["watchers"], out["watchers"]
    assert out["watcher_after_stop"] == "allowed", out


LIFECYCLE = r"""
import json, sys, time
from datetime import timedelta
from e2b import Sandbox, SandboxQuery, SandboxException, NotFoundException
out = {}
a = Sandbox.create(timeout=120, metadata={"who": "a", "n": "1"})
b = Sandbox.create(timeout=120, metadata={"who": "b"})
listed = Sandbox.list(query=SandboxQuery(metadata={"who": "a"})).next_items()
out["filtered"] = [s.sandbox_id == a.sandbox_id for s in listed]
out["all"] = sorted(s.metadata["who"] for s in Sandbox.list().next_items() if "who" in s.metadata)
def whos(found):  # this program's sandboxes only: the key has the other tests' too
    return [s.metadata["who"] for s in found if s.metadata.get("who") in ("a", "b")]
started = b.get_info().started_at
since = [Sandbox.list(query=SandboxQuery(started_after=started + timedelta(seconds=d))).next_items()
         for d in (0, 1)]
out["order"] = [whos(Sandbox.list().next_items()), whos(Sandbox.list(order="asc").next_items()),
                [whos(got) for got in since]]
info = a.get_info()
out["info"] = [info.template_id, info.metadata, info.state.value]
m = a.get_metrics()
out["metrics"] = [len(m) >= 1, m[0].mem_total > 0, m[0].disk_total > 0, m[0].cpu_count]
again = Sandbox.connect(a.sandbox_id)
out["connect"] = again.commands.run("echo same").stdout
from e2b_code_interpreter import Sandbox as CodeSandbox
c = CodeSandbox.create(timeout=120, metadata={"who": "c"})
c.run_code("kept = 7")
c.files.write("kept.txt", "on disk")
out["pause"] = [c.pause(), c.pause()]
out["paused_state"] = [s.state.value for s in Sandbox.list(
    query=SandboxQuery(metadata={"who": "c"})).next_items()]
back = CodeSandbox.connect(c.sandbox_id, timeout=120)
out["resumed"] = [back.run_code("kept * 6").text, back.files.read("kept.txt"),
                  back.get_info().state.value]
back.kill()
b.set_timeout(1)
time.sleep(3)
out["expired"] = b.is_running()
out["expired_listed"] = b.sandbox_id in [s.sandbox_id for s in Sandbox.list().next_items()]
out["kill"] = [Sandbox.kill(a.sandbox_id), Sandbox.kill(a.sandbox_id)]
out["ids"] = [a.sandbox_id]
print(json.dumps(out))
"""

OTHER_KEY = r"""
import json, sys
from e2b import Sandbox, SandboxException
out = {"listed": [s.sandbox_id for s in Sandbox.list().next_items()]}
mine = Sandbox.create(timeout=60)
try:
    Sandbox.connect(sys.argv[1])
    out["connect"] = "connected"
except SandboxException as exc:
    out["connect"] = type(exc).__name__
out["kill"] = Sandbox.kill(sys.argv[1])
mine.kill()
print(json.dumps(out))
"""


def test_list_metrics_timeout_kill_and_tenancy(server: Server, e2b_python: Path) -> None:
    out = run_client(e2b_python, server, LIFECYCLE)
    assert out["filtered"] == [True]
    assert out["all"] == ["a", "b"]
    assert out["order"] == [["b", "a"], ["a", "b"], [["b"], []]]  # newest first; filters
    assert out["info"] == ["base", {"who": "a", "n": "1"}, "running"]
    assert out["metrics"] == [True, True, True, 1]
    assert out["connect"] == "same\n"
    # pause saves files and variables and frees the container; connect resumes
    assert out["pause"] == [True, False]
    assert out["paused_state"] == ["paused"]
    assert out["resumed"] == ["42", "on disk", "running"]
    # a sandbox past its timeout is killed
    assert out["expired"] is False
    assert out["expired_listed"] is False
    assert out["kill"] == [True, False]


def test_another_keys_sandbox_is_invisible(server: Server, e2b_python: Path) -> None:
    made = run_client(
        e2b_python,
        server,
        "import json\nfrom e2b import Sandbox\n"
        "print(json.dumps(Sandbox.create(timeout=60).sandbox_id))",
    )
    program = OTHER_KEY.replace("sys.argv[1]", repr(made))
    out = run_client(e2b_python, server, program, key=KEY_B)
    assert made not in out["listed"]
    assert out["connect"] == "SandboxNotFoundException"
    assert out["kill"] is False
    # the owner still has it; the calls into it need its own access token
    headers = {"E2b-Sandbox-Id": made, "E2b-Sandbox-Port": "49983"}
    listing = httpx2.post(
        f"{server.url}/e2b/sandbox/filesystem.Filesystem/ListDir",
        json={"path": "/home/user"},
        headers=headers,
        timeout=30,
    )
    assert listing.status_code == 401
    done = httpx2.delete(
        f"{server.url}/e2b/sandboxes/{made}", headers={"X-API-Key": KEY_A}, timeout=60
    )
    assert done.status_code == 204
