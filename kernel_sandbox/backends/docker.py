"""The Docker engine backend, on the docker SDK's low-level API.

The low-level API is used on purpose: ``containers.run`` inspects the container again
after starting it, which costs a round trip on every sandbox start.  Every blocking
SDK call runs in a worker thread so the event loop never waits on the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from typing import Any, TypeVar

import docker
import docker.errors
from docker.types import Ulimit

from ..errors import (
    EngineUnavailableError,
    FileOperationError,
    ImageNotFoundError,
    SandboxFileNotFoundError,
    SandboxStartError,
)
from .base import Backend, ContainerSpec, ContainerState, ExecResult

__all__ = ["INTERNAL_NETWORK", "DockerBackend", "docker_client"]

T = TypeVar("T")
#: Network without a route outside, used by the tcp transport when network is off.
INTERNAL_NETWORK = "kernel-sandbox-internal"

ENGINE_HELP = (
    "Cannot reach the Docker engine{where}: {error}. Start it (`sudo systemctl start docker`, "
    "or run `dockerd &` as root), or point DOCKER_HOST at a running engine; a non-root user "
    "also needs to be in the `docker` group."
)


@functools.lru_cache(maxsize=1)
def docker_client() -> docker.DockerClient:
    """One client per process (it holds a connection pool), checked with a ping."""
    where = f" at {os.environ['DOCKER_HOST']}" if os.environ.get("DOCKER_HOST") else ""
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except docker.errors.DockerException as exc:
        docker_client.cache_clear()
        raise EngineUnavailableError(ENGINE_HELP.format(where=where, error=exc)) from exc
    except Exception as exc:  # requests' ConnectionError and friends
        docker_client.cache_clear()
        raise EngineUnavailableError(ENGINE_HELP.format(where=where, error=exc)) from exc
    return client


async def _run(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(fn, *args, **kwargs)


def _sandbox_reason(exc: docker.errors.APIError) -> str:
    """The engine's explanation, without the host paths it names for a link loop.

    A loop of links in the sandbox (``ln -s a b; ln -s b a``) makes the engine answer
    "too many links in /var/lib/docker/overlay2/<layer>/merged/...": the host's storage
    layout, which is none of the sandbox's (or the model's) business.
    """
    explanation = str(exc.explanation or exc)
    if "too many links" in explanation:
        return "too many levels of symbolic links (a link loop?)"
    return explanation


class DockerBackend(Backend):
    """Runs sandbox containers on a local or remote Docker engine."""

    def __init__(self, client: docker.DockerClient | None = None) -> None:
        self._client = client

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = docker_client()
        return self._client

    @property
    def api(self) -> docker.APIClient:
        return self.client.api

    async def start(self, spec: ContainerSpec) -> str:
        return str(await _run(self._start_sync, spec))

    def _start_sync(self, spec: ContainerSpec) -> str:
        api = self.api
        network_mode = "bridge" if spec.network_enabled else "none"
        if spec.internal_network:
            self._ensure_internal_network()
            network_mode = INTERNAL_NETWORK
        host_config = api.create_host_config(
            binds=spec.volumes,
            init=True,
            mem_limit=spec.memory_limit,
            memswap_limit=spec.memory_limit,  # no swap: the limit is the limit
            nano_cpus=int(spec.cpu_limit * 1e9),
            pids_limit=spec.pids_limit,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            network_mode=network_mode,
            port_bindings={p: ("127.0.0.1", h) for p, h in spec.published_ports.items()} or None,
            ulimits=[Ulimit(name="core", soft=0, hard=0)],
        )
        try:
            created = api.create_container(
                spec.image,
                command=spec.command,
                user=spec.user,
                working_dir=spec.working_dir,
                environment=spec.environment,
                labels=spec.labels,
                host_config=host_config,
                name=spec.name,
                ports=list(spec.published_ports) or None,
                detach=True,
            )
        except docker.errors.ImageNotFound as exc:
            raise ImageNotFoundError(
                f"image {spec.image!r} is not on this engine: build it with "
                f"`kernel-sandbox images build` or set `image=` to one that exists"
            ) from exc
        except docker.errors.APIError as exc:
            raise SandboxStartError(f"the engine refused to create the container: {exc}") from exc
        container_id = str(created["Id"])
        try:
            api.start(container_id)
        except docker.errors.APIError as exc:
            self.remove_blocking(container_id)
            raise SandboxStartError(f"the engine could not start the container: {exc}") from exc
        return container_id

    def _ensure_internal_network(self) -> None:
        if not self.api.networks(names=[INTERNAL_NETWORK]):
            try:
                self.api.create_network(
                    INTERNAL_NETWORK, internal=True, labels={"kernel-sandbox": "true"}
                )
            except docker.errors.APIError:  # created concurrently by another sandbox
                if not self.api.networks(names=[INTERNAL_NETWORK]):
                    raise

    async def state(self, container_id: str) -> ContainerState:
        try:
            info = await _run(self.api.inspect_container, container_id)
        except docker.errors.NotFound:
            return ContainerState(running=False, error="the container was removed")
        st = info["State"]
        return ContainerState(
            running=bool(st["Running"]),
            exit_code=None if st["Running"] else int(st["ExitCode"]),
            oom_killed=bool(st.get("OOMKilled")),
            error=str(st.get("Error") or ""),
        )

    async def restart(self, container_id: str) -> None:
        def _restart() -> None:
            with contextlib.suppress(docker.errors.APIError):  # already stopped
                self.api.kill(container_id)
            self.api.wait(container_id, timeout=30)
            self.api.start(container_id)

        await _run(_restart)

    async def remove(self, container_id: str) -> None:
        await _run(self.remove_blocking, container_id)

    def remove_blocking(self, container_id: str) -> None:
        try:
            self.api.remove_container(container_id, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if "already in progress" not in str(exc):
                raise

    async def exec(
        self,
        container_id: str,
        argv: list[str],
        *,
        user: str,
        workdir: str | None = None,
        environment: dict[str, str] | None = None,
    ) -> ExecResult:
        def _exec() -> ExecResult:
            exec_id = self.api.exec_create(
                container_id, argv, user=user, workdir=workdir, environment=environment
            )["Id"]
            out, err = self.api.exec_start(exec_id, demux=True)
            code = self.api.exec_inspect(exec_id)["ExitCode"]
            return ExecResult(int(code if code is not None else -1), out or b"", err or b"")

        try:
            return await _run(_exec)  # type: ignore[no-any-return]
        except docker.errors.APIError as exc:
            raise FileOperationError(f"could not run a process in the sandbox: {exc}") from exc

    async def put_archive(self, container_id: str, directory: str, tar_bytes: bytes) -> None:
        try:
            ok = await _run(self.api.put_archive, container_id, directory, tar_bytes)
        except docker.errors.NotFound as exc:
            raise SandboxFileNotFoundError(
                f"no such directory in the sandbox: {directory}"
            ) from exc
        except docker.errors.APIError as exc:
            raise FileOperationError(
                f"could not write into {directory}: {exc.explanation}"
            ) from exc
        if not ok:
            raise FileOperationError(f"the engine refused to write into {directory}")

    async def get_archive(self, container_id: str, path: str) -> bytes:
        def _get() -> bytes:
            stream, _ = self.api.get_archive(container_id, path)
            return b"".join(stream)

        try:
            return await _run(_get)  # type: ignore[no-any-return]
        except docker.errors.NotFound as exc:
            raise SandboxFileNotFoundError(f"no such file in the sandbox: {path}") from exc
        except docker.errors.APIError as exc:
            raise FileOperationError(f"could not read {path}: {_sandbox_reason(exc)}") from exc

    async def logs(self, container_id: str, tail: int) -> str:
        raw = await _run(self.api.logs, container_id, tail=tail)
        return bytes(raw).decode(errors="replace")

    async def address(self, container_id: str) -> str:
        info = await _run(self.api.inspect_container, container_id)
        for net in info["NetworkSettings"]["Networks"].values():
            if net.get("IPAddress"):
                return str(net["IPAddress"])
        raise SandboxStartError("the container has no IP address; the tcp transport needs one")

    async def list(self, labels: dict[str, str]) -> list[dict[str, object]]:
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        rows = await _run(self.api.containers, all=True, filters=filters)
        return [
            {
                "id": r["Id"],
                "name": (r.get("Names") or ["?"])[0].lstrip("/"),
                "image": r.get("Image"),
                "status": r.get("Status"),
                "state": r.get("State"),
                "labels": r.get("Labels") or {},
                "created": r.get("Created"),
            }
            for r in rows
        ]
