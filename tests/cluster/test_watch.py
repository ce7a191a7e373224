"""List and watch: selectors, bookmarks, 410 Gone, selector transitions (the ordered replay from a resourceVersion
is conformance/test_watch_semantics.py's)."""
import json

import requests

from tests.cluster.conftest import CONFIGMAPS, configmap


def watch(http, path, **params):
    """Collect the events of a watch that times out after `timeoutSeconds` (default 1s)."""
    params = {"watch": "true", "timeoutSeconds": "1", **params}
    with requests.get(http.url + path, params=params, stream=True, timeout=10) as r:
        return [json.loads(line) for line in r.iter_lines() if line]


def test_list_with_label_and_field_selectors(http):
    http.ok("post", CONFIGMAPS, configmap("a", {"app": "x", "tier": "web"}))
    http.ok("post", CONFIGMAPS, configmap("b", {"app": "y"}))
    http.ok("post", CONFIGMAPS, configmap("c"))
    names = lambda **q: [o["metadata"]["name"] for o in http.ok("get", CONFIGMAPS, **q)["items"]]
    assert names(labelSelector="app=x") == ["a"]
    assert names(labelSelector="app in (x,y),tier!=web") == ["b"]
    assert names(labelSelector="!app") == ["c"]
    assert names(labelSelector="app") == ["a", "b"]
    assert names(fieldSelector="metadata.name=b") == ["b"]
    assert names(fieldSelector="metadata.name!=b,metadata.namespace=default") == ["a", "c"]


def test_watch_without_version_starts_with_the_current_state(http):
    http.ok("post", CONFIGMAPS, configmap("a"))
    events = watch(http, CONFIGMAPS)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "a")]


def test_watch_streams_live_events_and_bookmarks(http, api):
    import threading
    rv = http.ok("get", CONFIGMAPS)["metadata"]["resourceVersion"]
    timer = threading.Timer(0.4, lambda: http.ok("post", CONFIGMAPS, configmap("live")))
    timer.start()
    events = watch(http, CONFIGMAPS, resourceVersion=rv, allowWatchBookmarks="true", timeoutSeconds="1.2")
    types = [e["type"] for e in events]
    assert "ADDED" in types and "BOOKMARK" in types
    bookmark = next(e for e in events if e["type"] == "BOOKMARK")
    assert bookmark["object"]["kind"] == "ConfigMap" and int(bookmark["object"]["metadata"]["resourceVersion"])


def test_watch_with_label_selector_sees_transitions(http):
    http.ok("post", CONFIGMAPS, configmap("a", {"app": "x"}))
    rv = http.ok("get", CONFIGMAPS)["metadata"]["resourceVersion"]
    http.ok("patch", CONFIGMAPS + "/a", {"metadata": {"labels": {"app": "y"}}})
    http.ok("patch", CONFIGMAPS + "/a", {"metadata": {"labels": {"app": "x"}}})
    http.ok("post", CONFIGMAPS, configmap("b", {"app": "y"}))
    events = watch(http, CONFIGMAPS, resourceVersion=rv, labelSelector="app=x")
    assert [e["type"] for e in events] == ["DELETED", "ADDED"]


def test_watch_too_old_resource_version_is_410_gone(http, api):
    for i in range(api.store.history_size + 10):
        api.store.put("/configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                      "metadata": {"name": f"c{i}", "namespace": "default", "uid": str(i)}})
    events = watch(http, CONFIGMAPS, resourceVersion="2")
    assert events[0]["type"] == "ERROR" and events[0]["object"]["code"] == 410
    assert events[0]["object"]["reason"] == "Expired"
    code, _ = http.get(CONFIGMAPS, resourceVersion="2", resourceVersionMatch="Exact")
    assert code == 410


def test_send_initial_events_ends_with_a_marked_bookmark(http):
    http.ok("post", CONFIGMAPS, configmap("a"))
    events = watch(http, CONFIGMAPS, sendInitialEvents="true", allowWatchBookmarks="true",
                   resourceVersionMatch="NotOlderThan", timeoutSeconds="0.2")
    assert events[0]["type"] == "ADDED" and events[1]["type"] == "BOOKMARK"
    assert events[1]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true"


def test_watch_field_selector_on_a_name(http):
    http.ok("post", CONFIGMAPS, configmap("a"))
    http.ok("post", CONFIGMAPS, configmap("b"))
    events = watch(http, CONFIGMAPS, fieldSelector="metadata.name=b", timeoutSeconds="0.3")
    assert [e["object"]["metadata"]["name"] for e in events] == ["b"]
