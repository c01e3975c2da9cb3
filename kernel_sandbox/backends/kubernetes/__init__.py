"""The Kubernetes kernel host: a sandbox per pod (see :mod:`.host`)."""

from .host import KubernetesHost, PodState, default_namespace

__all__ = ["KubernetesHost", "PodState", "default_namespace"]
