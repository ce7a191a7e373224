"""limit/continue: every page is cut from the snapshot of the first page, as etcd serves it."""
import base64
import json

from tests.cluster.conftest import CONFIGMAPS, configmap


def names(listed):
    return [o["metadata"]["name"] for o in listed["items"]]


def seed(http, count=5):
    for i in range(count):
        http.ok("post", CONFIGMAPS, configmap(f"c{i}"))


def test_pages_do_not_show_objects_created_after_the_first_page(http):
    seed(http)
    first = http.ok("get", CONFIGMAPS, limit="2")
    http.ok("post", CONFIGMAPS, configmap("c9"))
    second = http.ok("get", CONFIGMAPS, limit="10", **{"continue": first["metadata"]["continue"]})
    assert names(first) + names(second) == ["c0", "c1", "c2", "c3", "c4"]


def test_pages_still_show_objects_deleted_after_the_first_page(http):
    seed(http)
    first = http.ok("get", CONFIGMAPS, limit="2")
    http.ok("delete", CONFIGMAPS + "/c3")
    second = http.ok("get", CONFIGMAPS, limit="10", **{"continue": first["metadata"]["continue"]})
    assert names(second) == ["c2", "c3", "c4"]


def test_every_page_carries_the_first_page_resource_version(http):
    seed(http)
    first = http.ok("get", CONFIGMAPS, limit="2")
    http.ok("patch", CONFIGMAPS + "/c4", {"data": {"x": "1"}})
    second = http.ok("get", CONFIGMAPS, limit="2", **{"continue": first["metadata"]["continue"]})
    third = http.ok("get", CONFIGMAPS, limit="2", **{"continue": second["metadata"]["continue"]})
    assert {p["metadata"]["resourceVersion"] for p in (first, second, third)} == {first["metadata"]["resourceVersion"]}
    assert third["items"][0]["data"] == {} and "continue" not in third["metadata"]


def test_remaining_item_count_counts_the_rest_of_the_snapshot(http):
    seed(http)
    first = http.ok("get", CONFIGMAPS, limit="2")
    assert first["metadata"]["remainingItemCount"] == 3


def test_selectors_apply_to_every_page(http):
    for i in range(4):
        http.ok("post", CONFIGMAPS, configmap(f"c{i}", labels={"odd": str(i % 2)}))
    first = http.ok("get", CONFIGMAPS, limit="1", labelSelector="odd=1")
    second = http.ok("get", CONFIGMAPS, limit="5", labelSelector="odd=1", **{"continue": first["metadata"]["continue"]})
    assert names(first) + names(second) == ["c1", "c3"]


def test_a_continue_token_older_than_the_snapshots_is_410_expired(http, api):
    seed(http)
    first = http.ok("get", CONFIGMAPS, limit="2")
    api.store.snapshots.clear()                  # what compaction does to the revision a token points at
    code, body = http.get(CONFIGMAPS, limit="2", **{"continue": first["metadata"]["continue"]})
    assert code == 410 and body["reason"] == "Expired"
    assert body["message"].startswith("The provided continue parameter is too old to display a consistent list result.")


def test_a_malformed_continue_token_is_400(http):
    token = base64.urlsafe_b64encode(json.dumps({"nope": 1}).encode()).decode()
    code, body = http.get(CONFIGMAPS, limit="2", **{"continue": token})
    assert code == 400 and body["reason"] == "BadRequest"
