"""Contexts and languages on LocalKernelHost: a real non-IPython kernel (bash_kernel)
behind the relay, beside ipykernel, through the real sandbox code."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kernel_sandbox.contexts import kernel_for, normalise_language, parse_kernelspecs
from kernel_sandbox.errors import ConfigError, ContextNotFoundError
from kernel_sandbox.events import ContextChanged, Event, PythonExecuted
from kernel_sandbox.limits import MAX_CONTEXTS
from kernel_sandbox.tools import ToolSet
from tests.unit.conftest import NewSandbox
from tests.waiting import await_for


@pytest.fixture(autouse=True)
def _bash(bash_kernelspec: None) -> None:
    """Every test here has bash_kernel's kernelspec (tests/unit/conftest.py)."""


async def test_the_image_kernels_are_listed_with_their_languages(new_sandbox: NewSandbox) -> None:
    sandbox = await new_sandbox()
    specs = await sandbox.kernelspecs()
    assert specs["bash"].language == "bash" and specs["python3"].speaks == "python"
    assert {"bash", "python"} <= set(await sandbox.languages())


async def test_run_code_in_bash_keeps_state_and_shares_the_files(new_sandbox: NewSandbox) -> None:
    sandbox = await new_sandbox()
    seen: list[Event] = []
    sandbox.listeners.append(seen.append)
    first = await sandbox.run_code("kept=7; echo made $kept > shared.txt; echo hi", language="bash")
    assert first.status == "ok" and first.stdout.strip() == "hi"
    assert (await sandbox.run_code("echo $kept", language="sh")).stdout.strip() == "7"
    python = await sandbox.run_code("print(open('shared.txt').read().strip())")
    assert python.stdout.strip() == "made 7"
    assert [c.language for c in sandbox.list_contexts()] == ["python", "bash"]
    ran = [e for e in seen if isinstance(e, PythonExecuted)]
    assert [(e.language, e.kernel) for e in ran] == [("bash", "bash")] * 2 + [("python", "python3")]
    assert ran[0].context_id == sandbox.list_contexts()[1].id != "default"
    created = [e for e in seen if isinstance(e, ContextChanged)]
    assert [(e.change, e.context.language) for e in created] == [("created", "bash")]


async def test_an_error_and_a_timeout_in_bash_come_back_as_data(new_sandbox: NewSandbox) -> None:
    sandbox = await new_sandbox()
    await sandbox.run_code("kept=3", language="bash")
    failed = await sandbox.run_code("no-such-command-here", language="bash")
    assert failed.status == "error" and "no-such-command-here" in failed.stderr + failed.stdout
    # the timeout's interrupt_request becomes a SIGINT for this signal-mode kernel
    slow = await sandbox.run_code("sleep 60", language="bash", timeout=2)
    assert slow.status == "timeout" and not slow.state_lost
    assert (await sandbox.run_code("echo $kept", language="bash")).stdout.strip() == "3"


async def test_a_crashed_bash_kernel_is_detected_and_restarted(new_sandbox: NewSandbox) -> None:
    sandbox = await new_sandbox()
    await sandbox.run_code("kept=3", language="bash")
    await sandbox.run_python("py_kept = 1")
    # bash's parent is bash_kernel's Python: the kernel itself dies
    crashed = await sandbox.run_code("kill -9 $PPID", language="bash")
    assert crashed.status == "kernel_died" and crashed.state_lost
    assert "SIGKILL" in crashed.message and "restarted" in crashed.message
    assert (await sandbox.run_code("echo ${kept:-gone}", language="bash")).stdout.strip() == "gone"
    assert (await sandbox.run_python("py_kept")).text == "1"  # the other kernel is untouched


async def test_contexts_have_their_own_state_and_can_be_restarted_and_removed(
    new_sandbox: NewSandbox,
) -> None:
    sandbox = await new_sandbox()
    await sandbox.run_python("x = 'default'")
    (Path(sandbox.working_dir) / "sub").mkdir()
    other = await sandbox.create_context("python", cwd="sub")
    assert other.cwd == f"{sandbox.working_dir}/sub" and other.kernel == "python3"
    assert (await sandbox.run_code("print('x' in dir())", context=other)).stdout == "False\n"
    assert (await sandbox.run_code("import os; print(os.getcwd())", context=other.id)).stdout == (
        f"{other.cwd}\n"
    )
    await sandbox.run_code("y = 2", context=other)
    await sandbox.restart_context(other)
    assert (await sandbox.run_code("print('y' in dir())", context=other)).stdout == "False\n"
    assert (await sandbox.run_python("x")).text == "'default'"  # untouched by that restart
    await sandbox.remove_context(other)
    assert [c.id for c in sandbox.list_contexts()] == ["default"]
    with pytest.raises(ContextNotFoundError, match="no context"):
        await sandbox.run_code("1", context=other)
    with pytest.raises(ConfigError, match="default context"):
        await sandbox.remove_context("default")
    with pytest.raises(ConfigError, match="runs python, not 'bash'"):
        await sandbox.run_code("1", "bash", context="default")


async def test_a_language_the_image_lacks_is_refused_naming_what_it_has(
    new_sandbox: NewSandbox,
) -> None:
    sandbox = await new_sandbox()
    with pytest.raises(ConfigError, match=r"no 'r' kernel \(its languages: bash, python\)"):
        await sandbox.run_code("1 + 1", language="r")
    with pytest.raises(ConfigError, match="no kernelspec 'ir'"):
        await sandbox.create_context(kernel="ir")


async def test_contexts_are_bounded(
    new_sandbox: NewSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox = await new_sandbox()
    monkeypatch.setattr("kernel_sandbox.sandbox.MAX_CONTEXTS", 1)
    await sandbox.create_context("bash")
    with pytest.raises(ConfigError, match="MAX_CONTEXTS"):
        await sandbox.create_context("bash")
    assert MAX_CONTEXTS >= 4  # python, r, javascript and bash side by side


async def test_a_bash_sandbox_runs_bash_by_default_and_python_beside_it(
    new_sandbox: NewSandbox,
) -> None:
    sandbox = await new_sandbox(kernel="bash")
    assert (await sandbox.run_code("echo $((6 * 7))")).stdout.strip() == "42"
    assert (await sandbox.run_python("print(6 * 7)")).stdout == "42\n"
    assert [c.language for c in sandbox.list_contexts()] == ["bash", "python"]
    await sandbox.run_code("kept=5")
    ended = asyncio.ensure_future(sandbox.run_code("touch started; sleep 60; echo finished"))
    await await_for(lambda: sandbox.files.exists("started"), 60, 0.05, "the cell to start")
    await sandbox.interrupt()  # the host's SIGINT, relayed to the kernel
    assert "finished" not in (await asyncio.wait_for(ended, 30)).stdout
    assert (await sandbox.run_code("echo $kept")).stdout.strip() == "5"


def test_languages_are_named_as_people_name_them() -> None:
    specs = parse_kernelspecs(
        '{"ir": {"language": "R", "display_name": "R"},'
        ' "deno": {"language": "typescript", "display_name": "Deno"},'
        ' "python3": {"language": "python", "display_name": "Python 3"}}'
    )
    assert kernel_for("R", specs) == "ir"
    assert kernel_for("js", specs) == kernel_for("TypeScript", specs) == "deno"
    assert kernel_for("python", specs) == "python3"
    assert normalise_language(" Python3 ") == "python" and specs["deno"].speaks == "javascript"


async def test_the_code_tool_names_the_languages_and_runs_each(new_sandbox: NewSandbox) -> None:
    sandbox = await new_sandbox()
    tools = ToolSet(sandbox, {"code_executor": {}})
    await sandbox.languages()
    description = tools.schema_map()["code_executor"]["function"]["description"]
    assert "bash, python" in description and "persist" in description
    made = await tools.execute(
        "code_executor", {"code": "n=3; echo $((n * 2))", "language": "bash"}
    )
    assert made.status == "success" and made.output.strip() == "6"
    again = await tools.execute("code_executor", {"code": "echo $n", "language": "bash"})
    assert again.output.strip() == "3"
    python = await tools.execute("code_executor", {"code": "1 + 1"})
    assert python.status == "success" and python.output.strip() == "2"
    missing = await tools.execute("code_executor", {"code": "1", "language": "cobol"})
    assert missing.status == "error" and "no 'cobol' kernel" in (missing.error or "")
