"""One holder at a time among processes of a cluster: a ``coordination.k8s.io`` Lease.

Kubernetes' own primitive for leader election (what the controller-manager and the
scheduler use), spoken as client-go's ``leaderelection`` speaks it: the Lease names its
holder (``holderIdentity``) and how long a holding lasts (``leaseDurationSeconds``); the
holder renews it (``renewTime``) before that runs out; a candidate takes it over only
once it has seen the Lease unchanged for a whole duration by its *own* clock (so clocks
that disagree between nodes cannot make two holders), and every write carries the
``resourceVersion`` it read, so of two candidates writing at once the API server keeps
one (the other gets a conflict and is not the holder).  A holder that stops gracefully
releases the Lease (holder emptied), so the next candidate need not wait.

The official client's ``kubernetes.leaderelection`` runs a blocking loop in a thread of
its own with callbacks; the server asks "is it mine now?" once per reaper pass instead,
so this is that one question, on the host's API client (:func:`.api.kube`).
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s

from .api import ApiException, api_call, kube
from .cluster import default_namespace

__all__ = ["LeaseElection"]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass
class _Seen:
    """The Lease as last read, and when (by this process's monotonic clock) it changed."""

    version: str
    holder: str
    since: float


class LeaseElection:
    """Who holds the Lease ``name`` (in ``namespace``, default the host's) now.

    ``identity`` names this process uniquely; ``duration`` is how long one renewal
    lasts: call :meth:`hold` more often than that to keep it.
    """

    def __init__(
        self, name: str, identity: str, duration: int, namespace: str | None = None
    ) -> None:
        self.name, self.identity, self.duration = name, identity, int(duration)
        self.namespace = namespace or default_namespace()
        self._seen: _Seen | None = None

    async def hold(self) -> bool:
        """Take or renew the Lease; whether this process holds it now."""
        api = kube().coordination
        try:
            lease = await self._read(api)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return await self._create(api)
        spec = lease.spec or k8s.V1LeaseSpec()
        holder = spec.holder_identity or ""
        version = lease.metadata.resource_version
        if self._seen is None or self._seen.version != version:
            self._seen = _Seen(version, holder, time.monotonic())
        duration = spec.lease_duration_seconds or self.duration
        held = holder and holder != self.identity
        if held and time.monotonic() - self._seen.since < duration:
            return False  # another's, and renewed within a duration as far as we saw
        now = _now()
        if holder != self.identity:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        spec.holder_identity, spec.renew_time = self.identity, now
        spec.lease_duration_seconds = self.duration
        lease.spec = spec
        return await self._write(api, lease)

    async def release(self) -> None:
        """Give the Lease up if this process holds it (a graceful stop): the next
        candidate takes it at its next try rather than after a duration."""
        api = kube().coordination
        try:
            lease = await self._read(api)
        except ApiException:
            return
        if lease.spec is None or lease.spec.holder_identity != self.identity:
            return
        lease.spec.holder_identity = None
        lease.spec.lease_duration_seconds = 1
        await self._write(api, lease)

    async def _read(self, api: k8s.CoordinationV1Api) -> Any:
        """The Lease (the client's model: typed Any, as :func:`.api.api_call` says)."""
        return await api_call(
            "reading the Lease " + self.name, api.read_namespaced_lease, self.name, self.namespace
        )

    async def _create(self, api: k8s.CoordinationV1Api) -> bool:
        now = _now()
        body = k8s.V1Lease(
            metadata=k8s.V1ObjectMeta(
                name=self.name, labels={"app.kubernetes.io/part-of": "kernel-sandbox"}
            ),
            spec=k8s.V1LeaseSpec(
                holder_identity=self.identity,
                lease_duration_seconds=self.duration,
                acquire_time=now,
                renew_time=now,
                lease_transitions=0,
            ),
        )
        try:
            await api_call(
                "creating the Lease " + self.name,
                api.create_namespaced_lease,
                self.namespace,
                body,
            )
        except ApiException as exc:
            if exc.status == 409:  # another candidate made it first
                return False
            raise
        return True

    async def _write(self, api: k8s.CoordinationV1Api, lease: k8s.V1Lease) -> bool:
        try:
            await api_call(
                "renewing the Lease " + self.name,
                api.replace_namespaced_lease,
                self.name,
                self.namespace,
                lease,
            )
        except ApiException as exc:
            if exc.status in (404, 409):  # another candidate wrote first, or it went
                self._seen = None
                return False
            raise
        return True
