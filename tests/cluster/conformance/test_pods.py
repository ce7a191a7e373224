"""Pods: the `pods/binding` subresource a scheduler assigns them through, the spec fields an update may
change, and graceful deletion (a bound pod stays, terminating, until its kubelet deletes it with grace 0)."""
import json

import requests

from tests.cluster.conformance.helpers import causes

PODS = "/api/v1/namespaces/default/pods"
RESOURCES = "/api/v1"
IMMUTABLE = ("Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
             "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to "
             "existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was "
             "previously negative)")


def pod(name="p", node=None, **spec):
    body = {"containers": [{"name": "c", "image": "img:1"}], **spec}
    if node:
        body["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": body}


def binding(name="p", node="n1", **meta):
    return {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, **meta},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}


# ---------------------------------------------------------------- pods/binding
def test_discovery_lists_the_binding_subresource_with_create_only(http):
    resources = {r["name"]: r for r in http.ok("get", RESOURCES)["resources"]}
    assert resources["pods/binding"]["verbs"] == ["create"] and resources["pods/binding"]["kind"] == "Binding"


def test_binding_assigns_the_node_and_answers_a_201_status(http):
    http.ok("post", PODS, pod())
    code, body = http.post(PODS + "/p/binding", binding())
    assert code == 201 and body["kind"] == "Status" and body["status"] == "Success"
    bound = http.ok("get", PODS + "/p")
    assert bound["spec"]["nodeName"] == "n1"
    assert {"type": "PodScheduled", "status": "True"}.items() <= bound["status"]["conditions"][-1].items()


def test_binding_a_bound_pod_is_a_conflict(http):
    http.ok("post", PODS, pod(node="n1"))
    code, body = http.post(PODS + "/p/binding", binding(node="n2"))
    assert code == 409 and body["reason"] == "Conflict"
    assert body["message"] == ('Operation cannot be fulfilled on pods/binding "p": pod p is already assigned '
                               'to node "n1"')
    assert http.ok("get", PODS + "/p")["spec"]["nodeName"] == "n1"


def test_binding_a_terminating_pod_is_a_conflict(http):
    http.ok("post", PODS, {**pod(), "metadata": {"name": "p", "finalizers": ["example.io/hold"]}})
    http.delete(PODS + "/p")
    code, body = http.post(PODS + "/p/binding", binding())
    assert code == 409 and body["message"].endswith("pod p is being deleted, cannot be assigned to a host")


def test_binding_needs_a_target_name_and_the_url_name(http):
    http.ok("post", PODS, pod())
    code, body = http.post(PODS + "/p/binding", {**binding(), "target": {"kind": "Node"}})
    assert code == 422 and causes(body) == [("target.name", "FieldValueRequired", "Required value")]
    code, body = http.post(PODS + "/p/binding", binding(name="other"))
    assert code == 400 and body["message"] == "name in URL does not match name in Binding object"


def test_binding_of_a_missing_pod_is_404_and_other_verbs_are_405(http):
    assert http.post(PODS + "/ghost/binding", binding(name="ghost"))[0] == 404
    http.ok("post", PODS, pod())
    assert http.get(PODS + "/p/binding")[0] == 405
    assert http.patch(PODS + "/p/binding", {"target": {"name": "n1"}})[0] == 405


# ---------------------------------------------------------------- immutable spec
def test_an_update_may_not_move_a_pod_to_another_node(http):
    http.ok("post", PODS, pod(node="n1"))
    code, body = http.patch(PODS + "/p", {"spec": {"nodeName": "n2"}})
    assert code == 422 and body["message"] == f'Pod "p" is invalid: spec: {IMMUTABLE}'
    assert causes(body) == [("spec", "FieldValueForbidden", IMMUTABLE)]


def test_binding_by_patching_the_node_name_is_refused(http):
    http.ok("post", PODS, pod())
    assert http.patch(PODS + "/p", {"spec": {"nodeName": "n1"}})[0] == 422
    assert "nodeName" not in http.ok("get", PODS + "/p")["spec"]


def test_other_spec_changes_are_refused_too(http):
    http.ok("post", PODS, pod())
    current = http.ok("get", PODS + "/p")
    current["spec"]["containers"][0]["command"] = ["sleep"]
    assert http.put(PODS + "/p", current)[0] == 422
    assert http.patch(PODS + "/p", {"spec": {"tolerations": []}}, kind="merge")[0] == 200      # nothing before
    assert http.patch(PODS + "/p", {"spec": {"containers": [{"name": "c", "image": "i", "args": ["x"]}]}},
                      kind="strategic")[0] == 422


def test_the_image_deadline_and_added_tolerations_may_change(http):
    toleration = {"key": "a", "operator": "Exists"}
    http.ok("post", PODS, pod(node="n1", tolerations=[toleration]))
    changed = http.ok("patch", PODS + "/p", {"spec": {
        "containers": [{"name": "c", "image": "img:2"}], "activeDeadlineSeconds": 60,
        "tolerations": [toleration, {"key": "b", "operator": "Exists"}]}}, kind="strategic")
    assert changed["spec"]["containers"][0]["image"] == "img:2" and changed["spec"]["activeDeadlineSeconds"] == 60
    assert http.patch(PODS + "/p", {"spec": {"tolerations": [{"key": "b", "operator": "Exists"}]}})[0] == 422


def test_metadata_and_status_of_a_pod_stay_writable(http):
    http.ok("post", PODS, pod(node="n1"))
    http.ok("patch", PODS + "/p", {"metadata": {"labels": {"a": "b"}}})
    assert http.ok("patch", PODS + "/p/status", {"status": {"phase": "Running"}})["status"]["phase"] == "Running"


# ---------------------------------------------------------------- graceful deletion
def test_deleting_a_bound_pod_starts_its_grace_period_from_the_spec(http):
    http.ok("post", PODS, pod(node="n1", terminationGracePeriodSeconds=7))
    code, body = http.delete(PODS + "/p")
    assert code == 200 and body["metadata"]["deletionGracePeriodSeconds"] == 7
    assert body["metadata"]["deletionTimestamp"]
    assert http.ok("get", PODS + "/p")["metadata"]["deletionGracePeriodSeconds"] == 7


def test_the_default_grace_period_is_30_seconds_and_the_delete_options_override_it(http):
    http.ok("post", PODS, pod("a", node="n1"))
    http.ok("post", PODS, pod("b", node="n1"))
    assert http.delete(PODS + "/a")[1]["metadata"]["deletionGracePeriodSeconds"] == 30
    code, body = http.delete(PODS + "/b", {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 5})
    assert code == 200 and body["metadata"]["deletionGracePeriodSeconds"] == 5


def test_an_unbound_pod_goes_at_once(http):
    http.ok("post", PODS, pod(terminationGracePeriodSeconds=7))
    assert http.delete(PODS + "/p")[0] == 200 and http.get(PODS + "/p")[0] == 404


def test_grace_period_zero_deletes_at_once_even_while_terminating(http):
    http.ok("post", PODS, pod("a", node="n1"))
    assert http.delete(PODS + "/a", gracePeriodSeconds=0)[0] == 200 and http.get(PODS + "/a")[0] == 404
    http.ok("post", PODS, pod("b", node="n1"))
    http.delete(PODS + "/b")
    assert http.get(PODS + "/b")[0] == 200
    http.delete(PODS + "/b", gracePeriodSeconds=0)            # what the kubelet sends once the pod stopped
    assert http.get(PODS + "/b")[0] == 404


def test_a_second_delete_may_only_shorten_the_grace_period(http):
    http.ok("post", PODS, pod(node="n1", terminationGracePeriodSeconds=20))
    first = http.delete(PODS + "/p")[1]["metadata"]
    assert http.delete(PODS + "/p", gracePeriodSeconds=60)[1]["metadata"] == first
    shorter = http.delete(PODS + "/p", gracePeriodSeconds=5)[1]["metadata"]
    assert shorter["deletionGracePeriodSeconds"] == 5 and shorter["deletionTimestamp"] < first["deletionTimestamp"]


def test_a_terminating_pod_takes_status_writes_and_stays(http):
    http.ok("post", PODS, pod(node="n1"))
    http.delete(PODS + "/p")
    http.ok("patch", PODS + "/p/status", {"status": {"phase": "Running"}})
    assert http.ok("get", PODS + "/p")["metadata"]["deletionTimestamp"]


def test_a_finished_pod_goes_at_once(http):
    http.ok("post", PODS, pod(node="n1"))
    http.ok("patch", PODS + "/p/status", {"status": {"phase": "Succeeded"}})
    assert http.delete(PODS + "/p")[0] == 200 and http.get(PODS + "/p")[0] == 404


def test_watchers_see_the_terminating_pod_modified_then_deleted(http):
    http.ok("post", PODS, pod(node="n1"))
    rv = http.ok("get", PODS)["metadata"]["resourceVersion"]
    http.delete(PODS + "/p")
    http.delete(PODS + "/p", gracePeriodSeconds=0)
    r = requests.get(http.url + PODS, params={"watch": "true", "resourceVersion": rv, "timeoutSeconds": "1"},
                     timeout=10)
    events = [json.loads(line) for line in r.text.splitlines() if line]
    assert [e["type"] for e in events] == ["MODIFIED", "DELETED"]
    assert events[0]["object"]["metadata"]["deletionTimestamp"]


def test_a_finalizer_holds_a_force_deleted_pod_which_goes_when_it_is_removed(http):
    http.ok("post", PODS, {**pod(node="n1"), "metadata": {"name": "p", "finalizers": ["example.io/hold"]}})
    code, body = http.delete(PODS + "/p", gracePeriodSeconds=0)
    assert code == 202 and body["metadata"]["deletionGracePeriodSeconds"] == 0
    assert http.delete(PODS + "/p")[1]["metadata"]["deletionGracePeriodSeconds"] == 0    # no grace again
    http.ok("patch", PODS + "/p", {"metadata": {"finalizers": None}})
    assert http.get(PODS + "/p")[0] == 404
