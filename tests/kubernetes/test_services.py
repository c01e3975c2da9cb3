"""Everything above the host, unchanged, on the cluster: the manager and its tools, the
seed (ms-enclave) program, an agent session recorded and replayed, the warm pool, and a
pod deleted from outside (a clear error; gc and ps on the cluster)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from kernel_sandbox import DockerSandboxConfig, SandboxManagerFactory, SandboxType
from kernel_sandbox.agent import Agent, RetryPolicy
from kernel_sandbox.cli.main import cli
from kernel_sandbox.notebook import META_KEY, areplay, read_notebook
from kernel_sandbox.pool import POOL_LABEL, SandboxPool
from tests.conftest import TEST_LABEL
from tests.kubernetes.conftest import DATASCIENCE_IMAGE, PYTHON_IMAGE, ROOT
from tests.openai_server import ScriptedOpenAIServer, call, text, tool_calls
from tests.waiting import await_for

pytestmark = pytest.mark.kubernetes

ALL_TOOLS = {"python_executor": {}, "shell_executor": {}, "file_operation": {}}


def pods(kube, namespace: str, selector: str) -> list:
    found = kube.core.list_namespaced_pod(namespace, label_selector=selector).items
    return [p for p in found if p.metadata.deletion_timestamp is None]


async def test_manager_tools_on_the_cluster(kube, namespace) -> None:
    async with SandboxManagerFactory.create_manager(labels=TEST_LABEL, host="kubernetes") as mgr:
        sid = await mgr.create_sandbox(
            SandboxType.DOCKER, DockerSandboxConfig(image=PYTHON_IMAGE, tools_config=ALL_TOOLS)
        )
        assert list(await mgr.get_sandbox_tools(sid)) == list(ALL_TOOLS)
        py = await mgr.execute_tool(sid, "python_executor", {"code": "x = 6\nprint(x * 7)"})
        assert py.status == "success" and py.output.strip() == "42"
        sh = await mgr.execute_tool(sid, "shell_executor", {"command": "echo hi > a.txt; id -u"})
        assert sh.status == "success" and sh.output.strip() == "1000"
        read = await mgr.execute_tool(
            sid, "file_operation", {"operation": "read", "file_path": "a.txt"}
        )
        assert read.status == "success" and read.output.strip() == "hi"
        sandbox = await mgr.get_sandbox(sid)
        assert pods(kube, namespace, f"kernel-sandbox.id={sandbox.id}")
    assert not pods(kube, namespace, f"kernel-sandbox.id={sandbox.id}")


def test_the_seed_program_runs_through_the_manager(cluster, namespace, tmp_path) -> None:
    """examples/openai_tools.py on the cluster, its host volume left out (a pod cannot
    bind a directory of this machine; see docs/how-to/kubernetes.md)."""
    source = (ROOT / "examples" / "openai_tools.py").read_text()
    volume_line = next(line for line in source.splitlines() if "volumes=" in line)
    script = tmp_path / "seed.py"
    script.write_text(source.replace(volume_line + "\n", ""))

    def summary(request):
        python, shell = request.tool_results()
        return text(f"{python['output'].strip()} | {shell['output'].strip()}")

    server = ScriptedOpenAIServer(
        [
            tool_calls(
                call("python_executor", {"code": "print(123456 * 654321)", "timeout": None}),
                call("shell_executor", {"command": "id -un; pwd", "timeout": None, "cwd": None}),
            ),
            summary,
        ]
    )
    env = {
        **os.environ,
        "OPENAI_API_KEY": "test-key",
        "OPENAI_MODEL": "scripted-model",
        "SANDBOX_IMAGE": PYTHON_IMAGE,
        "KERNEL_SANDBOX_HOST": "kubernetes",
        "PYTHONPATH": str(ROOT),
    }
    with server:
        env["OPENAI_BASE_URL"] = server.base_url
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "80779853376 | sandbox\n/sandbox".replace("\n", "\n")


async def test_agent_session_recorded_on_the_cluster_replays(namespace, tmp_path) -> None:
    from kernel_sandbox.sandbox import AsyncSandbox

    csv = "day,sales\n1,10\n2,14\n3,9\n"
    script = [
        tool_calls(
            call(
                "file_operation",
                {"operation": "write", "file_path": "s.csv", "content": csv, "encoding": None},
                id="w",
            ),
            call(
                "python_executor",
                {
                    "code": "import pandas as pd\ndf = pd.read_csv('s.csv')\nint(df.sales.sum())",
                    "timeout": None,
                },
                id="p",
            ),
        ),
        tool_calls(
            call(
                "python_executor",
                {
                    "code": "import matplotlib.pyplot as plt\n"
                    "plt.plot(df.day, df.sales)\nplt.show()",
                    "timeout": None,
                },
                id="q",
            )
        ),
        text("Sales sum to 33."),
    ]
    sandbox = await AsyncSandbox.create(
        host="kubernetes", image=DATASCIENCE_IMAGE, labels=TEST_LABEL
    )
    try:
        with ScriptedOpenAIServer(script) as server:
            agent = Agent(
                base_url=server.base_url,
                api_key="test",
                model="scripted",
                notebook_dir=tmp_path,
                sandbox=sandbox,
                retry=RetryPolicy(max_retries=1, initial_delay=0.01, max_delay=0.05),
            )
            result = await agent.arun("Sum the sales and plot them")
    finally:
        await sandbox.close()
    assert result.status == "completed", result.reason
    nb = read_notebook(result.notebook_path)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert any("image/png" in o.get("data", {}) for o in code[-1].outputs)
    report = await areplay(
        result.notebook_path,
        output=tmp_path / "replayed.ipynb",
        sandbox_options={"host": "kubernetes", "labels": TEST_LABEL},
    )
    assert report.ok, report
    replayed = read_notebook(tmp_path / "replayed.ipynb")
    assert replayed.metadata[META_KEY]["replay"]["status"] == "ok"


async def test_the_warm_pool_keeps_ready_pods(kube, namespace) -> None:
    pool = SandboxPool(size=2, image=PYTHON_IMAGE, labels=dict(TEST_LABEL), host="kubernetes")
    async with pool:
        selector = f"{POOL_LABEL}={pool.id}"
        await await_for(lambda: len(pods(kube, namespace, selector)) == 2, timeout=60, interval=0.2)
        async with pool.acquire() as first:
            await first.run_python("secret = 42")
            await first.files.write("secret.txt", "42")
            first_id = first.id
        async with pool.acquire() as second:
            assert second.id != first_id
            probe = await second.run_python("'secret' in globals()")
            assert probe.text == "False"
            assert not await second.files.exists("secret.txt")
        assert pool.stats().created >= 2
    await await_for(lambda: not pods(kube, namespace, selector), timeout=60, interval=0.2)


async def test_pod_deleted_from_outside_then_gc_leaves_nothing(make_sandbox, kube, namespace):
    sb = await make_sandbox()
    await sb.run_python("x = 1")
    kube.core.delete_namespaced_pod(sb.container_id, namespace)  # as `kubectl delete pod`
    selector = f"kernel-sandbox.id={sb.id}"

    async def pod_gone() -> bool:  # deletion is asynchronous: the kubelet kills, then confirms
        return not kube.core.list_namespaced_pod(namespace, label_selector=selector).items

    await await_for(pod_gone, timeout=90, interval=0.2)
    ex = await sb.run_python("x", timeout=20)
    assert ex.status == "kernel_died" and ex.state_lost
    assert "deleted from outside" in ex.message
    shell = sb.run_shell("true")
    with pytest.raises(Exception, match="deleted from outside"):
        await shell
    runner = CliRunner()
    listed = await asyncio.to_thread(runner.invoke, cli, ["ps", "--all", "--host", "kubernetes"])
    assert listed.exit_code == 0, listed.output
    await sb.close()
    swept = await asyncio.to_thread(runner.invoke, cli, ["gc", "--host", "kubernetes"])
    assert swept.exit_code == 0, swept.output

    async def nothing_left() -> bool:
        return not (
            pods(kube, namespace, selector)
            or kube.core.list_namespaced_secret(namespace, label_selector=selector).items
            or kube.networking.list_namespaced_network_policy(
                namespace, label_selector=selector
            ).items
        )

    await await_for(nothing_left, timeout=90, interval=0.2)


async def test_ps_lists_a_live_sandbox(make_sandbox) -> None:
    sb = await make_sandbox()
    listed = await asyncio.to_thread(CliRunner().invoke, cli, ["ps", "--host", "kubernetes"])
    assert listed.exit_code == 0, listed.output
    assert sb.id in listed.output and "running" in listed.output
