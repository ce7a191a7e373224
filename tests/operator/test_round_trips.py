"""What one reconcile asks of the API server (the emulator, over HTTP): a new service is one read and one
create per object; a settled one is one read per object and no write; a service whose Deployment alone
is gone gets it back without a second admin token, and a drifted object found by a create's 409 is
corrected."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from specfleet.cluster.apiserver import running_apiserver
from specfleet.operator import api
from specfleet.operator.kube import Kube
from specfleet.operator.reconcile import ReconcileOutcome, reconcile

from tests.operator.operator_kit import Cluster, wait_for

ROOT = Path(__file__).resolve().parents[2]
SPEC = yaml.safe_load((ROOT / "manifests/examples/smollm2-cpu.yaml").read_text())["spec"]
OWNED = ["Deployment", "Service", "PodDisruptionBudget", "Secret", "NetworkPolicy"]
NOW = "2026-01-01T00:00:00Z"


@pytest.fixture
def server(tmp_path):
    with running_apiserver(tmp_path / "kubeconfig") as server:
        yield server


@pytest.fixture
def kube(server):
    from kubernetes import config

    return Kube(config.new_client_from_config(str(server.kubeconfig)))


@pytest.fixture
def body(server) -> dict:
    """The InferenceService, stored: its uid owns what the reconcile makes (the garbage collector deletes
    objects whose owner is gone, as a real server's does)."""
    cluster = Cluster(Path(server.kubeconfig))
    cluster.kubectl("apply", "-f", str(ROOT / "crds/inferenceservice.yaml"))
    wait_for(lambda: cluster.kubectl("get", "infsvc", check=False).returncode == 0)
    manifest = {"apiVersion": f"{api.GROUP}/{api.VERSION}", "kind": "InferenceService",
                "metadata": {"name": "svc", "namespace": "default"}, "spec": SPEC}
    return cluster.custom.create_namespaced_custom_object(api.GROUP, api.VERSION, "default", api.PLURAL, manifest)


@pytest.fixture
def calls(kube):
    """Every (method, path) the Kube sends, in order."""
    rest = kube.apps.api_client.rest_client
    sent, request = [], rest.request

    def recording(method, url, *args, **kwargs):
        sent.append((method, url.split("/namespaces/")[-1]))
        return request(method, url, *args, **kwargs)

    rest.request = recording
    return sent


def _owned(kube: Kube) -> dict[str, dict]:
    return {kind: kube.get(kind, "default", "svc-admin" if kind == "Secret" else "svc") for kind in OWNED}


def test_a_new_service_is_one_read_and_one_create_per_object(kube, calls, body):
    reconcile(body, kube, NOW)
    assert [m for m, _ in calls] == ["GET"] + ["POST"] * len(OWNED), calls
    assert all(_owned(kube).values())


def test_a_settled_service_is_read_and_not_written(kube, calls, body):
    reconcile(body, kube, NOW)
    calls.clear()
    outcome = reconcile(body, kube, NOW)
    assert [m for m, _ in calls] == ["GET"] * len(OWNED), calls        # the Deployment's read serves its compare
    assert not any(r == "Applied" for _, r, _ in outcome.events)


def test_a_lost_deployment_comes_back_and_the_rest_is_kept_or_corrected(kube, calls, body):
    reconcile(body, kube, NOW)
    before = _owned(kube)
    kube.verbs["Deployment"].delete("svc", "default")
    kube.verbs["Service"].patch("svc", "default", {"spec": {"ports": [{"name": "http", "port": 1, "targetPort": 1}]}},
                                _content_type="application/merge-patch+json")
    calls.clear()
    outcome = reconcile(body, kube, NOW)
    after = _owned(kube)
    assert after["Secret"]["data"] == before["Secret"]["data"]                  # the token was not made twice
    assert after["Service"]["spec"]["ports"] == before["Service"]["spec"]["ports"]   # the 409 read, then patched
    assert after["Deployment"]["metadata"]["uid"] != before["Deployment"]["metadata"]["uid"]
    assert ("PATCH", "default/services/svc") in calls
    assert any(r == "Applied" and "created Deployment" in m and "updated Service" in m for _, r, m in outcome.events)


def test_two_writers_of_status_from_one_version_keep_each_others_conditions_and_decisions(kube, body, calls):
    """A reconcile and a control step each write status from the body they last saw. The second, made
    from the version before the first's write, is refused (409) and made again on the current status."""
    from specfleet.operator import handlers, status
    from specfleet.operator.api import Condition
    from specfleet.operator.control.runner import ControlOutcome

    handlers.publish(kube, body, reconcile(body, kube, NOW))
    seen = kube.get_service("default", "svc")                    # what both writers read
    old, generation = seen["status"], seen["metadata"]["generation"]
    degraded = ReconcileOutcome({"conditions": status.merge_conditions(
        old["conditions"], [Condition("Degraded", "True", "ModelUnavailable", "from the reconcile")], NOW, generation)})
    decision = {"time": NOW, "kind": "scale", "from": "1", "to": "2", "reason": "Load"}
    step = ControlOutcome({"desiredReplicas": 2, "lastDecisions": [decision], "conditions": status.merge_conditions(
        old["conditions"], [Condition("SLOMet", "True", "Observed", "from the control step")], NOW, generation)}, [])
    handlers.publish(kube, seen, degraded)
    calls.clear()
    handlers.publish(kube, seen, step)                           # made from the version before the reconcile's
    sent = [method for method, _ in calls if method != "POST"]
    now = kube.get_service("default", "svc")["status"]
    kinds = {c["type"]: c["reason"] for c in now["conditions"]}
    assert kinds["Degraded"] == "ModelUnavailable" and kinds["SLOMet"] == "Observed"
    assert now["lastDecisions"] == [decision] and now["desiredReplicas"] == 2
    assert sent == ["PATCH", "GET", "PATCH"]                     # refused, read, written
