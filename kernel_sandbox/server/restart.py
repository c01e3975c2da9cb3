"""Sandboxes a killed server left behind: found by their server label, kept by policy.

A server killed with SIGKILL cannot remove its sandboxes; they keep running (on the
server's kernel host: containers on Docker, pods on Kubernetes) with the
labels ``kernel-sandbox.server=<name>`` and ``kernel-sandbox.server-key-id`` (the owner
key's id, never the key).  With ``on_restart="adopt"`` (the default) the next server of
the same name *adopts* each one whose owner it knows: it reconnects to the running
kernel (:meth:`~kernel_sandbox.AsyncSandbox.adopt`: the connection keys come from the
engine, never from labels), so variables, processes and files are all kept; the call
that was running when the server died is interrupted (nobody waits for it); the key
keeps its sandbox under the same id, and the session notebook goes on where it was.
The owner is the key id on the label, or, for a warm pool member handed to a key
(labels are fixed when a container is made, before it had an owner), the key whose
notebook directory holds the sandbox's notebook.  Sandboxes with no owner (idle pool
members) and those that cannot be reached are removed (so are all of them on a host
that cannot reattach to a running sandbox; Docker and Kubernetes both can).  With
``on_restart="remove"`` the next server of the same name removes them all,
their volumes and run directories; their notebooks (written after every step) stay.
With ``"keep"`` they are left for ``kernel-sandbox ps`` / ``gc``.  With
``"restore"`` each one is started again for its owner (the key id on its label) under
the same sandbox id, in a fresh container whose kernel state is rebuilt by replaying
the recorded notebook; the old container is removed.  What replay cannot bring back is
lost: processes that were running, and files no recorded code wrote.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..backends.base import SandboxRecord
from ..backends.factory import host_class
from ..config import LABEL_PREFIX, SandboxConfig
from ..errors import SandboxError
from ..notebook.cells import META_KEY
from ..notebook.storage import read_notebook
from .labels import SERVER_ID_LABEL, SERVER_KEY_LABEL, SERVER_LABEL

if TYPE_CHECKING:
    from .settings import ServerSettings
    from .tenancy import Tenancy

__all__ = [
    "Restorable",
    "adopt_all",
    "find_restorable",
    "leftovers",
    "remove_leftovers",
    "remove_one",
    "restorable",
    "restore_all",
]

log = logging.getLogger(__name__)


def _host() -> str:
    """The kernel host the server makes sandboxes on (``$KERNEL_SANDBOX_HOST``)."""
    return SandboxConfig().host


async def leftovers(name: str) -> list[SandboxRecord]:
    """Sandboxes labelled as this server's (running or not), on the server's host."""
    return await host_class(_host()).list_sandboxes({SERVER_LABEL: name})


async def remove_leftovers(name: str, keep: frozenset[str] = frozenset()) -> int:
    """Remove every sandbox of server ``name`` with what it holds, on the server's host
    (Docker: containers, volumes, networks, run directories; Kubernetes: pods, Secrets,
    policies); count them.  ``keep``: sandbox ids adopted, so left alone."""
    return await host_class(_host()).remove_sandboxes({SERVER_LABEL: name}, keep=keep)


async def remove_one(name: str, container_sandbox_id: str) -> int:
    """Remove one sandbox of server ``name`` (by its container's id label) with what it
    holds, whoever holds it (another worker that made it)."""
    labels = {SERVER_LABEL: name, f"{LABEL_PREFIX}.id": container_sandbox_id}
    return await host_class(_host()).remove_sandboxes(labels)


@dataclass(frozen=True)
class Restorable:
    """A killed server's sandbox that can be started again (or adopted) for its owner."""

    owner: str
    sandbox_id: str
    notebook: Path
    #: The container's own ``kernel-sandbox.id`` (differs from ``sandbox_id`` once restored).
    container_sandbox_id: str = ""
    running: bool = True
    #: Its owner is known from its notebook only: a warm pool member handed to a key.
    pooled: bool = False
    #: The host run directory its labels name (``ipc``), else "".
    run_dir: str = ""


async def restorable(
    settings: ServerSettings, rows: list[SandboxRecord] | None = None
) -> list[Restorable]:
    """Leftovers with an owner and a recorded notebook (idle pool members have neither).

    The owner is the key id on the label or, for a pool member, the one key directory
    of ``record_dir`` that holds its notebook.  ``rows``: the server's sandboxes, when
    the caller listed them already.
    """
    found = []
    for row in await leftovers(settings.name) if rows is None else rows:
        labels = row.labels
        own_id = labels.get(f"{LABEL_PREFIX}.id", "")
        sid = labels.get(SERVER_ID_LABEL) or own_id
        if not sid:
            continue
        owner = labels.get(SERVER_KEY_LABEL)
        pooled = owner is None
        if owner is None:
            owners = [p.parent.name for p in settings.record_dir.glob(f"*/{sid}.ipynb")]
            if len(owners) != 1:
                continue
            owner = owners[0]
        path = settings.record_dir / owner / f"{sid}.ipynb"
        if path.is_file():
            running = row.running
            run_dir = labels.get(f"{LABEL_PREFIX}.run-dir", "")
            found.append(Restorable(owner, sid, path, own_id, running, pooled, run_dir))
    return found


async def find_restorable(
    settings: ServerSettings, owner: str, sandbox_id: str
) -> Restorable | None:
    """``owner``'s running sandbox ``sandbox_id`` of this server, from the engine's labels
    and its notebook (for a worker asked for a sandbox another worker made); None when
    there is none (another key's is none too)."""
    rows = [
        row
        for row in await leftovers(settings.name)
        if sandbox_id in (row.labels.get(SERVER_ID_LABEL), row.labels.get(f"{LABEL_PREFIX}.id"))
    ]
    for item in await restorable(settings, rows):
        if item.sandbox_id == sandbox_id and item.owner == owner and item.running:
            return item
    return None


async def adopt_all(tenancy: Tenancy, found: list[Restorable]) -> frozenset[str]:
    """Adopt each running sandbox for its owner; the ids of those adopted (failures are
    logged, and their sandboxes are removed by the caller)."""
    adopted = set()
    for item in found:
        if not item.running:
            continue
        try:
            await tenancy.adopt(item)
        except (SandboxError, OSError, ValueError) as exc:
            log.warning("could not adopt sandbox %s: %s", item.sandbox_id, exc)
        else:
            adopted.add(item.container_sandbox_id)
    return frozenset(adopted)


async def restore_all(tenancy: Tenancy, found: list[Restorable]) -> None:
    """Start each sandbox again and replay its notebook into it; failures are logged."""
    for item in found:
        try:
            await _restore(tenancy, item)
        except (SandboxError, OSError, ValueError) as exc:
            log.warning("could not restore sandbox %s: %s", item.sandbox_id, exc)


async def _restore(tenancy: Tenancy, item: Restorable) -> None:
    from ..notebook.replay import areplay
    from .policy import client_config

    old = await asyncio.to_thread(read_notebook, item.notebook)
    saved: dict[str, Any] = dict(old.metadata.get(META_KEY, {}).get("server_sandbox") or {})
    raw = {**saved.get("config", {}), "tools_config": saved.get("tools_config")}
    config, notes = client_config(raw, tenancy.settings, item.owner)
    kept = item.notebook.with_name(f"{item.sandbox_id}.before-restart-{int(time.time())}.ipynb")
    await asyncio.to_thread(item.notebook.replace, kept)
    lease = await tenancy.create(
        item.owner,
        config,
        str(saved.get("kind", "docker")),
        [*notes, f"restored after a server restart by replaying {kept.name}"],
        sandbox_id=item.sandbox_id,
    )
    report = await areplay(old, sandbox=lease.sandbox)
    log.warning("restored sandbox %s for key %s: %s", item.sandbox_id, item.owner, report.summary)
