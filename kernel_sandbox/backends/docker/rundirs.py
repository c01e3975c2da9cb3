"""Moved to :mod:`kernel_sandbox.rundirs`: run directories belong to no one engine.

This name is kept only for ``server/restart.py``, which still imports it from here;
import :mod:`kernel_sandbox.rundirs` instead.
"""

from ...rundirs import OWNER_FILE, claim, is_claimed, release, runtime_root

__all__ = ["OWNER_FILE", "claim", "is_claimed", "release", "runtime_root"]
