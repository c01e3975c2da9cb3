"""Sandboxes a killed server left behind: found by their server label, removed by policy.

A server killed with SIGKILL cannot remove its sandboxes; they keep running with the
labels ``kernel-sandbox.server=<name>`` and ``kernel-sandbox.server-key-id``.  With
``on_restart="remove"`` (the default) the next server of the same name removes them,
their volumes and run directories; their notebooks (written after every step) stay.
With ``"keep"`` they are left for ``kernel-sandbox ps`` / ``gc``.  With
``"restore"`` each one is started again for its owner (the key id on its label) under
the same sandbox id, in a fresh container whose kernel state is rebuilt by replaying
the recorded notebook; the old container is removed.  What replay cannot bring back is
lost: processes that were running, and files no recorded code wrote.  (Reconnecting to
the old container itself needs a reconnect call in the sandbox layer; see the notes.)
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..backends.base import SandboxRecord
from ..config import LABEL_PREFIX
from ..errors import SandboxError
from ..notebook.cells import META_KEY
from ..notebook.storage import read_notebook
from .tenancy import SERVER_ID_LABEL, SERVER_KEY_LABEL, SERVER_LABEL

if TYPE_CHECKING:
    from .settings import ServerSettings
    from .tenancy import Tenancy

__all__ = ["Restorable", "leftovers", "remove_leftovers", "restorable", "restore_all"]

log = logging.getLogger(__name__)


async def leftovers(name: str) -> list[SandboxRecord]:
    """Containers labelled as this server's (running or not)."""
    from ..backends.docker import DockerEngine

    return await DockerEngine().list({SERVER_LABEL: name})


async def remove_leftovers(name: str) -> int:
    """Remove every container, volume, network and run directory of server ``name``."""
    from ..backends.docker import DockerEngine
    from ..backends.docker.rundirs import runtime_root

    engine = DockerEngine()
    rows = await engine.list({SERVER_LABEL: name})
    volumes = await engine.list_volumes({SERVER_LABEL: name})
    for row in rows:
        try:
            await engine.remove(row.resource_id)
        except Exception as exc:  # one wedged container must not stop the server
            log.warning("could not remove leftover container %s: %s", row.resource_id, exc)
            continue
        run_dir = row.labels.get(f"{LABEL_PREFIX}.run-dir")
        if run_dir and Path(run_dir).parent == runtime_root():
            await asyncio.to_thread(shutil.rmtree, run_dir, True)
    if volumes:
        try:
            await engine.remove_volumes([str(v["name"]) for v in volumes])
        except Exception as exc:
            log.warning("could not remove leftover volumes: %s", exc)
    for network in await engine.list_networks({SERVER_LABEL: name}):
        try:
            await engine.remove_network(str(network["name"]))
        except Exception as exc:
            log.warning("could not remove leftover network %s: %s", network["name"], exc)
    return len(rows)


@dataclass(frozen=True)
class Restorable:
    """A killed server's sandbox that can be started again for its owner."""

    owner: str
    sandbox_id: str
    notebook: Path


async def restorable(settings: ServerSettings) -> list[Restorable]:
    """Leftovers with an owner label and a recorded notebook (pool members have neither)."""
    found = []
    for row in await leftovers(settings.name):
        labels = row.labels
        owner = labels.get(SERVER_KEY_LABEL)
        sid = labels.get(SERVER_ID_LABEL) or labels.get(f"{LABEL_PREFIX}.id")
        if not owner or not sid:
            continue
        path = settings.record_dir / owner / f"{sid}.ipynb"
        if path.is_file():
            found.append(Restorable(owner, sid, path))
    return found


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
