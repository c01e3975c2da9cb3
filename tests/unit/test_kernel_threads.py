"""The launcher's kernel: which of ipykernel's threads a call goes through.

The main thread reads and answers the shell socket itself (no shell-channel thread, so
no subshells); ``KERNEL_SANDBOX_IOPUB=thread`` keeps ipykernel's own threads.
"""

from __future__ import annotations

from tests.unit.conftest import NewSandbox

THREADS = "import threading; sorted(t.name for t in threading.enumerate())"
SUBSHELLS = "get_ipython().kernel._supports_kernel_subshells"


async def test_the_main_thread_reads_the_shell_socket(new_sandbox: NewSandbox) -> None:
    sandbox = await new_sandbox()
    assert "Shell channel" not in (await sandbox.run_python(THREADS)).text
    assert (await sandbox.run_python(SUBSHELLS)).text == "False"
    # replies, a failure, output and an interrupt's aftermath all go the same way
    failed = await sandbox.run_python("1 / 0")
    assert failed.error is not None and failed.error.ename == "ZeroDivisionError"
    for n in range(20):
        assert (await sandbox.run_python(f"print({n}); {n} * 2")).text == f"{n}\n{n * 2}"


async def test_ipykernels_own_threads_on_request(new_sandbox: NewSandbox) -> None:
    sandbox = await new_sandbox(env_vars={"KERNEL_SANDBOX_IOPUB": "thread"})
    assert "Shell channel" in (await sandbox.run_python(THREADS)).text
    assert (await sandbox.run_python(SUBSHELLS)).text == "True"
    assert (await sandbox.run_python("print(1 + 1)")).text == "2"
