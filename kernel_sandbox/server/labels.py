"""The labels a server puts on its sandboxes (the engine keeps them across a restart).

Their own module because both the tenancy (which sets them) and the restart logic
(which reads them back after a crash) need them, and neither imports the other.
"""

from __future__ import annotations

from ..config import LABEL_PREFIX

__all__ = ["SERVER_ID_LABEL", "SERVER_KEY_LABEL", "SERVER_LABEL"]

#: The server's name: which server a sandbox belongs to.
SERVER_LABEL = f"{LABEL_PREFIX}.server"
#: The owner key's id (a hash, never the key).
SERVER_KEY_LABEL = f"{LABEL_PREFIX}.server-key-id"
#: The server's id of a restored sandbox (its container has a new ``kernel-sandbox.id``).
SERVER_ID_LABEL = f"{LABEL_PREFIX}.server-sandbox-id"
