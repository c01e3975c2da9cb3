"""The OpenAI Agents SDK's own sandbox tests on :class:`KernelSandboxClient`, unmodified.

The SDK's sandbox tests are not parametrised over providers: its provider-neutral runner
and session tests are written against ``UnixLocalSandboxClient``.  Its source
distribution (the version installed here, MIT; fetched with pip into a cache, so the
repository holds none of it) is run twice with its own configuration, at once: as it
is (``stock``), and with ``UnixLocalSandboxClient`` replaced by our client
(``ours``: the plugin ``agents_sdk_suite/kernel_sandbox_agents_suite.py``), so each
session those tests make is a real sandbox.

Every test that made a sandbox on ours and passes on stock passes on ours, except those
in :data:`NOT_APPLICABLE`, each with why; every other test (the SDK's unit tests on its
own fakes, which never reach our client) ends on ours as on stock, and no sandbox is
left behind.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import time
from pathlib import Path

import pytest

from tests.integration.suites import containers_left, fetch_sdist, run_suite

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
#: The SDK's files with tests that make sessions on the client under test (a run over
#: all of ``tests/sandbox`` finds no others: the rest are unit tests on fakes).
FILES = [
    "tests/sandbox/test_run_cwd.py",
    "tests/sandbox/test_runtime.py",
    "tests/sandbox/test_unix_local.py",
    "tests/sandbox/test_exposed_ports.py",
    "tests/sandbox/integration_tests",
]

_NAME = "the provider's name is part of the test: "
_HOST = "the workspace is a directory of the host: "
_RT, _UL, _PTY = (
    "test_runtime.py::",
    "test_unix_local.py::",
    "test_unix_local.py::TestUnixLocalPty::",
)
#: Tests whose premise is the local client's own (its name, the host's files, processes
#: and environment) or a feature we do not offer, by ``file::test`` id: why each.
NOT_APPLICABLE: dict[str, str] = {}


def _na(reason: str, *tests: str, params: tuple[str, ...] = ()) -> None:
    for test in tests:
        for name in [f"{test}[{p}]" for p in params] or [test]:
            NOT_APPLICABLE[name] = reason


_na(
    _NAME + "asserts the RunState's backend_id is 'unix_local' (with only that name "
    "changed, the rest passes on ours: a hand check)",
    _RT + "test_runner_persists_workspace_and_tool_choice_state_across_sandbox_resume",
    _RT + "test_runner_restores_all_sandbox_agents_from_run_state_across_handoffs",
)
_na(
    _NAME + "its legacy payload is written with backend_id 'unix_local', which the SDK "
    "refuses for another client (passes on ours with that name changed)",
    _RT + "test_runner_restores_legacy_current_sandbox_payload_after_json_roundtrip",
)
_na(
    _NAME + "ours refuses the host_path grant with a ValueError too, naming "
    "KernelSandboxClient, not UnixLocalSandboxClient as the test's pattern wants",
    _UL + "test_unix_local_rejects_host_path_before_creating_workspace",
)
_na(
    "ours refuses manifest users with the ValueError it wants, but in create(), before a "
    "sandbox is made for a manifest it cannot honour; the test creates first and expects "
    "the refusal from start()",
    _RT + "test_runner_rejects_unix_local_manifest_user_and_group_provisioning",
)
_na(
    _HOST + "the local client moves /workspace to a host temp directory; ours keeps "
    "/workspace, inside the sandbox",
    _RT + "test_unix_local_client_rewrites_default_manifest_root_to_temp_workspace",
)
_na(
    _HOST + "the local client's host unmounts and rmtree on delete, counted or faked failing",
    _RT + "test_unix_local_client_delete_unmounts_workspace_mounts_before_rmtree",
    _RT + "test_unix_local_client_delete_unmounts_nested_mounts_deepest_first",
)
_na(
    _HOST + "the host directory kept when a host unmount fails",
    _RT + "test_unix_local_client_delete_skips_rmtree_when_unmount_fails",
    params=("redacted", "diagnostic"),
)
_na(
    _HOST + "reads the local state's workspace_root_owned (who owns a host directory)",
    _RT + "test_unix_local_client_delete_preserves_caller_owned_workspace_root",
)
_na(
    _HOST + "the escaping symlink is made with os.symlink on the host; ours refuses such a "
    "link made inside the sandbox (test_integrations_openai_agents.py)",
    _RT + "test_wrapped_unix_local_helpers_reject_symlink_escape_paths",
)
_na(
    _HOST + "waits for the workspace to appear on the host",
    _UL + "test_unix_local_start_cancellation_waits_for_workspace_creation",
)
_na(
    _HOST + "files and hard links made and read with the host's os calls",
    _UL + "test_unix_local_snapshot_round_trips_hardlinks",
    params=("False", "True"),
)
_na(
    _HOST + "links planted on the host",
    _UL + "test_unix_local_snapshot_resume_removes_stale_link_without_following_target",
    params=("directory", "file", "missing"),
)
_na(
    _HOST + "a host file that must survive a refused snapshot",
    _UL + "test_unix_local_resume_rejects_invalid_snapshot_before_clearing_workspace",
    params=("hardlink", "external_symlink", "invalid_tar"),
)
_na(
    _HOST + "a host file that must survive a cancelled resume",
    _UL + "test_unix_local_resume_cancellation_waits_for_archive_validation",
)
_na(
    _HOST + "ours refuses the move as it wants (WorkspaceArchiveWriteError), then it reads "
    "the source back from the host",
    _UL + "TestUnixLocalApplyPatchRename::test_move_to_an_existing_directory_keeps_the_source",
)
_na(
    _HOST + "it resumes a UnixLocalSandboxSessionState it builds, and times the host rmtree",
    _UL + "test_client_delete_keeps_workspace_removal_off_the_event_loop",
)
_na(
    "runs the host's interpreter (sys.executable, a path of the host) inside the sandbox",
    "test_run_cwd.py::test_python_skill_uses_absolute_root_from_nested_workdir",
)
_na(
    "which of the host's environment variables reach commands: a sandbox gets none",
    _UL + "test_unix_local_inherits_host_environment_by_default",
    _UL + "test_unix_local_uses_default_allowlist_when_inheritance_is_disabled",
    _UL + "test_unix_local_uses_custom_host_environment_allowlist",
)
_na(
    "the local client's check of its host-environment arguments (no sandbox is made; "
    "ours takes no such arguments)",
    _UL + "test_unix_local_rejects_invalid_host_environment_allowlist_configuration",
)
_na(
    "the local client's macOS sandbox-exec confinement, faked missing",
    _RT + "test_unix_local_exec_rejects_when_confinement_is_unavailable",
)
_na(
    "the host's virtualenv on the host's PATH; asserts the session is a UnixLocalSandboxSession",
    _RT + "test_unix_local_virtual_environment_grants_follow_client_path_inheritance",
    params=("False-False", "False-True", "True-False", "True-True"),
)
_na(
    "wants -2 and -3, Python's return codes for a host child ended by SIGINT/SIGQUIT; a "
    "process in a container reports 130 and 131 (128 + n), as the SDK's Docker client "
    "does too (exec inspect's ExitCode)",
    _PTY + "test_pty_terminal_signals_interrupt_even_if_parent_ignores_signal",
    params=("sigint", "sigquit"),
)
_na(
    "exposed ports: not offered by our client (docs/how-to/openai-agents.md)",
    "test_exposed_ports.py::test_unix_local_resolve_exposed_port_uses_wrapper_and_normalizes_state",
    "test_exposed_ports.py::test_unix_local_resolve_exposed_port_rejects_undeclared_ports",
)
_na(
    "a manifest of every entry type from host sources, with S3/GCS/R2/Azure mounts and git "
    "faked by tools it installs on the host: mounts are not offered by our client, and "
    "the image has no git",
    "integration_tests/test_runner_pause_resume.py::"
    "test_runner_preserves_unix_local_lifecycle_state_across_pause_and_resume",
)


def _junit_name(nodeid: str) -> str:
    """``tests/sandbox/f.py::C::t`` as the JUnit report names it."""
    *path, test = nodeid.split("::")
    return ".".join([path[0].removesuffix(".py").replace("/", "."), *path[1:]]) + f"::{test}"


def _short(nodeid: str) -> str:
    return nodeid.removeprefix("tests/sandbox/")


@pytest.mark.timeout(1500)
def test_the_sdk_sandbox_suite_passes_on_our_client(docker_engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    suite = fetch_sdist(
        "openai-agents", importlib.metadata.version("openai-agents"), "tests/sandbox"
    )
    label = f"{os.getpid()}-{time.monotonic_ns()}"
    report = tmp_path / "ours.json"
    root = HERE.parents[1]
    ours = {
        "PYTHONPATH": f"{HERE / 'agents_sdk_suite'}{os.pathsep}{root}",
        "PYTEST_PLUGINS": "kernel_sandbox_agents_suite",
        "KERNEL_SANDBOX_SUITE_REPORT": str(report),
        "KERNEL_SANDBOX_SUITE_LABEL": label,
        "OPENAI_AGENTS_DISABLE_TRACING": "1",
    }
    started = time.monotonic()
    outcomes = run_suite(
        suite,
        ["--timeout=300", *FILES],
        {"stock": {"OPENAI_AGENTS_DISABLE_TRACING": "1"}, "ours": ours},
        timeout=1300,
    )
    took = time.monotonic() - started
    stock, mine = outcomes["stock"], outcomes["ours"]
    made = json.loads(report.read_text())
    on_ours = {n for n, entry in made.items() if entry["sandboxes"]}
    passed = {n for n in on_ours if made[n]["outcome"] == "passed"}
    expected_fail = {n for n in on_ours if _short(n) in NOT_APPLICABLE}
    summary = (
        f"{len(made)} tests in {took:.0f} s; {len(on_ours)} made sandboxes on our client: "
        f"{len(passed)} passed, {len(expected_fail)} not applicable"
    )
    print(summary)
    assert len(on_ours) >= 50, summary  # the substitution took: these ran on our client
    lost = {
        _short(n): made[n].get("reason", "")[-600:]
        for n in on_ours
        if _junit_name(n) in stock.passed and n not in passed and _short(n) not in NOT_APPLICABLE
    }
    assert lost == {}, summary + "\n" + json.dumps(lost, indent=1)
    stale = sorted(_short(n) for n in passed if _short(n) in NOT_APPLICABLE)
    assert stale == [], f"listed as not applicable, yet passed on ours: {stale}"
    known = {_short(n) for n in made}
    assert set(NOT_APPLICABLE) <= known, sorted(set(NOT_APPLICABLE) - known)
    elsewhere = {  # the SDK's unit tests: untouched by the substitution
        _short(n): (stock.results.get(_junit_name(n)), entry["outcome"])
        for n, entry in made.items()
        if n not in on_ours
        and _short(n) not in NOT_APPLICABLE
        and (stock.results.get(_junit_name(n)) == "passed") != (entry["outcome"] == "passed")
    }
    assert elsewhere == {}, elsewhere
    assert len(mine.passed) >= len(passed)
    assert containers_left(label) == []
