"""Sandboxes a killed server left behind: found by their server label, removed by policy.

A server killed with SIGKILL cannot remove its sandboxes; they keep running with the
labels ``kernel-sandbox.server=<name>`` and ``kernel-sandbox.server-key-id``.  With
``on_restart="remove"`` (the default) the next server of the same name removes them,
their volumes and run directories; their notebooks (written after every step) stay.
With ``"keep"`` they are left for ``kernel-sandbox ps`` / ``gc``.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

from ..config import LABEL_PREFIX
from ..sandbox import runtime_root
from .tenancy import SERVER_LABEL

__all__ = ["leftovers", "remove_leftovers"]

log = logging.getLogger(__name__)


async def leftovers(name: str) -> list[dict[str, object]]:
    """Containers labelled as this server's (running or not)."""
    from ..backends.docker import DockerBackend

    return await DockerBackend().list({SERVER_LABEL: name})


async def remove_leftovers(name: str) -> int:
    """Remove every container, volume and run directory of server ``name``; count them."""
    from ..backends.docker import DockerBackend

    backend = DockerBackend()
    rows = await backend.list({SERVER_LABEL: name})
    volumes = await backend.list_volumes({SERVER_LABEL: name})
    for row in rows:
        labels: dict[str, str] = row["labels"]  # type: ignore[assignment]
        try:
            await backend.remove(str(row["id"]))
        except Exception as exc:  # one wedged container must not stop the server
            log.warning("could not remove leftover container %s: %s", row["id"], exc)
            continue
        run_dir = labels.get(f"{LABEL_PREFIX}.run-dir")
        if run_dir and Path(run_dir).parent == runtime_root():
            await asyncio.to_thread(shutil.rmtree, run_dir, True)
    if volumes:
        try:
            await backend.remove_volumes([str(v["name"]) for v in volumes])
        except Exception as exc:
            log.warning("could not remove leftover volumes: %s", exc)
    return len(rows)
