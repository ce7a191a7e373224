"""The official `kubernetes` Python client against the emulator, through the written kubeconfig."""
import threading

import pytest
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from tests.cluster.conftest import manifest


@pytest.fixture
def k8s(api):
    return config.new_client_from_config(config_file=str(api.kubeconfig))


def test_core_crud_and_errors(k8s):
    core = client.CoreV1Api(k8s)
    cm = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="a", labels={"app": "x"}), data={"k": "v"})
    created = core.create_namespaced_config_map("default", cm)
    assert created.metadata.uid and created.data == {"k": "v"}
    core.patch_namespaced_config_map("a", "default", {"data": {"k": "w"}})
    assert core.read_namespaced_config_map("a", "default").data == {"k": "w"}
    assert [c.metadata.name for c in core.list_namespaced_config_map("default", label_selector="app=x").items] == ["a"]
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map("default", cm)
    assert err.value.status == 409
    core.delete_namespaced_config_map("a", "default")
    with pytest.raises(ApiException) as err:
        core.read_namespaced_config_map("a", "default")
    assert err.value.status == 404


def test_apps_deployment_and_scale(k8s):
    apps = client.AppsV1Api(k8s)
    apps.create_namespaced_deployment("default", manifest("deployment.yaml"))
    apps.patch_namespaced_deployment_scale("web", "default", {"spec": {"replicas": 4}})
    dep = apps.read_namespaced_deployment("web", "default")
    assert dep.spec.replicas == 4 and dep.spec.template.spec.containers[0].name == "app"


def test_custom_objects_and_watch(k8s, crd):
    custom = client.CustomObjectsApi(k8s)
    args = ("example.specfleet.io", "v1", "default", "widgets")
    rv = custom.list_namespaced_custom_object(*args)["metadata"]["resourceVersion"]
    body = {"apiVersion": "example.specfleet.io/v1", "kind": "Widget", "metadata": {"name": "w"},
            "spec": {"size": "small"}}
    threading.Timer(0.2, lambda: custom.create_namespaced_custom_object(*args, body)).start()
    seen = []
    for event in watch.Watch().stream(custom.list_namespaced_custom_object, *args, resource_version=rv,
                                      timeout_seconds=2):
        seen.append((event["type"], event["object"]["metadata"]["name"]))
        break
    assert seen == [("ADDED", "w")]
    custom.patch_namespaced_custom_object_status(*args, "w", {"status": {"phase": "Ready"}})
    assert custom.get_namespaced_custom_object(*args, "w")["status"]["phase"] == "Ready"
    with pytest.raises(ApiException) as err:
        custom.patch_namespaced_custom_object(*args, "w", {"spec": {"size": "nope"}})
    assert err.value.status == 422


def test_events_and_leases(k8s):
    core = client.CoreV1Api(k8s)
    core.create_namespaced_event("default", client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name="ev-"), involved_object=client.V1ObjectReference(
            kind="Widget", name="w", namespace="default"), reason="Test", message="hello", type="Normal"))
    assert core.list_namespaced_event("default").items[0].reason == "Test"
    coord = client.CoordinationV1Api(k8s)
    coord.create_namespaced_lease("default", client.V1Lease(metadata=client.V1ObjectMeta(name="leader"),
                                                            spec=client.V1LeaseSpec(holder_identity="me")))
    assert coord.read_namespaced_lease("leader", "default").spec.holder_identity == "me"
