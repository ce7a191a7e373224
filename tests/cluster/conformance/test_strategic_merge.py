"""Strategic merge patch follows each built-in kind's definition: lists with a merge key merge item by item,
lists without a patch strategy are replaced, primitive lists with strategy merge are sets."""
from tests.cluster.conftest import DEPLOYMENTS, configmap
from tests.cluster.conformance.helpers import SERVICES, deployment, service


def pod_spec(http):
    return http.ok("get", DEPLOYMENTS + "/web")["spec"]["template"]["spec"]


def smp(http, path, body):
    return http.ok("patch", path, body, kind="strategic")


def test_lists_with_a_merge_key_merge_by_it(http):
    body = deployment()
    body["spec"]["template"]["spec"]["schedulingGates"] = [{"name": "a"}]
    http.ok("post", DEPLOYMENTS, body)
    smp(http, DEPLOYMENTS + "/web", {"spec": {"template": {"spec": {"schedulingGates": [{"name": "b"}]}}}})
    assert pod_spec(http)["schedulingGates"] == [{"name": "a"}, {"name": "b"}]


def test_nested_keyed_lists_merge_through_their_parents(http):
    http.ok("post", DEPLOYMENTS, deployment())
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "app", "env": [{"name": "A", "value": "1"}]}]}}}}
    smp(http, DEPLOYMENTS + "/web", patch)
    [container] = pod_spec(http)["containers"]
    assert container["image"] == "nginx" and container["env"] == [{"name": "A", "value": "1"}]


def test_lists_without_a_strategy_are_replaced(http):
    body = deployment()
    body["spec"]["template"]["spec"]["tolerations"] = [{"key": "a", "operator": "Exists"}]
    http.ok("post", DEPLOYMENTS, body)
    smp(http, DEPLOYMENTS + "/web", {"spec": {"template": {"spec": {"tolerations": [{"key": "b",
                                                                                     "operator": "Exists"}]}}}})
    assert pod_spec(http)["tolerations"] == [{"key": "b", "operator": "Exists"}]


def test_service_ports_merge_by_port(http):
    http.ok("post", SERVICES, service())
    out = smp(http, SERVICES + "/web", {"spec": {"ports": [{"port": 9090, "name": "metrics"}]}})
    assert [p["port"] for p in out["spec"]["ports"]] == [80, 9090]


def test_delete_directive_removes_one_keyed_item(http):
    http.ok("post", DEPLOYMENTS, deployment())
    smp(http, DEPLOYMENTS + "/web", {"spec": {"template": {"spec": {"containers": [
        {"name": "side", "image": "busybox"}]}}}})
    smp(http, DEPLOYMENTS + "/web", {"spec": {"template": {"spec": {"containers": [
        {"name": "app", "$patch": "delete"}]}}}})
    assert [c["name"] for c in pod_spec(http)["containers"]] == ["side"]


def test_finalizers_merge_as_a_set(http):
    http.ok("post", "/api/v1/namespaces/default/configmaps",
            {**configmap("a"), "metadata": {"name": "a", "finalizers": ["x.io/a"]}})
    out = smp(http, "/api/v1/namespaces/default/configmaps/a", {"metadata": {"finalizers": ["x.io/b", "x.io/a"]}})
    assert out["metadata"]["finalizers"] == ["x.io/a", "x.io/b"]
