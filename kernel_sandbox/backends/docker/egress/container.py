"""One sandbox's egress, host side and container side: directory, proxy, relay, settings.

:class:`SandboxEgress` is what a kernel host uses: it makes a host directory for the
sandbox (the proxy's socket and the CA bundle; mounted read-only in the container at
:data:`CONTAINER_EGRESS_DIR`), runs the :class:`~.proxy.EgressProxy` on it, and says
what the container needs — the mount, the environment (proxy variables, pip's index
and CA, pip installing into the user site), the start-up wrapper that creates the user
site before the kernel starts (so the kernel's ``sys.path`` has it and a ``%pip
install`` imports in the next cell), and the command that starts the relay.

Packages land in the user site under ``$HOME`` — inside the bounded writable area
($HOME's share of ``disk_limit``, a quarter: 128 MiB at the default 512m), kept across
kernel restarts in place (a restart of the whole container empties the writable area).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ....errors import ConfigError, KernelError, SandboxError
from ....kernel.programs import program
from ....limits import EGRESS_CA_BYTES, EGRESS_PENDING_REFUSALS
from ....network.pipconf import PipSettings, host_pip_settings
from ....network.policy import Decision, EgressPolicy, build_policy
from ....threads import in_thread
from .proxy import EgressLimits, EgressProxy

if TYPE_CHECKING:
    from ...base import KernelHost

__all__ = [
    "CONTAINER_EGRESS_DIR",
    "RELAY_PORT",
    "SandboxEgress",
]

#: Where the sandbox's egress directory is mounted (read-only) in the container.
CONTAINER_EGRESS_DIR = "/run/kernel-sandbox-egress"
#: The relay's port on the container's loopback.
RELAY_PORT = 3128
SOCKET_NAME = "proxy.sock"
CA_NAME = "ca.pem"

log = logging.getLogger(__name__)


@dataclass
class SandboxEgress:
    """The egress of one sandbox: make it with :meth:`start`, end it with :meth:`close`.

    ``host_dir`` must not exist yet; it is created (mode 0755: the sandbox user must
    reach the socket) and removed by :meth:`close`.  Its ``.owner`` claim keeps
    ``kernel-sandbox gc`` away while the sandbox lives.
    """

    network: str | list[str]
    host_dir: Path
    ca_bundle: str | None = None
    limits: EgressLimits | None = None
    name: str = ""

    def __post_init__(self) -> None:
        #: pip's settings (read by :meth:`start`): its index for "packages", its CA
        #: bundle for every policy (an intercepting proxy intercepts every host).
        self.pip = PipSettings()
        self.policy = EgressPolicy("none", ())
        self.proxy: EgressProxy | None = None
        self.refusals: deque[Decision] = deque(maxlen=EGRESS_PENDING_REFUSALS)
        self._claim: int | None = None

    @property
    def _uses_packages(self) -> bool:
        return self.network == "packages" or (
            not isinstance(self.network, str) and "packages" in self.network
        )

    @property
    def _ca_source(self) -> str | None:
        return self.ca_bundle if self.ca_bundle is not None else self.pip.cert

    async def start(self) -> None:
        """Create the directory, copy the CA bundle, listen on the socket."""
        from ....rundirs import claim  # the directory lives beside run dirs

        # `pip config list` runs once per process, never on the event loop
        self.pip = await in_thread(host_pip_settings)
        self.policy = build_policy(self.network, self.pip)
        self.host_dir.mkdir(mode=0o755)
        try:
            os.chmod(self.host_dir, 0o755)
            self._claim = claim(self.host_dir)
            source = self._ca_source
            if source:
                self._copy_ca(Path(source))
            self.proxy = EgressProxy(
                self.policy,
                self.host_dir / SOCKET_NAME,
                limits=self.limits,
                on_refusal=self.refusals.append,
                name=self.name,
            )
            await self.proxy.start()
        except BaseException:
            await self.close()
            raise

    def _copy_ca(self, source: Path) -> None:
        try:
            if source.stat().st_size > EGRESS_CA_BYTES:
                raise ConfigError(f"ca_bundle={str(source)!r} is larger than 16 MiB")
            shutil.copyfile(source, self.host_dir / CA_NAME)
        except OSError as exc:
            raise ConfigError(
                f"ca_bundle={str(source)!r} cannot be read ({exc.strerror}); point ca_bundle "
                "at a PEM file, or fix pip's `cert` setting"
            ) from None
        os.chmod(self.host_dir / CA_NAME, 0o644)

    def mount(self) -> dict[str, dict[str, str]]:
        """The bind mount of the egress directory (read-only: the sandbox plants nothing)."""
        return {str(self.host_dir): {"bind": CONTAINER_EGRESS_DIR, "mode": "ro"}}

    def environment(self) -> dict[str, str]:
        """Proxy, CA and pip settings for the kernel and every process beside it."""
        proxy = f"http://127.0.0.1:{RELAY_PORT}"
        env = {
            "HTTP_PROXY": proxy,
            "HTTPS_PROXY": proxy,
            "http_proxy": proxy,
            "https_proxy": proxy,
            "NO_PROXY": "localhost,127.0.0.1,::1",
            "no_proxy": "localhost,127.0.0.1,::1",
            # pip installs into the user site under $HOME (the bounded writable area)
            "PIP_USER": "1",
            "PIP_NO_CACHE_DIR": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_WARN_SCRIPT_LOCATION": "1",
        }
        if self._uses_packages:
            env["PIP_INDEX_URL"] = self.pip.index_url
            if self.pip.extra_index_urls:
                env["PIP_EXTRA_INDEX_URL"] = " ".join(self.pip.extra_index_urls)
        if self._ca_source:
            ca = f"{CONTAINER_EGRESS_DIR}/{CA_NAME}"
            for key in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "CURL_CA_BUNDLE"):
                env[key] = ca
        return env

    @staticmethod
    def wrap_command(command: list[str], python: str) -> list[str]:
        """``command`` behind a shell that first creates the user site (see module doc)."""
        script = 'mkdir -p "$("$0" -m site --user-site)" 2>/dev/null; exec "$@"'
        return ["/bin/sh", "-c", script, python, *command]

    @staticmethod
    def relay_command(python: str) -> list[str]:
        """Starts the relay (returns once it listens; a no-op if it already does)."""
        return [
            python,
            "-c",
            program("forwarder.py"),
            f"tcp:127.0.0.1:{RELAY_PORT}=unix:{CONTAINER_EGRESS_DIR}/{SOCKET_NAME}",
        ]

    async def start_relay(self, host: KernelHost, python: str, deadline: float) -> None:
        """Start the relay in the sandbox (again after a restart ended it); KernelError
        if it cannot."""
        try:
            result = await host.exec(
                self.relay_command(python), max_output_bytes=4096, deadline=deadline
            )
        except SandboxError as exc:
            raise KernelError(f"the egress relay did not start in the sandbox: {exc}") from exc
        if result.exit_code != 0:
            raise KernelError(
                f"the egress relay did not start in the sandbox (exit {result.exit_code}): "
                + result.stderr.decode(errors="replace")[-500:]
            )

    def take_refusals(self) -> list[Decision]:
        """Refusals since the last call (at most the last 50), for the sandbox's events."""
        taken = list(self.refusals)
        self.refusals.clear()
        return taken

    async def close(self) -> None:
        """Stop the proxy and remove the directory.  Safe twice."""
        from ....rundirs import release

        if self.proxy is not None:
            await self.proxy.close()
            self.proxy = None
        if self._claim is not None:
            release(self._claim)
            self._claim = None
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.host_dir)
