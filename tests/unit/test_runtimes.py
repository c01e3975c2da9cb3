"""Engine runtimes: runtime= checked against what the engine offers, gVisor's needs named."""

from __future__ import annotations

import json

import pytest

from kernel_sandbox.backends.docker import engine as engine_module
from kernel_sandbox.backends.docker.engine import ContainerSpec
from kernel_sandbox.backends.docker.runtimes import (
    GVISOR_ARGS,
    HOST_TASKS_CEILING,
    daemon_json,
    describe,
    engine_runtimes,
    gvisor_host_pids,
    validate,
)
from kernel_sandbox.config import RUNTIME_ENV, SandboxConfig
from kernel_sandbox.errors import ConfigError

#: The ``Runtimes`` part of ``docker info`` of an engine with gVisor registered as needed.
INFO = {
    "Runtimes": {
        "runc": {"path": "runc"},
        "runsc": {"path": "/usr/bin/runsc", "runtimeArgs": list(GVISOR_ARGS)},
    }
}


def spec(**changes: object) -> ContainerSpec:
    fields: dict[str, object] = {
        "image": "kernel-sandbox:python",
        "command": ["true"],
        "user": "sandbox",
        "working_dir": "/sandbox",
        "environment": {},
        "volumes": {},
        "labels": {},
        "memory_limit": "1g",
        "cpu_limit": 1.0,
        "pids_limit": 256,
        "network_enabled": False,
        "runtime": "runsc",
    }
    return ContainerSpec(**{**fields, **changes})  # type: ignore[arg-type]


def test_the_engine_default_needs_no_check() -> None:
    assert validate({}, spec(runtime=None)) is None


def test_a_registered_gvisor_passes_and_is_known_as_gvisor_under_any_name() -> None:
    runtimes = engine_runtimes(INFO)
    assert validate(runtimes, spec()) == runtimes["runsc"]
    assert runtimes["runsc"].gvisor and not runtimes["runc"].gvisor
    other = engine_runtimes({"Runtimes": {"sandboxed": INFO["Runtimes"]["runsc"]}})
    assert other["sandboxed"].gvisor


def test_a_missing_runtime_names_what_the_engine_has_and_the_lines_to_add() -> None:
    runtimes = engine_runtimes({"Runtimes": {"runc": {"path": "runc"}}})
    with pytest.raises(ConfigError) as caught:
        validate(runtimes, spec())
    message = str(caught.value)
    assert "runtime='runsc'" in message and "it offers: runc" in message
    assert "daemon.json" in message and "kill -HUP" in message
    assert all(arg in message for arg in GVISOR_ARGS)


def test_a_missing_runtime_of_another_kind_is_named_too() -> None:
    with pytest.raises(ConfigError, match=r"'kata'.*it offers: runc, runsc"):
        validate(engine_runtimes(INFO), spec(runtime="kata"))


def test_gvisor_without_the_arguments_sandboxes_need_is_refused() -> None:
    bare = engine_runtimes({"Runtimes": {"runsc": {"path": "runsc"}}})
    with pytest.raises(ConfigError, match="registered without --network=none --host-uds=all"):
        validate(bare, spec())


@pytest.mark.parametrize(
    "changes",
    [{"network_enabled": True}, {"own_network": "ks-net"}, {"published_ports": {5000: 5000}}],
)
def test_a_network_cannot_hold_under_gvisor_and_is_refused(changes: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="network_enabled=True and transport='tcp' cannot hold"):
        validate(engine_runtimes(INFO), spec(**changes))


def test_runc_keeps_its_network() -> None:
    assert validate(engine_runtimes(INFO), spec(runtime="runc", network_enabled=True))


def test_daemon_json_is_valid_json_with_the_arguments() -> None:
    entry = json.loads(daemon_json())
    assert entry["runtimes"]["runsc"]["runtimeArgs"] == list(GVISOR_ARGS)


def test_the_host_backstop_leaves_room_for_the_sentry() -> None:
    # measured plateaus of a Python fork bomb held at the limit by RLIMIT_NPROC for
    # 30-40 s (the ptrace platform's stub threads): the sentry must never meet the limit
    for limit, measured in ((32, 2192), (48, 4720), (64, 8434)):
        assert gvisor_host_pids(limit) >= measured * 1.15
    # and it grows with the square of the limit (40 busy processes took ~2 250)
    assert gvisor_host_pids(64) > 4 * gvisor_host_pids(16) > 4000


def test_the_host_backstop_stops_at_a_ceiling() -> None:
    assert gvisor_host_pids(83) <= HOST_TASKS_CEILING < gvisor_host_pids(83) + 500
    assert gvisor_host_pids(256) == gvisor_host_pids(10_000) == HOST_TASKS_CEILING


def test_the_runtime_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RUNTIME_ENV, raising=False)
    assert SandboxConfig().runtime is None
    monkeypatch.setenv(RUNTIME_ENV, "runsc")
    assert SandboxConfig().runtime == "runsc"
    assert SandboxConfig(runtime="runc").runtime == "runc"


def test_describe_says_which_runtime_is_default_and_whether_gvisor_is_ready() -> None:
    line = describe({**INFO, "DefaultRuntime": "runc"})
    assert line == "engine runtimes: runc (default), runsc (gVisor: runtime='runsc')"
    bare = describe({"Runtimes": {"runsc": {"path": "runsc"}, "runc": {"path": "runc"}}})
    assert "runsc (gVisor, lacks --network=none --host-uds=all --host-fifo=open)" in bare
    assert "docs/how-to/gvisor.md" in describe({"Runtimes": {"runc": {"path": "runc"}}})


class _CountingApi:
    """The one engine call the runtime lookup makes, counted."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.runtimes: dict[str, object] = {"runc": {"path": "runc"}}
        self.asked = 0

    def info(self) -> dict[str, object]:
        self.asked += 1
        return {"Runtimes": dict(self.runtimes)}


class _Client:
    def __init__(self, api: _CountingApi) -> None:
        self.api = api


def test_runtimes_are_asked_once_per_engine_not_per_sandbox(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(engine_module, "_known_runtimes", {})
    api = _CountingApi("http+docker://localhost")
    for _ in range(3):  # a DockerEngine per sandbox
        assert set(engine_module.DockerEngine(_Client(api))._runtimes_sync()) == {"runc"}  # type: ignore[arg-type]
    assert api.asked == 1
    other = _CountingApi("tcp://elsewhere:2376")  # another engine is asked for its own
    engine_module.DockerEngine(_Client(other))._runtimes_sync()  # type: ignore[arg-type]
    assert other.asked == 1
    # A runtime registered since (daemon.json and a reload) is seen on the refresh that a
    # sandbox naming it asks for, and by the sandboxes after it.
    api.runtimes["runsc"] = {"path": "runsc"}
    assert "runsc" in engine_module.DockerEngine(_Client(api))._runtimes_sync(refresh=True)  # type: ignore[arg-type]
    assert "runsc" in engine_module.DockerEngine(_Client(api))._runtimes_sync()  # type: ignore[arg-type]
    assert api.asked == 2
    # ... and once RUNTIMES_TTL is over, the engine is asked again.
    monkeypatch.setattr(engine_module, "RUNTIMES_TTL", 0.0)
    engine_module.DockerEngine(_Client(api))._runtimes_sync()  # type: ignore[arg-type]
    assert api.asked == 3
