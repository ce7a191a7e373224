"""API server faults (the emulator's opt-in /_faults hook): a 5xx or a conflict fails one reconciliation
cleanly (kopf retries the handler), the next one converges, and nothing is created twice."""
from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from specfleet.cluster.apiserver import running_apiserver
from specfleet.operator.reconcile import reconcile
from specfleet.operator.kube import Kube

ROOT = Path(__file__).resolve().parents[2]
SPEC = yaml.safe_load((ROOT / "manifests/examples/smollm2-cpu.yaml").read_text())["spec"]
BODY = {"metadata": {"name": "svc", "namespace": "default", "uid": "u1", "generation": 1}, "spec": SPEC}


@pytest.fixture
def cluster(tmp_path):
    from kubernetes import config

    with running_apiserver(tmp_path / "kubeconfig", faults=True) as server:
        kube = Kube(config.new_client_from_config(str(server.kubeconfig)))
        yield server, kube


def _count(server, kind_plural: str) -> int:
    path = {"deployments": "/apis/apps/v1/namespaces/default/deployments",
            "services": "/api/v1/namespaces/default/services",
            "secrets": "/api/v1/namespaces/default/secrets"}[kind_plural]
    return len(httpx.get(server.url + path).json()["items"])


@pytest.mark.parametrize("status", [500, 503, 409])
def test_a_failed_write_fails_one_reconcile_and_the_retry_converges_without_duplicates(cluster, status):
    server, kube = cluster
    httpx.post(server.url + "/_faults", json={"method": "POST", "path": "/deployments", "status": status})
    with pytest.raises(kube.client.ApiException) as failed:
        reconcile(BODY, kube, "2026-01-01T00:00:00Z")
    assert failed.value.status in (status, 404)          # a 409 for a missing object: the re-read finds none
    outcome = reconcile(BODY, kube, "2026-01-01T00:00:01Z")   # kopf's retry
    assert outcome.status["desiredReplicas"] >= 1
    again = reconcile(BODY, kube, "2026-01-01T00:00:02Z")
    assert not any(reason == "Applied" for _, reason, _ in again.events)   # converged: nothing rewritten
    assert (_count(server, "deployments"), _count(server, "services"), _count(server, "secrets")) == (1, 1, 1)
    assert httpx.get(server.url + "/_faults").json()[0]["fired"] == 1


def test_faults_are_off_unless_asked_for(tmp_path):
    with running_apiserver(tmp_path / "kubeconfig") as server:
        assert httpx.get(server.url + "/_faults").status_code == 404
