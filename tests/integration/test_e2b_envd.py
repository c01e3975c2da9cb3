"""envd's own behaviour, as E2B's SDK test suite checks it, through E2B's SDK
(``e2b`` 2.63 from its own virtualenv, unmodified) against ``kernel-sandbox serve``.

What E2B's suite (``packages/python-sdk/tests``) found different from envd: a symlink's
entry, recursive watch events, the events of an upload, a missing directory watched,
metrics over a time range, a command past its timeout, a command whose sandbox is
killed, a wrong API key, file metadata (xattrs) and entries in watch events.  Each test
runs one client program and checks what it printed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernel_sandbox.limits import (
    E2B_ENTRY_METADATA_BYTES,
    E2B_MAX_PROCESSES,
    E2B_MAX_WATCHERS,
    E2B_WATCH_SCAN_ENTRIES,
)
from tests.integration.serving import Server
from tests.integration.test_e2b import run_client

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, docker_engine) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    # the E2B SDK's streams (watchers, commands) count against the key's caps
    streams = str(E2B_MAX_PROCESSES + E2B_MAX_WATCHERS + 4)
    caps = ["--max-streams-per-key", streams, "--max-calls-per-key", streams]
    srv = Server(f"t-e2benvd-{os.getpid()}", tmp_path_factory.mktemp("nb"), caps).start()
    yield srv
    srv.stop()


SYMLINKS = r"""
import json
from e2b import Sandbox
out = {}
sb = Sandbox.create(timeout=120)
sb.files.write("d/t.txt", "Hello")
sb.commands.run("ln -s t.txt link && ln -s gone broken && mkdir -p sub/in && "
                "ln -s sub dirlink && touch sub/in/f", cwd="/home/user/d")
def entry(e):
    return [e.name, e.type.value if e.type else None, e.symlink_target]
out["file"] = entry(sb.files.get_info("d/link"))
out["dir"] = entry(sb.files.get_info("d/dirlink"))
out["broken"] = entry(sb.files.get_info("d/broken"))
out["perm"] = sb.files.get_info("d/link").permissions[0]
out["list"] = [entry(e) for e in sb.files.list("d", depth=3)]
sb.kill()
print(json.dumps(out))
"""


def test_a_symlinks_entry_has_its_targets_type_and_the_path_it_resolves_to(
    server: Server, e2b_python: Path
) -> None:
    out = run_client(e2b_python, server, SYMLINKS)
    # as envd's: the target's type (a file, a directory), the resolved path
    assert out["file"] == ["link", "file", "/home/user/d/t.txt"]
    assert out["dir"] == ["dirlink", "dir", "/home/user/d/sub"]
    # a broken link: no type, the link's own path as its target
    assert out["broken"] == ["broken", None, "/home/user/d/broken"]
    assert out["perm"] == "L"  # Go's name of a link's mode, as envd prints it
    # a listing shows links as entries and does not walk into a linked directory
    paths = [e[0] for e in out["list"]]
    assert paths.count("in") == 1 and paths.count("f") == 1, out["list"]
    assert ["dirlink", "dir", "/home/user/d/sub"] in out["list"]


WATCH = r"""
import json, time
from e2b import Sandbox, FileNotFoundException
out = {}
sb = Sandbox.create(timeout=120)

def settle(handle, want):
    # the events of what was done, once they stop coming (or `want` of them came)
    seen, quiet = [], 0
    for _ in range(100):
        new = handle.get_new_events()
        seen += [[e.name, e.type.value] for e in new]
        quiet = 0 if new else quiet + 1
        if quiet >= 5 and len(seen) >= want:
            break
        time.sleep(0.1)
    return seen

sb.files.make_dir("w/nested")
handle = sb.files.watch_dir("w", recursive=True)
sb.files.write("w/nested/a.txt", "one")
out["upload"] = settle(handle, 3)
sb.files.make_dir("w/new")
sb.files.write("w/new/b.txt", "two")
out["new_dir"] = settle(handle, 4)
sb.commands.run("mkdir -p outside/big && cd outside/big && seq 1 400 | xargs touch && "
                "echo x > full && mv /home/user/outside/big /home/user/w/big")
out["moved_in"] = settle(handle, 2)
handle.stop()
try:
    sb.files.watch_dir("no-such-dir")
except FileNotFoundException as exc:
    out["missing"] = type(exc).__name__
sb.kill()
print(json.dumps(out))
"""


def test_recursive_watch_tells_nested_uploads_and_what_a_new_directory_already_holds(
    server: Server, e2b_python: Path
) -> None:
    out = run_client(e2b_python, server, WATCH)
    # an upload as envd's own tells it: created, chowned, written
    nested = "nested/a.txt"
    assert out["upload"] == [[nested, "create"], [nested, "chmod"], [nested, "write"]]
    # a directory made while watching is watched too: the file written in it right
    # after is seen, whether its own watch began before or after the write
    assert ["new", "create"] in out["new_dir"], out["new_dir"]
    assert ["new/b.txt", "write"] in out["new_dir"], out["new_dir"]
    # a directory moved in is told as created (fsnotify's word for a move's target);
    # what it held is listed as created, up to E2B_WATCH_SCAN_ENTRIES entries
    moved = out["moved_in"]
    assert moved[0] == ["big", "create"], moved[:3]
    inside = [name for name, kind in moved if name.startswith("big/") and kind == "create"]
    assert len(inside) == E2B_WATCH_SCAN_ENTRIES, len(inside)
    written = [name for name, kind in moved if kind == "write"]
    assert written in ([], ["big/full"]), written  # only a file with bytes was written
    assert out["missing"] == "FileNotFoundException"


METRICS = r"""
import json, time
from datetime import datetime, timedelta, timezone
from e2b import Sandbox
out = {}
began = datetime.now(timezone.utc)
sb = Sandbox.create(timeout=120)
out["now"] = len(sb.get_metrics(start=began, end=datetime.now(timezone.utc)))
time.sleep(1.1)
sb.get_metrics()
out["all"] = len(sb.get_metrics())
out["before"] = len(sb.get_metrics(start=began - timedelta(hours=1),
                                   end=began - timedelta(minutes=30)))
first = sb.get_metrics()[0].timestamp
out["up_to_first"] = len(sb.get_metrics(start=began - timedelta(seconds=1), end=first))
out["in_range"] = all(began.timestamp() - 1 <= m.timestamp.timestamp() for m in sb.get_metrics())
sb.kill()
print(json.dumps(out))
"""


def test_metrics_answer_for_the_time_range_asked_from_the_samples_kept(
    server: Server, e2b_python: Path
) -> None:
    out = run_client(e2b_python, server, METRICS)
    assert out["now"] == 1  # a range reaching the present: measured now
    assert out["all"] >= 3  # no range: every sample kept since the sandbox started
    assert out["before"] == 0  # before the sandbox existed: nothing, as E2B's
    # a range that ends in the past: the samples kept then, not one measured now
    assert out["up_to_first"] == 1
    assert out["in_range"] is True


COMMANDS = r"""
import json, time
from e2b import Sandbox, TimeoutException, CommandExitException
out = {}
sb = Sandbox.create(timeout=120)
began = time.monotonic()
try:
    sb.commands.run("sleep 31", timeout=2)
except TimeoutException as exc:
    out["timeout"] = [type(exc).__name__, round(time.monotonic() - began)]
for _ in range(40):  # the kill is on its way as the timeout is told
    running = sb.commands.run("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; true")
    out["killed"] = "sleep 31" not in running.stdout
    if out["killed"]:
        break
    time.sleep(0.25)
bg = sb.commands.run("sleep 60", background=True, timeout=0)
sb.kill()
try:
    bg.wait()
except (TimeoutException, CommandExitException) as exc:
    out["sandbox_killed"] = [type(exc).__name__, "was killed" in str(exc)]
print(json.dumps(out))
"""


def test_a_command_past_its_timeout_is_killed_and_one_whose_sandbox_is_killed_says_so(
    server: Server, e2b_python: Path
) -> None:
    out = run_client(e2b_python, server, COMMANDS)
    # envd's: the call's timeout ends the stream (DEADLINE_EXCEEDED) and the command
    assert out["timeout"][0] == "TimeoutException" and out["timeout"][1] < 10, out
    assert out["killed"] is True
    # the sandbox went while the command ran: the stream broke, the SDK asked the
    # sandbox's health and says it is gone (not the command's own exit)
    assert out["sandbox_killed"] == ["SandboxNotRunningException", True], out


WRONG_KEY = r"""
import json
from e2b import Sandbox, AuthenticationException
out = {}
for name, call in [("create", lambda: Sandbox.create(api_key="not-a-key")),
                   ("list", lambda: Sandbox.list(api_key="not-a-key").next_items())]:
    try:
        call()
        out[name] = "allowed"
    except Exception as exc:
        out[name] = [type(exc).__name__, "API key" in str(exc)]
print(json.dumps(out))
"""


def test_a_wrong_api_key_is_refused_in_e2bs_error_shape(server: Server, e2b_python: Path) -> None:
    out = run_client(e2b_python, server, WRONG_KEY)
    # the SDK reads E2B's {"code", "message"} (on any other body it failed: KeyError 'code')
    refused = ["AuthenticationException", True]
    assert out == {"create": refused, "list": refused}


METADATA = r"""
import json, time
from e2b import Sandbox
from e2b.sandbox.filesystem.filesystem import WriteEntry
out = {}
sb = Sandbox.create(timeout=120)
out["written"] = sb.files.write("m.txt", "x", metadata={"Author": "mish"}).metadata
out["stat"] = sb.files.get_info("m.txt").metadata
out["renamed"] = sb.files.rename("m.txt", "n.txt").metadata
out["listed"] = [e.metadata for e in sb.files.list(".") if e.name == "n.txt"]
out["overwritten"] = sb.files.write("n.txt", "y").metadata, sb.files.get_info("n.txt").metadata
many = sb.files.write_files([WriteEntry(path="a1", data="1"), WriteEntry(path="a2", data="2")],
                            metadata={"k": "v"})
out["many"] = [sb.files.get_info(w.path).metadata for w in many]
# set beside the SDK, past what an entry shows: the entry shows the cap's worth
sb.commands.run("python3 -c \"import os\nfor i in range(10): "
                "os.setxattr('/home/user/a1', 'user.e2b.k%d' % i, b'v' * 200)\"")
out["big"] = sum(len(k) + len(v) for k, v in sb.files.get_info("a1").metadata.items())
try:
    sb.files.write("b", "x", metadata={"huge": "v" * 2000})
    out["refused"] = "allowed"
except Exception as exc:
    out["refused"] = [type(exc).__name__, "E2B_ENTRY_METADATA_BYTES" in str(exc)]
handle = sb.files.watch_dir(".", include_entry=True, allow_network_mounts=True)
sb.files.write("w.txt", "abc", metadata={"t": "1"})
for _ in range(50):
    events = [e for e in handle.get_new_events() if e.type.value == "write"]
    if events:
        break
    time.sleep(0.1)
entry = events[0].entry
out["event_entry"] = [entry.name, entry.path, entry.type.value, entry.size]
handle.stop()
sb.kill()
print(json.dumps(out))
"""


def test_file_metadata_is_kept_as_xattrs_and_watch_events_carry_entries(
    server: Server, e2b_python: Path
) -> None:
    out = run_client(e2b_python, server, METADATA)
    # envd 0.6.2's metadata: X-Metadata-* headers at upload, user.e2b.* xattrs after
    assert out["written"] == out["stat"] == out["renamed"] == {"author": "mish"}
    assert out["listed"] == [{"author": "mish"}]
    assert out["overwritten"] == [None, None]  # a new upload replaces the file and its xattrs
    assert out["many"] == [{"k": "v"}, {"k": "v"}]
    assert 0 < out["big"] <= E2B_ENTRY_METADATA_BYTES  # 2000+ bytes set, the cap's worth shown
    assert out["refused"] == ["InvalidArgumentException", True], out["refused"]
    # envd 0.6.3's entries in watch events
    assert out["event_entry"] == ["w.txt", "/home/user/w.txt", "file", 3]


GIT = r"""
import json
from e2b import Sandbox
sb = Sandbox.create(timeout=120)
repo = "/home/user/repo"
sb.git.init(repo, initial_branch="main")
sb.git.configure_user("Sandbox Bot", "bot@example.com")
sb.files.write(f"{repo}/README.md", "hello\n")
sb.git.add(repo, all=True)
staged = [f.name for f in sb.git.status(repo).file_status]
sb.git.commit(repo, message="Initial commit")
status = sb.git.status(repo)
log = sb.commands.run("git log --format='%s|%an'", cwd=repo).stdout
out = {"staged": staged, "branch": status.current_branch, "left": len(status.file_status),
       "log": log.strip()}
sb.kill()
print(json.dumps(out))
"""


def test_the_sdks_git_works_in_the_base_template(server: Server, e2b_python: Path) -> None:
    # E2B's base template has git, and the SDK's sandbox.git runs it as a command
    out = run_client(e2b_python, server, GIT)
    assert out["staged"] == ["README.md"]
    assert out["branch"] == "main" and out["left"] == 0
    assert out["log"] == "Initial commit|Sandbox Bot"
