"""How the API server's refusals read to users: the quota cases are not an RBAC problem."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException

from kernel_sandbox.backends.kubernetes import api
from kernel_sandbox.errors import SandboxStartError


async def _refused(message: str) -> str:
    def create(**_: object) -> None:
        exc = ApiException(status=403, reason="Forbidden")
        exc.body = json.dumps({"kind": "Status", "message": message, "code": 403})
        raise exc

    with pytest.raises(SandboxStartError) as caught:
        await api.api_call("creating the pod", create)
    return str(caught.value)


async def test_an_exceeded_quota_names_the_quota_and_what_to_change() -> None:
    text = await _refused(
        'pods "ks-1" is forbidden: exceeded quota: q, requested: limits.memory=1Gi, '
        "used: limits.memory=0, limited: limits.memory=256Mi"
    )
    assert "ResourceQuota refuses creating the pod" in text
    assert "limited: limits.memory=256Mi" in text and "memory_limit" in text
    assert "Role" not in text


async def test_a_quota_not_yet_counted_says_to_retry_not_to_fix_rbac() -> None:
    text = await _refused(
        'pods "ks-1" is forbidden: status unknown for quota: q, resources: limits.memory'
    )
    assert "ResourceQuota refuses creating the pod until the cluster has counted it" in text
    assert "Try again" in text and "Role" not in text


async def test_any_other_refusal_points_at_the_role() -> None:
    text = await _refused('pods is forbidden: User "x" cannot create resource "pods"')
    assert "deploy/kubernetes/rbac.yaml" in text
