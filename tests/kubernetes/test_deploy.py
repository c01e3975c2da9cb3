"""deploy/kubernetes: the manifests apply, and the Role is enough (and no more) for a client
of the kubernetes host — a whole sandbox life runs under the ServiceAccount's token."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.kubernetes.conftest import ROOT
from tests.waiting import await_for

pytestmark = pytest.mark.kubernetes

DEPLOY = ROOT / "deploy" / "kubernetes"
#: kubectl on PATH, else the one the cluster harness unpacked
KUBECTL = shutil.which("kubectl") or os.path.join(
    os.environ.get("K8S_BASE", "/tmp/kernel-sandbox-k8s"), "bin", "kubectl"
)

SANDBOX_LIFE = """
import asyncio
from kernel_sandbox.sandbox import AsyncSandbox
from kernel_sandbox.backends.kubernetes import KubernetesHost
from kernel_sandbox.backends.kubernetes.lease import LeaseElection

async def main():
    sb = await AsyncSandbox.create(host="kubernetes", image="kernel-sandbox:python",
                                   labels={"kernel-sandbox.test": "1"})
    try:
        assert (await sb.run_python("x = 2\\nprint(x * 21)")).stdout == "42\\n"
        assert (await sb.run_shell("id -u")).stdout == "1000\\n"
        await sb.files.write("f.txt", "data")
        assert await sb.files.read_text("f.txt") == "data"
        crash = await sb.run_python("import os; os._exit(3)")
        assert "exited with code 3" in crash.message, crash.message
        await sb.restart()
        assert (await sb.run_python("'x' in dir()")).text == "False"
        assert [r.sandbox_id for r in await KubernetesHost.list_sandboxes({})] == [sb.id]
        assert await KubernetesHost.gc() == []
    finally:
        await sb.close()
    # the server replicas' reaper election: made, renewed, refused to another, released
    one, two = (LeaseElection("kernel-sandbox-reaper-test", who, 30) for who in "ab")
    assert [await one.hold(), await one.hold(), await two.hold()] == [True, True, False]
    await one.release()
    assert await two.hold() and not await one.hold()
    print("life ok")

asyncio.run(main())
"""


def _documents(name: str, namespace: str) -> list[dict]:
    docs = [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects", []):
            subject["namespace"] = namespace
    return docs


async def test_the_role_suffices_for_a_whole_sandbox_life(kube, namespace, tmp_path: Path):
    from kubernetes import utils

    docs = _documents("rbac.yaml", namespace)
    utils.create_from_yaml(kube.client, yaml_objects=docs, namespace=namespace)
    (account,) = [d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"]

    async def token_secret() -> str | None:
        sa = kube.core.read_namespaced_service_account(account, namespace)
        return sa.secrets[0].name if sa.secrets else None

    secret = kube.core.read_namespaced_secret(
        await await_for(token_secret, timeout=60, interval=0.2), namespace
    )
    token = base64.b64decode(secret.data["token"]).decode()
    config = tmp_path / "sa.kubeconfig"
    config.write_text(
        textwrap.dedent(
            f"""\
            apiVersion: v1
            kind: Config
            clusters: [{{name: c, cluster: {{server: "{kube.configuration.host}",
                         certificate-authority: "{kube.configuration.ssl_ca_cert}"}}}}]
            users: [{{name: sa, user: {{token: "{token}"}}}}]
            contexts: [{{name: c, context: {{cluster: c, user: sa, namespace: {namespace}}}}}]
            current-context: c
            """
        )
    )
    env = {**os.environ, "KUBECONFIG": str(config), "PYTHONPATH": str(ROOT)}
    env.pop("KERNEL_SANDBOX_NAMESPACE", None)  # the context's namespace is used
    done = subprocess.run(
        [sys.executable, "-c", SANDBOX_LIFE], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "life ok"
    # and no more than that: the account cannot read Secrets (the other keys) or exec
    # elsewhere, nor touch anything outside its namespace
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            "from kubernetes import client, config; config.load_kube_config(); "
            "api = client.AuthorizationV1Api(); import sys\n"
            "for ns, verb, res in [(sys.argv[1], 'get', 'secrets'), "
            "(sys.argv[1], 'update', 'pods'), ('default', 'create', 'pods'), "
            "(sys.argv[1], 'create', 'roles')]:\n"
            "    attrs = client.V1ResourceAttributes(namespace=ns, verb=verb, resource=res, "
            "group='rbac.authorization.k8s.io' if res == 'roles' else '')\n"
            "    spec = client.V1SelfSubjectAccessReviewSpec(resource_attributes=attrs)\n"
            "    review = client.V1SelfSubjectAccessReview(spec=spec)\n"
            "    print(api.create_self_subject_access_review(review).status.allowed)",
            namespace,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stderr[-2000:]
    assert check.stdout.split() == ["False"] * 4


def test_the_manifests_are_accepted_by_the_api_server(kube) -> None:
    """Server-side dry run of everything in deploy/kubernetes and of the local overlay
    (nothing is created).  The base's PodDisruptionBudget is policy/v1, which a cluster
    before v1.21 (the local one) does not serve: there the overlay's v1beta1 stands in."""
    names = ("namespace.yaml", "rbac.yaml", "shared-volume.yaml", "server.yaml")
    files = [str(DEPLOY / n) for n in names]
    from kubernetes import client

    groups = client.ApisApi(kube.client).get_api_versions().groups
    policy_v1 = "policy/v1" in {v.group_version for g in groups for v in g.versions}
    if policy_v1:
        files.append(str(DEPLOY / "disruption-budget.yaml"))
    kubectl = [KUBECTL, "apply", "--dry-run=server", "-o", "name"]
    ns = subprocess.run([*kubectl, "-f", files[0]], capture_output=True, text=True)
    assert ns.returncode == 0, ns.stderr
    created = subprocess.run(
        [KUBECTL, "create", "-f", files[0], "-o", "name"], capture_output=True, text=True
    )
    try:
        assert created.returncode == 0 or "AlreadyExists" in created.stderr, created.stderr
        rest = subprocess.run(
            [*kubectl, *(a for f in files[1:] for a in ("-f", f))], capture_output=True, text=True
        )
        assert rest.returncode == 0, rest.stderr
        kinds = {line.split("/")[0] for line in rest.stdout.split()}
        assert kinds >= {
            "serviceaccount",
            "role.rbac.authorization.k8s.io",
            "deployment.apps",
            "service",
            "persistentvolumeclaim",
        }
        # both manifest sets as `kubectl apply -k` reads them (the docs' commands)
        for overlay in ("kubernetes", "kubernetes-local")[0 if policy_v1 else 1 :]:
            whole = subprocess.run(
                [*kubectl, "-k", str(DEPLOY.parent / overlay)], capture_output=True, text=True
            )
            assert whole.returncode == 0, f"{overlay}: {whole.stderr}"
            applied = whole.stdout.split()
            assert "deployment.apps/kernel-sandbox-server" in applied, whole.stdout
            assert "poddisruptionbudget.policy/kernel-sandbox-server" in applied, whole.stdout
    finally:
        if created.returncode == 0:
            subprocess.run([KUBECTL, "delete", "-f", files[0], "--wait=false"], check=False)


def test_the_docs_path_to_a_first_sandbox(namespace) -> None:
    """The Python of the docs' Kubernetes page, run as a user would run it."""
    section = (ROOT / "docs" / "how-to" / "kubernetes.md").read_text()
    program = section.split("python - <<'PY'\n")[1].split("PY\n")[0]
    assert "export KERNEL_SANDBOX_HOST=kubernetes" in section
    env = {**os.environ, "KERNEL_SANDBOX_HOST": "kubernetes", "PYTHONPATH": str(ROOT)}
    env["KERNEL_SANDBOX_NAMESPACE"] = namespace
    done = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.split()
    assert lines[:2] == ["42", "1000"] and lines[2].startswith("kernel-sandbox-")
