"""One kernel of a sandbox at work: its session, its calls, its restarts.

A sandbox has one of these per context (:mod:`~kernel_sandbox.contexts`): the default
kernel on the sandbox's own host, every other on the host the sandbox's host made for
it.  Each connects its own jupyter_client session, turns raw replies into
:class:`~kernel_sandbox.results.Execution` results (the verdict is
:mod:`~kernel_sandbox.judgement`'s), and restarts its kernel when it died or got stuck,
in place first and as a whole when that fails.  Nothing here knows the language: every
kernel speaks the same protocol.  The sandbox serialises calls and emits the events.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from .backends.base import KernelHost
from .config import SandboxConfig
from .errors import ContainerStoppedError, KernelError, SandboxError, SandboxStartError
from .events import KernelRestarted
from .judgement import judge
from .kernel.client import KernelSession, OutputCallback
from .kernel.connection import ConnectionInfo
from .results import Execution

__all__ = ["RunningKernel"]

log = logging.getLogger(__name__)


class RunningKernel:
    """A kernel on ``host``, connected or being restarted (see the module docstring)."""

    def __init__(
        self, host: KernelHost, config: SandboxConfig, sandbox_id: str, kernel: str
    ) -> None:
        self.host = host
        self.config = config
        self.sandbox_id = sandbox_id
        #: The kernelspec it runs.
        self.kernel = kernel
        self.session: KernelSession | None = None
        self.info: ConnectionInfo | None = None
        #: Restarts done since the sandbox last emitted them.
        self.restarts: list[KernelRestarted] = []

    async def connect(self, info: ConnectionInfo) -> None:
        """Connect to the kernel that starts now; tell the host when the attempt is over."""
        self.info = info
        session = KernelSession(info, self.config.max_output_bytes)
        try:
            await session.connect(self.config.startup_timeout, self.host.poll)
        except KernelError as exc:
            session.close()
            logs = await self._logs_tail()
            raise SandboxStartError(
                f"the kernel {self.kernel!r} in image {self.host.image!r} did not "
                f"start: {exc}{logs}"
            ) from exc
        except BaseException:  # cancelled: an unclosed client hangs zmq when collected
            session.close()
            raise
        else:
            self.session = session
        finally:  # connected or not: a kernel that never came must not leave a way in
            await self.host.post_launch()

    async def _logs_tail(self) -> str:
        try:
            text = (await self.host.logs(tail=15)).strip()
        except Exception:  # the start error is what matters; the log is a bonus
            return ""
        return f"\ncontainer log (last lines):\n{text}" if text else ""

    @property
    def kernel_info(self) -> dict[str, Any]:
        """The content of the kernel's kernel_info_reply at its last start (as the
        kernel sent it: bound what you keep); empty while not connected."""
        return self.session.kernel_info if self.session is not None else {}

    def close(self) -> None:
        """Close the session (the host's kernel is the host's to end)."""
        if self.session is not None:
            self.session.close()
            self.session = None

    async def run(self, code: str, timeout: float, on_output: OutputCallback | None) -> Execution:
        """Run ``code``; never raises for what the code does (see ``AsyncSandbox.run_code``)."""
        started = time.monotonic()
        restarted = ""  # what a restart before this call lost
        if self.session is None:  # an earlier restart failed (e.g. engine down): try again
            outcome = await self.try_restart()
            if self.session is None:
                return Execution("kernel_died", state_lost=True, message=outcome)
            restarted = outcome
        raw = await self.session.execute(
            code,
            timeout=timeout,
            interrupt_grace=self.config.interrupt_grace,
            check_alive=self.host.poll,
            on_output=on_output,
            max_output_bytes=self.config.max_output_bytes,
        )
        execution = judge(raw, timeout, time.monotonic() - started)
        if execution.state_lost:  # stuck or dead: restart it, say how that went
            outcome = await self.try_restart()
            return dataclasses.replace(
                execution,
                message=f"{execution.message}; {outcome}",
                duration=time.monotonic() - started,
            )
        if restarted:
            return dataclasses.replace(
                execution,
                state_lost=True,
                message=f"the kernel had stopped before this call: {restarted}",
            )
        return execution

    async def try_restart(self) -> str:
        """Restart the kernel; return a sentence saying what was lost, or why it failed."""
        try:
            return await self.restart()
        except SandboxError as exc:
            return f"restarting the kernel failed: {exc}"

    async def restart(self, kill_all: bool = False) -> str:
        """Restart the kernel in place, else the whole of what runs it; say what was lost.

        ``kill_all`` ends every process of the sandbox, not only the kernel's.  The
        whole restart is the fallback for a host that stopped (its supervisor was
        killed) or a supervisor that cannot start a new kernel in time.
        """
        self.close()
        started = time.time()
        try:
            await self.connect(await self.host.restart_kernel(kill_all=kill_all))
            message = "the kernel was restarted and all variables were lost"
            self.restarts.append(KernelRestarted(self.sandbox_id, message, False, started))
            return message
        except SandboxError as exc:
            # A stopped container (e.g. gVisor's whole-sandbox OOM kill) needs no more words
            stopped = isinstance(exc.__cause__, ContainerStoppedError)
            why = "its container had stopped" if stopped else str(exc)
        log.warning("sandbox %s: restarting the whole sandbox: %s", self.sandbox_id, why)
        try:
            info = await self.host.restart_whole()
        except Exception as exc:
            raise KernelError(
                f"the kernel could not be restarted in place ({why}), "
                f"nor could the container: {exc}"
            ) from exc
        await self.connect(info)
        message = (
            f"the kernel could not be restarted in place ({why}), so the whole container "
            "was restarted: all variables were lost, and files written in the sandbox may "
            "be lost too"
        )
        self.restarts.append(KernelRestarted(self.sandbox_id, message, True, started))
        return message
