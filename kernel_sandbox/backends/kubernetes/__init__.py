"""The Kubernetes kernel host: a sandbox per pod (see :mod:`.host`).

``manifests`` (the objects of a sandbox), ``api`` (the client and its errors), ``exec``
(bounded exec over the websocket), ``cluster`` (ps, gc, pod states), ``policy`` (who may
reach a pod, what owns its Secret and policy), ``attach`` (a running pod's connection,
read back from the API), ``host`` (:class:`KubernetesHost`).
"""

from ..._extras import require_extra

with require_extra("kubernetes", "the kubernetes kernel host (host='kubernetes')"):
    from .cluster import PodState, default_namespace
    from .host import KubernetesHost

__all__ = ["KubernetesHost", "PodState", "default_namespace"]
