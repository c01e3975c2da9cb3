"""Which of several server processes reaps now, and what no process serves any more.

With several workers or replicas (:mod:`.replicas`) every process runs the reaper loop,
but one pass at a time does the work: the process whose turn it is removes the sandboxes
nobody used for the idle timeout and the *orphans* — sandboxes labelled as this
server's that no process serves (no state file: a replica killed while it was creating
one, or a removal whose engine call failed).  Whose turn it is:

- with ``--replica``, on a host whose engine elects (:meth:`KernelHost.election
  <kernel_sandbox.backends.base.KernelHost.election>`; on Kubernetes the holder of the
  ``coordination.k8s.io`` Lease ``kernel-sandbox-reaper-<server name>``), renewed at
  every pass: when its holder dies, another replica takes it over after one duration,
  so no sandbox is left without a reaper;
- else (``--workers`` on one host, replicas on Docker): the process holding the lock
  file of the shared record directory (:func:`.replicas.reaper_turn`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import time
from collections.abc import AsyncIterator

from ..backends.base import Election, SandboxRecord
from ..backends.factory import host_class
from ..config import SandboxConfig
from ..errors import SandboxError
from . import replicas
from .labels import SERVER_ID_LABEL, SERVER_KEY_LABEL
from .settings import ServerSettings

__all__ = ["LEASE_MIN_SECONDS", "ORPHAN_GRACE", "ReaperElection", "orphans"]

log = logging.getLogger(__name__)

#: Seconds a Lease holding lasts at the least (three reaper passes, else this).
LEASE_MIN_SECONDS = 10
#: Seconds a labelled sandbox without a state file is left alone: a create still under
#: way has none yet (its pod or container is made first).
ORPHAN_GRACE = 300.0


def lease_name(server_name: str) -> str:
    """The reaper Lease's name for a server name (a DNS-1123 name of ≤ 63 characters)."""
    tail = re.sub(r"[^a-z0-9-]+", "-", server_name.lower()).strip("-")[:40] or "server"
    return f"kernel-sandbox-reaper-{tail}"


class ReaperElection:
    """The reaper's turn for one server process (see the module docstring)."""

    def __init__(self, settings: ServerSettings, tick: float) -> None:
        self.settings = settings
        self.lease: Election | None = None
        if settings.replica:
            duration = max(LEASE_MIN_SECONDS, math.ceil(3 * tick))
            host = host_class(SandboxConfig().host)
            self.lease = host.election(lease_name(settings.name), replicas.identity(), duration)

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[bool]:
        """Whether this process reaps now (for the block)."""
        if self.lease is None:
            with replicas.reaper_turn(self.settings.record_dir) as mine:
                yield mine
            return
        try:
            mine = await self.lease.hold()
        except SandboxError as exc:  # the API server away: nobody reaps this pass
            log.warning("could not take the reaper's Lease: %s", exc)
            mine = False
        yield mine

    async def release(self) -> None:
        """This process stops: give up its turn (the Lease, for another replica at once)."""
        if self.lease is not None:
            with contextlib.suppress(SandboxError):
                await self.lease.release()


def orphans(
    settings: ServerSettings, rows: list[SandboxRecord], now: float | None = None
) -> list[SandboxRecord]:
    """Of the server's sandboxes ``rows``, those no process serves: no live state file
    (no owner label: an idle pool member, never handed out), made more than
    :data:`ORPHAN_GRACE` seconds ago."""
    now = time.time() if now is None else now
    found = []
    for row in rows:
        if row.created is None or now - row.created < ORPHAN_GRACE:
            continue
        owner = row.labels.get(SERVER_KEY_LABEL, "")
        sid = row.labels.get(SERVER_ID_LABEL) or row.sandbox_id
        state = replicas.state_path(settings.record_dir, owner, sid)
        if state is None or not replicas.is_live(state):
            found.append(row)
    return found
