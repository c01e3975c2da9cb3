"""KubernetesHost: one sandbox = one pod, its kernel reached over TCP at the pod's IP.

What a sandbox is made of on a cluster (names ``kernel-sandbox-<id>``, every object
labelled with the sandbox id and owner, see :mod:`.manifests`):

- a **Secret** with the kernel's launch environment, so the HMAC key never appears in the
  pod spec; the pod reads it at start (``envFrom``);
- a **Pod** whose main process is the same supervisor as on Docker
  (:mod:`kernel_sandbox.kernel.supervisor`), keeping its state in the pod's ``/tmp``:
  kernel restarts are in place, crash and OOM reasons come from its reports;
- a **NetworkPolicy** for that pod alone: no egress, ingress to the kernel's ports only
  from the client (needs a CNI that enforces policies).

The Secret and the policy are owned by the pod (``ownerReferences``), so deleting the
pod, from here or from outside, lets the cluster's garbage collector remove them too.
Shell commands and files go through the exec API as the pod's user (uid 1000), read
frame by frame within their caps (:mod:`.exec`).  A whole restart is a new pod: files
are lost then, as the message says.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from ...config import LABEL_PREFIX
from ...errors import (
    ConfigError,
    ContainerRemovedError,
    ImageNotFoundError,
    KernelError,
    SandboxError,
    SandboxStartError,
)
from ...kernel.connection import ConnectionInfo, new_connection_info
from ...kernel.supervisor import (
    GO_PREFIX,
    STATUS_FILE,
    TCP_STATE_DIR,
    KernelEnd,
    parse_status,
    wait_for_kernel_end,
)
from ...limits import K8S_STATUS_READ_BYTES
from ..base import ExecResult, HostState, KernelHost, Leftover, SandboxRecord
from . import cluster, manifests, policy
from .api import ApiException, api_call, kube, removed_error
from .attach import KERNEL_NUMBER_READ, kernel_number, read_sandbox
from .cluster import PodState, default_namespace, pod_state
from .exec import pod_exec
from .lease import LeaseElection

if TYPE_CHECKING:
    from ...config import SandboxConfig

__all__ = ["KubernetesHost"]

log = logging.getLogger(__name__)

#: Seconds between reads of the supervisor's status file while a cell runs (each is an
#: exec, ~40 ms of API server and kubelet work), and between pod status reads.
STATUS_POLL = 0.5
POD_POLL = 2.0
#: Seconds a deleted pod may take to be gone before its removal goes on without it (on a
#: loaded node the kubelet took over 30 s to let a killed pod's object go).
POD_GONE_DEADLINE = 90.0
_STATUS_READ = (
    f'f={TCP_STATE_DIR}/{STATUS_FILE}; test -f "$f" || exit 0; '
    f'exec timeout 2 head -c {K8S_STATUS_READ_BYTES} -- "$f"'
)
#: Waiting reasons of a container whose image cannot be had.
IMAGE_REASONS = {"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName"}

# The kernel is the supervisor's child in its own session (pgid = pid, parent = PID 1).
_SIGNAL_KERNEL = (
    "for d in /proc/[0-9]*; do p=${d#/proc/}; "
    's=$(sed "s/.*) //" "$d/stat" 2>/dev/null) || continue; set -- $s; '
    'if [ "$2" = 1 ] && [ "$3" = "$p" ]; then kill -s "$0" "$p"; exit; fi; done; exit 3'
)


class KubernetesHost(KernelHost):
    """Runs a sandbox's kernel in a pod of a Kubernetes cluster (see the module)."""

    name: ClassVar[str] = "kubernetes"

    def __init__(
        self,
        sandbox_id: str,
        config: SandboxConfig,
        *,
        namespace: str | None = None,
        image_pull_policy: str = "IfNotPresent",
    ) -> None:
        super().__init__(sandbox_id, config)
        self.namespace = namespace or config.namespace or default_namespace()
        self.image_pull_policy = image_pull_policy
        self._kube = kube()
        self._generation = 0
        self._info: ConnectionInfo | None = None
        self._pod_uid = ""
        self._kernel = 1
        self._status_read = 0.0
        self._pod_read = 0.0
        self._gone: str | None = None
        #: False for a guest (``attach(own=False)``): nothing is removed or restarted.
        self._own = True

    @classmethod
    def configure(cls, **options: Any) -> Callable[[str, SandboxConfig], KubernetesHost]:
        """A host factory with options (``namespace=``, ``image_pull_policy=``) for
        ``AsyncSandbox.create(host=KubernetesHost.configure(namespace="x"))``."""

        def factory(sandbox_id: str, config: SandboxConfig) -> KubernetesHost:
            return cls(sandbox_id, config, **options)

        return factory

    # -- names and labels -------------------------------------------------------------

    @property
    def pod_name(self) -> str:
        """The pod that runs the sandbox now (a whole restart makes a new one)."""
        base = manifests.resource_name(self.sandbox_id)
        return base if self._generation <= 1 else f"{base}-r{self._generation}"

    @property
    def labels(self) -> dict[str, str]:
        return manifests.kube_labels({**super().labels, f"{LABEL_PREFIX}.host": self.name})

    # -- lifecycle ----------------------------------------------------------------------

    async def launch(self) -> ConnectionInfo:
        cfg = self.config
        if cfg.volumes:
            raise ConfigError(
                "volumes= binds host directories, which a pod cannot have; copy data in "
                "with sandbox.files, or use the docker host"
            )
        manifests.sandbox_uid(cfg)  # a ConfigError before anything is created
        self._generation += 1
        self._kernel = 1
        self._gone = None
        name, ns, core = self.pod_name, self.namespace, self._kube.core
        info = new_connection_info("tcp", "0.0.0.0", list(manifests.KERNEL_PORTS))
        labels = self.labels
        first_cidr = policy.client_cidr(self._kube, None)
        made_policy = manifests.network_policy_manifest(
            name,
            self.sandbox_id,
            labels,
            cfg,
            client_cidr=first_cidr,
            client_pod_labels=policy.client_pod_labels(),
        )
        await api_call(
            "creating the sandbox's NetworkPolicy",
            self._kube.networking.create_namespaced_network_policy,
            ns,
            made_policy,
        )
        await api_call(
            "creating the sandbox's Secret",
            core.create_namespaced_secret,
            ns,
            manifests.secret_manifest(name, labels, info, cfg),
        )
        pull_policy = self.image_pull_policy if cfg.pull_image else "Never"  # server's --pull never
        pod = manifests.pod_manifest(
            name, labels, info, cfg, image=cfg.image, image_pull_policy=pull_policy
        )
        created = await api_call("creating the sandbox's pod", core.create_namespaced_pod, ns, pod)
        self.resource_id = name
        self.image = cfg.image
        self._pod_uid = created.metadata.uid
        await policy.own_by_pod(self._kube, ns, name, self._pod_uid)
        ip = await self._wait_running(name, cfg.startup_timeout)
        # the address this client reaches the pod from can differ from the one facing
        # the API server (made before the pod had an IP): admit the right one
        cidr = policy.client_cidr(self._kube, ip)
        if cidr is not None and cidr != first_cidr:
            await policy.admit(self._kube, ns, name, cidr)
        self._info = info = dict(info, ip=ip)  # type: ignore[assignment]
        return info

    async def attach(self, record: SandboxRecord, *, own: bool = True) -> ConnectionInfo:
        """Reconnect to a running sandbox pod's kernel, from what only the API tells.

        The connection info (HMAC and CURVE keys, ports) is the sandbox's Secret, the
        address the pod's IP; image, user, working directory, environment and whether
        it may reach out come from the pod and its policy and replace this host's
        config (limits stay the caller's: they apply to a later whole restart, which
        makes a new pod).  An owner takes the policy over (it admits this client alone),
        relabels the pod as its own (so gc does not take it for an orphan) and counts
        kernels on from the supervisor's ``go-`` files, so in-place restarts
        go on; a guest changes nothing and can neither restart nor remove.  Refused
        with :class:`ContainerRemovedError` when the pod is gone, and
        :class:`~kernel_sandbox.errors.ContainerStoppedError` when it does not run.
        """
        if self._info is not None:
            raise KernelError(f"sandbox {self.sandbox_id} was launched already")
        name, ns = record.resource_id, self.namespace
        found = await read_sandbox(self._kube, ns, name, self.sandbox_id, self.config)
        self.config = self.config.model_copy(update=found.config_updates)
        self.image, self.resource_id, self._own = self.config.image, name, own
        self._generation, self._pod_uid, self._gone = found.generation, found.pod_uid, None
        listing = await self.exec(["sh", "-c", KERNEL_NUMBER_READ], max_output_bytes=65536)
        self._kernel = kernel_number(listing.stdout.decode(errors="replace"))
        if own:
            cidr = policy.client_cidr(self._kube, found.info["ip"])
            await asyncio.gather(
                policy.admit(self._kube, ns, name, cidr),
                cluster.relabel_owner(self._kube, ns, name),
            )
        self._info = found.info
        return found.info

    async def detach(self) -> None:
        """Let go of the pod (an attach whose connect failed): nothing is removed."""
        self._own = False
        self._info = None

    def _check_own(self, what: str) -> None:
        if not self._own:
            raise KernelError(f"a guest attached to sandbox {self.sandbox_id} cannot {what}")

    async def _read_pod(self, name: str | None = None) -> Any:
        try:
            return await api_call(
                "reading the sandbox's pod",
                self._kube.core.read_namespaced_pod,
                name or self.pod_name,
                self.namespace,
            )
        except ApiException as exc:
            if exc.status == 404:
                raise removed_error() from exc
            raise

    async def _wait_running(self, name: str, timeout: float) -> str:
        """The pod's IP once its container runs; clear errors for what will not start."""
        deadline = time.monotonic() + timeout
        pending_why = "it was not scheduled"
        while True:
            pod = await self._read_pod(name)
            status = pod.status
            statuses = status.container_statuses or []
            state = statuses[0].state if statuses else None
            if state is not None and state.waiting is not None:
                reason, message = state.waiting.reason or "", state.waiting.message or ""
                if reason in IMAGE_REASONS:
                    raise ImageNotFoundError(
                        f"{reason}: the node cannot get image {self.config.image!r} ({message}). "
                        "Load it into the node's container runtime (`docker save IMAGE | ctr -n "
                        "k8s.io images import -`), push it to a registry the cluster can pull "
                        "from, or set `image=` to one that is there"
                    )
                # other reasons (CreateContainerConfigError: "failed to sync secret cache",
                # ...) may pass: the kubelet retries; the deadline reports the last one
                pending_why = f"its container is waiting ({reason}: {message})"
            if state is not None and state.terminated is not None:
                raise SandboxStartError(
                    f"the sandbox's container ended at start: {_terminated(state.terminated)}"
                    + await self._logs_suffix(name)
                )
            if status.phase in ("Failed", "Succeeded"):
                raise SandboxStartError(
                    f"the sandbox's pod is {status.phase}: {status.reason or ''} "
                    f"{status.message or ''}".rstrip()
                )
            if state is not None and state.running is not None and status.pod_ip:
                return str(status.pod_ip)
            for cond in status.conditions or []:
                if cond.type == "PodScheduled" and cond.status == "False":
                    pending_why = f"it cannot be scheduled: {cond.message or cond.reason}"
            if time.monotonic() > deadline:
                raise SandboxStartError(
                    f"the sandbox's pod {self.namespace}/{name} did not run within {timeout:g}s: "
                    f"{pending_why} (raise startup_timeout, or see `kubectl describe pod`)"
                )
            await asyncio.sleep(0.1)

    async def _logs_suffix(self, name: str) -> str:
        with contextlib.suppress(Exception):
            text = (await self._logs(name, 15)).strip()
            if text:
                return f"\npod log (last lines):\n{text}"
        return ""

    async def poll(self) -> str | None:
        if self._gone is not None:
            return self._gone
        now = time.monotonic()
        if now - self._status_read >= STATUS_POLL:
            self._status_read = now
            end = await self._kernel_end()
            if end is not None:
                return PodState(False, end.exit_code, end.oom_killed).death_reason()
        if now - self._pod_read < POD_POLL:
            return None
        self._pod_read = now
        state = await self.state()
        if state.running:
            return None
        if state.removed or getattr(state, "evicted", False):
            self._gone = state.death_reason()
        return state.death_reason()

    async def _kernel_end(self) -> KernelEnd | None:
        try:
            result = await self.exec(
                ["sh", "-c", _STATUS_READ], max_output_bytes=K8S_STATUS_READ_BYTES
            )
        except SandboxError:  # the pod is gone or stopped: the pod check says so
            return None
        if result.exit_code != 0:
            return None
        return parse_status(result.stdout.decode(errors="replace"), self._kernel)

    async def state(self) -> HostState:
        try:
            pod = await self._read_pod()
        except ContainerRemovedError:
            return PodState(running=False, removed=True)
        return pod_state(pod)

    async def send_signal(self, signum: int) -> None:
        result = await self.exec(["sh", "-c", _SIGNAL_KERNEL, str(int(signum))])
        if result.exit_code != 0:
            raise KernelError("there is no kernel process to signal in the sandbox")

    async def restart_kernel(self, *, kill_all: bool = False) -> ConnectionInfo:
        self._check_own("restart its kernel")
        if self._info is None:
            raise KernelError("the kernel was never started")
        signal_name = "USR2" if kill_all else "USR1"
        try:
            result = await self.exec(["sh", "-c", f"kill -{signal_name} 1"])
        except SandboxError as exc:
            raise KernelError(f"cannot signal the supervisor: {exc}") from exc
        # USR2 makes the supervisor kill every process of the sandbox user, this exec's
        # shell too (exit 137): the supervisor's report below is what tells
        if result.exit_code != 0 and not (kill_all and result.exit_code == 137):
            raise KernelError(
                f"cannot signal the supervisor (exit {result.exit_code}): "
                f"{result.stderr.decode(errors='replace')}"
            )
        await wait_for_kernel_end(self._kernel_end, poll=0.05)
        go = await self.exec(["touch", f"{TCP_STATE_DIR}/{GO_PREFIX}{self._kernel}"])
        if go.exit_code != 0:
            raise KernelError("cannot let the supervisor start the next kernel")
        self._kernel += 1
        self._status_read = 0.0
        return self._info

    async def restart_whole(self) -> ConnectionInfo:
        """A new pod (files are lost) — unless the pod was deleted or evicted from outside:
        then, as on Docker, the sandbox is gone and a new one must be created."""
        self._check_own("restart its pod")
        state = await self.state()
        if state.removed or (isinstance(state, PodState) and state.evicted):
            self._gone = state.death_reason()
            raise ContainerRemovedError(f"the sandbox cannot be used: {self._gone}")
        return await super().restart_whole()

    async def kill(self, restart: bool = False) -> None:
        self._check_own("kill it")
        await self._delete_pod(self.pod_name)

    async def cleanup(self, restart: bool = False) -> None:
        if not self._own:  # a guest leaves: the sandbox is its owner's
            self._info = None
            return
        name = self.resource_id or self.pod_name
        await asyncio.gather(
            self._delete_pod(name),
            self._delete(self._kube.core.delete_namespaced_secret, name),
            self._delete(self._kube.networking.delete_namespaced_network_policy, name),
        )
        self._info = None

    async def _delete_pod(self, name: str) -> None:
        """Delete the pod and wait (at most ``POD_GONE_DEADLINE``) until it is gone: a
        resumed sandbox gets a new pod of the same name, which an old one still
        terminating would stand in for.  Not a forced delete (grace 0): that removes
        the API object at once while the kubelet still runs the old containers, and an
        exec to the new pod's name then reached the old pod's container now and then
        (a resume's FIFO made in the old pod: "No such file" in the new one's kernel);
        with the manifest's 1 s grace the object goes only when its containers have."""
        await self._delete(self._kube.core.delete_namespaced_pod, name)
        end = time.monotonic() + POD_GONE_DEADLINE
        while time.monotonic() < end:
            try:
                await api_call(
                    "reading the pod", self._kube.core.read_namespaced_pod, name, self.namespace
                )
            except ApiException as exc:
                if exc.status == 404:
                    return
                raise
            await asyncio.sleep(0.2)
        log.warning("pod %s was still there %gs after it was deleted", name, POD_GONE_DEADLINE)

    async def _delete(self, fn: Any, name: str, **options: Any) -> None:
        try:
            await api_call("deleting " + name, fn, name, self.namespace, **options)
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def logs(self, tail: int) -> str:
        return await self._logs(self.pod_name, tail)

    async def _logs(self, name: str, tail: int) -> str:
        text = await api_call(
            "reading the pod's log",
            self._kube.core.read_namespaced_pod_log,
            name,
            self.namespace,
            tail_lines=tail,
            limit_bytes=64 * 1024,
        )
        return str(text)

    # -- beside the kernel ----------------------------------------------------------------

    async def exec(
        self,
        argv: list[str],
        *,
        workdir: str | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | None = None,
        max_output_bytes: int | None = None,
        deadline: float | None = None,
    ) -> ExecResult:
        if workdir or env:
            assignments = [f"{k}={v}" for k, v in (env or {}).items()]
            argv = [
                "sh",
                "-c",
                'cd -- "$0" || exit 125; exec env -- "$@"',
                workdir or self.working_dir,
                *assignments,
                *argv,
            ]
        if self.resource_id is None:
            raise KernelError("the sandbox's pod was not created")
        if self._gone is not None:
            raise ContainerRemovedError(f"the sandbox cannot be used: {self._gone}")
        return await pod_exec(
            self._kube,
            self.resource_id,
            self.namespace,
            manifests.CONTAINER_NAME,
            argv,
            stdin=stdin,
            max_output_bytes=max_output_bytes,
            deadline=deadline,
        )

    # -- the cluster as a whole ------------------------------------------------------------

    @classmethod
    async def list_sandboxes(cls, labels: dict[str, str]) -> list[SandboxRecord]:
        return await cluster.list_sandboxes(cls.name, labels)

    @classmethod
    async def gc(cls, *, remove_all: bool = False) -> list[Leftover]:
        """Pods whose owner process (on this machine) is gone, and Secrets and policies
        whose pod is gone; with ``remove_all`` every object kernel_sandbox made here."""
        return await cluster.gc(remove_all=remove_all)

    @classmethod
    async def remove_sandboxes(
        cls, labels: dict[str, str], *, keep: frozenset[str] = frozenset()
    ) -> int:
        return await cluster.remove_labelled(labels, keep, cls.name)

    @classmethod
    def election(cls, name: str, identity: str, duration: int) -> LeaseElection:
        """A ``coordination.k8s.io`` Lease ``name`` in the host's namespace (:mod:`.lease`)."""
        return LeaseElection(name, identity, duration)


def _terminated(term: Any) -> str:
    reason = term.reason or ""
    if reason == "OOMKilled":
        return "it ran out of memory (OOMKilled; raise memory_limit)"
    return f"exit code {term.exit_code} ({reason}) {message_of_term(term)}".rstrip()


def message_of_term(term: Any) -> str:
    """The container's termination message, if it left one."""
    return str(term.message or "")[:500]
