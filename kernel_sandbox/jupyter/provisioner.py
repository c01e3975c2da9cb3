"""A jupyter_client kernel provisioner over the ``KernelHost`` interface (backends.base).

jupyter_client's ``KernelManager`` hands the kernel's life to a provisioner: it asks it
to ``launch_kernel`` (and takes the connection info it returns as the truth), ``poll``s
it, signals it (``interrupt_mode: signal``), ``kill``s it and ``cleanup``s after it.
A :class:`~kernel_sandbox.backends.base.KernelHost` was shaped after exactly that
contract, so this provisioner is a thin adapter, not a second launcher: the host that
``AsyncSandbox`` uses makes the container, binds the sockets, supervises the kernel and
removes everything afterwards; the kernelspec's ``argv`` is never run.

Lifecycle, as the ``KernelManager`` drives it::

    start   -> launch_kernel: host.launch(); wait until the kernel answers; post_launch
    interrupt -> send_signal(SIGINT): the kernel process only, as the sandbox user
    restart -> shutdown_request(restart) ... cleanup(restart=True): the manager's links
               to the ipc sockets made again at once, then launch_kernel:
               host.restart_kernel() in place (files kept), else host.restart_whole()
    shutdown -> shutdown_request ... kill/cleanup(restart=False): host.cleanup()

The kernel is ready (it answered on shell and iopub) when ``launch_kernel`` returns, and
the host has taken back what only the start needed (``post_launch``, e.g. sealing the
run directory) before any client of the manager connects.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import tempfile
from typing import Any, cast

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase
from traitlets import Dict, Enum, Unicode

from ..backends.base import KernelHost
from ..backends.factory import make_host
from ..config import SandboxConfig
from ..errors import KernelError, SandboxError, SandboxStartError
from ..kernel.client import KernelSession
from ..kernel.connection import PORT_NAMES
from ..limits import CWD_COPY_DEADLINE, CWD_COPY_MAX_BYTES
from .client_request import KERNEL_ARGS_ENV, kernel_arguments, kernel_env
from .notebook_dir import CWD_MODES, FolderTooLarge, folder_archive, mount_volume

__all__ = ["SandboxProvisioner"]

#: Exit code reported to jupyter_client for a kernel that ended (the host gives reasons,
#: not codes; any integer means "not running").
ENDED = 1


class SandboxProvisioner(KernelProvisionerBase):
    """Runs a Jupyter kernel in a kernel_sandbox sandbox.

    Configured by the kernelspec's ``metadata.kernel_provisioner.config``: ``sandbox``
    holds :class:`~kernel_sandbox.config.SandboxConfig` fields (image, limits,
    network...), ``host`` optionally names the kernel host (default: the config's),
    ``cwd_mode`` what the kernel sees of the notebook's folder
    (:mod:`~kernel_sandbox.jupyter.notebook_dir`).  The client's ``extra_arguments``
    and kernel ``env`` reach the kernel as filtered by
    :mod:`~kernel_sandbox.jupyter.client_request`.
    """

    sandbox = Dict(help="SandboxConfig fields of every kernel this provisioner starts").tag(
        config=True
    )
    host = Unicode("", help="Kernel host entry-point name; empty: SandboxConfig.host").tag(
        config=True
    )

    cwd_mode = Enum(
        CWD_MODES, default_value="copy", help="The notebook's folder: copy, mount or none"
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._host: KernelHost | None = None
        self._wishes: dict[str, Any] = {}  # what the client asked for at the last start
        self._ended: str | None = None  # why the kernel is not running, once known
        self._restarting = False
        self._view: str | None = None  # the manager's links to ipc sockets
        self._linked: dict[str, Any] | None = None  # the connection info they lead to

    # -- what jupyter_client asks -------------------------------------------------------

    @property
    def has_process(self) -> bool:
        """True while a sandbox exists for this kernel (even between restarts)."""
        return self._host is not None

    @property
    def sandbox_config(self) -> SandboxConfig:
        """The validated configuration (a bad kernelspec fails here, with field names)."""
        return SandboxConfig(**self.sandbox)

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Validate the configuration first; nothing runs on this machine's shell."""
        self.sandbox_config  # noqa: B018 (raises ConfigError on a bad kernelspec)
        # The host makes the connection info (transport, sockets, key; CURVE keys of
        # its own with tcp), so the manager's encryption wish and ports do not apply.
        kwargs.pop("transport_encryption", None)
        extra = kwargs.pop("extra_arguments", [])
        cmd = [*self.kernel_spec.argv, *extra]  # never run: for jupyter_client's records
        kwargs = await super().pre_launch(cmd=cmd, **kwargs)
        args, refused = kernel_arguments(extra)
        env, left_out = kernel_env(kwargs.get("env") or {})
        if refused or left_out:
            self.log.warning(
                "the sandboxed kernel does not get these arguments %s nor variables %s "
                "(they steer the sandbox's own plumbing, or are over its bounds)",
                refused,
                left_out,
            )
        self._wishes = {"args": args, "env": env, "cwd": kwargs.get("cwd")}
        return kwargs

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        """Start (or restart) the sandbox's kernel; return its connection info, ready."""
        archive = b""
        restarted = self._host is not None and self._restarting
        if self._host is not None and restarted:
            host = self._host
            try:
                info = await host.restart_kernel()
            except KernelError:  # e.g. its container stopped: restart that (files may go)
                info = await host.restart_whole()
        else:
            config, archive = self._launch_config()
            host = make_host(self.host or None, secrets.token_hex(6), config)
            self._host = host
            try:
                info = await host.launch()
            except BaseException:
                await self._drop_host()
                raise
        self._restarting = False
        self._ended = None
        await self._wait_ready(host, dict(info))
        if archive:
            await self._copy_in(host, archive)
        # jupyter_client's own connection info carries the key as bytes, and compares
        view = {**self._client_view(dict(info)), "key": info["key"].encode()}
        self.connection_info = cast(KernelConnectionInfo, view)
        return self.connection_info

    def _launch_config(self) -> tuple[SandboxConfig, bytes]:
        """The sandbox's configuration with what the client asked for, and the copy of
        the notebook's folder to put in its working directory (empty: none)."""
        config = self.sandbox_config
        env = {**self._wishes.get("env", {}), **config.env_vars}  # the kernelspec's win
        if self._wishes.get("args"):
            env[KERNEL_ARGS_ENV] = json.dumps(self._wishes["args"])
        overrides: dict[str, Any] = {"env_vars": env}
        cwd, archive = self._wishes.get("cwd"), b""
        if cwd and self.cwd_mode == "mount":
            try:
                overrides["volumes"] = {
                    **config.volumes, **mount_volume(cwd, config.working_dir)
                }  # fmt: skip
            except ValueError as exc:
                self.log.warning("the notebook's folder is not mounted: %s", exc)
        elif cwd and self.cwd_mode == "copy":
            share = config.disk_budget().get("working_dir")
            try:
                archive = folder_archive(
                    cwd, max_bytes=min(share or CWD_COPY_MAX_BYTES, CWD_COPY_MAX_BYTES)
                )
            except FolderTooLarge as exc:
                self.log.warning(
                    "the notebook's folder is not copied into the sandbox: %s; the kernel "
                    "starts in an empty folder (kernelspec option --cwd-mode mount or none)",
                    exc,
                )
            except OSError as exc:
                self.log.warning("the notebook's folder is not copied: %s", exc)
        return config.with_overrides(**overrides), archive

    async def _copy_in(self, host: KernelHost, archive: bytes) -> None:
        """Unpack the notebook folder's copy in the working directory, as the sandbox user."""
        argv = ["tar", "-x", "-f", "-", "--no-same-owner", "-C", host.working_dir]
        try:
            done = await host.exec(
                argv, stdin=archive, max_output_bytes=4096, deadline=CWD_COPY_DEADLINE
            )
        except SandboxError as exc:
            self.log.warning("copying the notebook's folder into the sandbox: %s", exc)
            return
        if done.exit_code != 0:
            self.log.warning(
                "copying the notebook's folder into the sandbox: tar exited %s: %s",
                done.exit_code,
                done.stderr.decode(errors="replace").strip(),
            )

    def _client_view(self, info: dict[str, Any]) -> dict[str, Any]:
        """With ipc, the manager's own paths to the kernel's sockets: links to them.

        ``KernelManager`` removes the ipc socket files of its connection info at every
        shutdown *and restart* (``cleanup_ipc_files``); the real ones are bound once per
        container, so removing them would make an in-place restart impossible.  The
        manager gets links in a private host directory instead; they lead into the run
        directory, which the sandbox cannot write once sealed.
        """
        if info.get("transport") != "ipc":
            return info
        if self._view is None:
            self._view = tempfile.mkdtemp(prefix="ks-jupyter-")
        self._linked = info
        self._link()
        return {**info, "ip": os.path.join(self._view, "k")}

    def _link(self) -> None:
        """Make the manager's links to the kernel's ipc sockets (again).

        At a restart the manager removes them (``cleanup_ipc_files``) just before it
        calls ``cleanup(restart=True)``, while its clients' sockets (a server's websocket
        channels) stay open and reconnect by themselves every ``ZMQ_RECONNECT_IVL``.
        The listening sockets outlive the kernel (the supervisor holds them), so a client
        that finds the links connects at once and the next kernel takes that connection
        up as it starts; one that finds no link retries only after the kernel is back,
        and its iopub misses what the kernel publishes first (the first cell's output).
        """
        if self._view is None or self._linked is None:
            return
        info, prefix = self._linked, os.path.join(self._view, "k")
        for name in PORT_NAMES:
            link = f"{prefix}-{info[name]}"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(link)
            os.symlink(f"{info['ip']}-{info[name]}", link)

    async def _wait_ready(self, host: KernelHost, info: dict[str, Any]) -> None:
        """Connect once, as ``AsyncSandbox`` does, so the kernel is up and the host has
        sealed what only its start needed before the manager's clients connect."""
        session = KernelSession(info)  # type: ignore[arg-type]
        try:
            await session.connect(host.config.startup_timeout, host.poll)
        except KernelError as exc:
            logs = ""
            with contextlib.suppress(Exception):
                logs = (await host.logs(tail=15)).strip()
            await self._drop_host()
            raise SandboxStartError(
                f"the sandboxed kernel in image {host.image!r} did not start: {exc}"
                + (f"\ncontainer log (last lines):\n{logs}" if logs else "")
            ) from exc
        finally:
            session.close()
            if self._host is not None:
                await host.post_launch()

    async def poll(self) -> int | None:
        """None while the kernel runs, else an exit code (the reason is logged)."""
        if self._host is None:
            return ENDED
        if self._ended is not None:
            return ENDED
        reason = await self._host.poll()
        if reason is None:
            return None
        self._ended = reason
        self.log.info("sandboxed kernel %s ended: %s", self.kernel_id, reason)
        return ENDED

    async def wait(self) -> int | None:
        """Wait until the kernel is no longer running."""
        while (status := await self.poll()) is None:
            await asyncio.sleep(0.1)
        return status

    async def send_signal(self, signum: int) -> None:
        """Signal the kernel process inside the sandbox (interrupts use SIGINT)."""
        if self._host is None:
            return
        if signum == 0:  # "is it alive?"
            if await self.poll() is not None:
                raise ProcessLookupError("the sandboxed kernel is not running")
            return
        try:
            await self._host.send_signal(signum)
        except KernelError as exc:
            self.log.warning("signalling the sandboxed kernel: %s", exc)

    async def kill(self, restart: bool = False) -> None:
        """Kill the kernel now: only the kernel for a restart, else the whole sandbox."""
        if self._host is None:
            return
        if restart:
            await self.send_signal(signal.SIGKILL)
        else:
            await self._host.kill()

    async def terminate(self, restart: bool = False) -> None:
        """Ask the kernel process to end (SIGTERM)."""
        await self.send_signal(signal.SIGTERM)

    async def cleanup(self, restart: bool = False) -> None:
        """For a restart keep the sandbox (its files) and the manager's links to its
        sockets (:meth:`_link`); else remove everything."""
        if restart:
            self._restarting = True
            self._link()
            return
        await self._drop_host()

    async def shutdown_requested(self, restart: bool = False) -> None:
        """Nothing to do: the kernel answers shutdown_request itself."""

    def get_shutdown_wait_time(self, recommended: float = 5.0) -> float:
        """A sandboxed kernel ends as fast as a local one; keep jupyter_client's wait."""
        return recommended

    def get_stable_start_time(self, recommended: float = 10.0) -> float:
        """The kernel is ready when launch_kernel returns, so the default is plenty."""
        return recommended

    async def get_provisioner_info(self) -> dict[str, Any]:
        """What a server persists: the sandbox's id and resource, besides jupyter_client's."""
        info: dict[str, Any] = await super().get_provisioner_info()
        if self._host is not None:
            info["sandbox_id"] = self._host.sandbox_id
            info["resource_id"] = self._host.resource_id
        return info

    async def _drop_host(self) -> None:
        host, self._host = self._host, None
        self._restarting = False
        view, self._view, self._linked = self._view, None, None
        if view is not None:
            shutil.rmtree(view, ignore_errors=True)
        if host is not None:
            await host.cleanup()
