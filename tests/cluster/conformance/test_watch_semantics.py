"""Watch: ordered events from a resourceVersion, the final object on DELETED, 410 for a compacted version,
and no event at all for a refused request."""
import json

import requests

from tests.cluster.conftest import CONFIGMAPS, DEPLOYMENTS, configmap
from tests.cluster.conformance.helpers import deployment


def watch(http, path, **params):
    params = {"watch": "true", "timeoutSeconds": "0.5", **params}
    with requests.get(http.url + path, params=params, stream=True, timeout=10) as r:
        return [json.loads(line) for line in r.iter_lines() if line]


def test_events_replay_in_resource_version_order(http):
    rv = http.ok("get", CONFIGMAPS)["metadata"]["resourceVersion"]
    http.ok("post", CONFIGMAPS, configmap("a"))
    http.ok("patch", CONFIGMAPS + "/a", {"data": {"x": "1"}})
    http.ok("delete", CONFIGMAPS + "/a")
    events = watch(http, CONFIGMAPS, resourceVersion=rv)
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and versions[0] > int(rv) and events[-1]["object"]["data"] == {"x": "1"}


def test_refused_requests_emit_no_events(http):
    http.ok("post", DEPLOYMENTS, deployment())
    rv = http.ok("get", DEPLOYMENTS)["metadata"]["resourceVersion"]
    http.delete(DEPLOYMENTS + "/web/status")
    http.patch(DEPLOYMENTS + "/web", {"spec": {"replicas": "many"}})
    http.patch(DEPLOYMENTS + "/web", {"spec": {"replicas": 3}}, force="true")
    assert watch(http, DEPLOYMENTS, resourceVersion=rv) == []


def test_no_op_writes_emit_no_events(http):
    http.ok("post", CONFIGMAPS, configmap("a", x="1"))
    rv = http.ok("get", CONFIGMAPS)["metadata"]["resourceVersion"]
    http.ok("patch", CONFIGMAPS + "/a", {"data": {"x": "1"}})
    assert watch(http, CONFIGMAPS, resourceVersion=rv) == []


def test_watch_of_one_object_by_name(http):
    http.ok("post", CONFIGMAPS, configmap("a"))
    http.ok("post", CONFIGMAPS, configmap("b"))
    events = watch(http, CONFIGMAPS, fieldSelector="metadata.name=b")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "b")]


def test_invalid_watch_resource_version_is_400(http):
    code, body = http.get(CONFIGMAPS, watch="true", resourceVersion="abc")
    assert code == 400 and body["reason"] == "BadRequest"
