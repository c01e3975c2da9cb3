"""Container engines behind one async interface (``base.Backend``)."""

from .base import Backend, ContainerSpec, ContainerState, ExecResult

__all__ = ["Backend", "ContainerSpec", "ContainerState", "ExecResult"]
