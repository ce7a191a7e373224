"""ObjectMeta validation for every kind: names, label keys and values, annotation keys and size, owner
references — what a real server refuses with 422 before anything is stored."""
import pytest

from tests.cluster.conftest import CONFIGMAPS, WIDGETS, configmap, widget

LABEL_HELP = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and "
              "must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex "
              "used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")


def with_meta(**meta):
    body = configmap("a")
    body["metadata"].update(meta)
    return body


@pytest.mark.parametrize("labels,message", [
    ({"app": "x" * 64}, f'metadata.labels: Invalid value: "{"x" * 64}": must be no more than 63 characters'),
    ({"app": "-bad"}, f'metadata.labels: Invalid value: "-bad": {LABEL_HELP}'),
    ({"bad key": "x"}, 'metadata.labels: Invalid value: "bad key": name part must consist of alphanumeric'),
    ({"Example.COM/app": "x"}, 'metadata.labels: Invalid value: "Example.COM/app": prefix part a lowercase RFC 1123'),
])
def test_invalid_labels_are_422(http, labels, message):
    code, body = http.post(CONFIGMAPS, with_meta(labels=labels))
    assert code == 422 and body["message"].startswith(f'ConfigMap "a" is invalid: {message}')


def test_valid_labels_pass(http):
    assert http.post(CONFIGMAPS, with_meta(labels={"app.kubernetes.io/name": "x" * 63, "empty": ""}))[0] == 201


def test_label_rules_hold_on_custom_resources_and_on_update(http, crd):
    http.ok("post", WIDGETS, widget())
    code, body = http.patch(WIDGETS + "/w1", {"metadata": {"labels": {"app": "has space"}}})
    assert code == 422 and body["details"]["causes"][0]["field"] == "metadata.labels"


def test_annotations_over_256_kib_are_422(http):
    code, body = http.post(CONFIGMAPS, with_meta(annotations={"big": "x" * (256 * 1024)}))
    assert code == 422 and "metadata.annotations: Too long: must have at most 262144 bytes" in body["message"]


def test_owner_references_need_a_uid(http):
    ref = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}
    code, body = http.post(CONFIGMAPS, with_meta(ownerReferences=[ref]))
    assert code == 422 and 'metadata.ownerReferences[0].uid: Invalid value: "": uid must not be empty' in body["message"]


@pytest.mark.parametrize("name", ["Upper", "under_score", "a" * 254, "-leading"])
def test_invalid_names_are_422(http, name):
    code, body = http.post(CONFIGMAPS, configmap(name))
    assert code == 422 and body["details"]["causes"][0]["field"] == "metadata.name"
