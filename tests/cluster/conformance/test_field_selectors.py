"""Field selectors: only the labels kube-apiserver supports for a kind; anything else is 400, never a filter
the real server would refuse."""
import pytest

from tests.cluster.conftest import DEPLOYMENTS
from tests.cluster.conformance.helpers import deployment

PODS = "/api/v1/namespaces/default/pods"
EVENTS = "/api/v1/namespaces/default/events"


@pytest.mark.parametrize("path,label", [(DEPLOYMENTS, "spec.replicas"), (PODS, "spec.containers"),
                                        ("/api/v1/namespaces/default/configmaps", "data.x")])
def test_unsupported_field_labels_are_400(http, path, label):
    code, body = http.get(path, fieldSelector=f"{label}=1")
    assert (code, body["reason"], body["message"]) == (400, "BadRequest", f"field label not supported: {label}")


def test_pods_select_on_node_name(http):
    for name, node in (("a", "n1"), ("b", "n2")):
        http.ok("post", PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                               "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}})
    listed = http.ok("get", PODS, fieldSelector="spec.nodeName=n2")
    assert [p["metadata"]["name"] for p in listed["items"]] == ["b"]


def test_events_select_on_the_involved_object(http):
    for name, target in (("e1", "s1"), ("e2", "s2")):
        http.ok("post", EVENTS, {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name},
                                 "involvedObject": {"kind": "InferenceService", "name": target}})
    listed = http.ok("get", EVENTS, fieldSelector="involvedObject.name=s2,involvedObject.kind=InferenceService")
    assert [e["metadata"]["name"] for e in listed["items"]] == ["e2"]


def test_metadata_name_works_for_every_kind(http):
    http.ok("post", DEPLOYMENTS, deployment("web"))
    http.ok("post", DEPLOYMENTS, deployment("api"))
    assert [d["metadata"]["name"] for d in http.ok("get", DEPLOYMENTS, fieldSelector="metadata.name=api")["items"]] \
        == ["api"]
