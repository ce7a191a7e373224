"""Built-in objects of the kinds the operator creates are decoded like kube-apiserver decodes them: a wrong
JSON type is a 400 with the decoder's words, an unknown field is dropped with a warning (or refused under
fieldValidation=Strict), and nothing unknown or mistyped is ever stored."""
import pytest
import requests

from tests.cluster.conftest import DEPLOYMENTS, Http
from tests.cluster.conformance.helpers import (NETPOLS, PDBS, SECRETS, SERVICES, deployment, network_policy, pdb,
                                               secret, service)

KINDS = {"deployment": (DEPLOYMENTS, deployment), "service": (SERVICES, service), "pdb": (PDBS, pdb),
         "networkpolicy": (NETPOLS, network_policy), "secret": (SECRETS, secret)}


def post_with_headers(http: Http, path, body, **params):
    return requests.post(http.url + path, json=body, params=params, timeout=10)


@pytest.mark.parametrize("kind,mutate,message", [
    ("deployment", lambda o: o["spec"].update(replicas="many"),
     'Deployment in version "v1" cannot be handled as a Deployment: json: cannot unmarshal string into Go struct '
     "field DeploymentSpec.spec.replicas of type int32"),
    ("deployment", lambda o: o["spec"]["template"]["spec"]["containers"][0].update(image=7),
     'Deployment in version "v1" cannot be handled as a Deployment: json: cannot unmarshal number into Go struct '
     "field Container.spec.template.spec.containers.image of type string"),
    ("service", lambda o: o["spec"]["ports"][0].update(port="http"),
     'Service in version "v1" cannot be handled as a Service: json: cannot unmarshal string into Go struct field '
     "ServicePort.spec.ports.port of type int32"),
    ("pdb", lambda o: o["spec"].update(selector="app=web"),
     'PodDisruptionBudget in version "v1" cannot be handled as a PodDisruptionBudget: json: cannot unmarshal string '
     "into Go struct field PodDisruptionBudgetSpec.spec.selector of type v1.LabelSelector"),
    ("networkpolicy", lambda o: o["spec"].update(policyTypes="Ingress"),
     'NetworkPolicy in version "v1" cannot be handled as a NetworkPolicy: json: cannot unmarshal string into Go '
     "struct field NetworkPolicySpec.spec.policyTypes of type []string"),
    ("secret", lambda o: o.update(data={"token": "not base64!"}),
     'Secret in version "v1" cannot be handled as a Secret: illegal base64 data at input byte 3'),
])
def test_mistyped_fields_are_400_and_nothing_is_stored(http, kind, mutate, message):
    path, make = KINDS[kind]
    body = make()
    mutate(body)
    code, out = http.post(path, body)
    assert (code, out["reason"], out["message"]) == (400, "BadRequest", message)
    assert http.get(path)[1]["items"] == []


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_unknown_fields_are_dropped_with_a_warning(http, kind):
    path, make = KINDS[kind]
    body = make()
    body["spec" if "spec" in body else "metadata"]["bogus"] = 1
    response = post_with_headers(http, path, body)
    where = "spec" if "spec" in body else "metadata"
    assert response.status_code == 201 and response.headers["Warning"] == f'299 - "unknown field \\"{where}.bogus\\""'
    assert "bogus" not in response.json()[where]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_unknown_fields_are_refused_under_strict(http, kind):
    path, make = KINDS[kind]
    body = make()
    body["extra"] = {"x": 1}
    code, out = http.post(path, body, fieldValidation="Strict")
    assert code == 400 and out["message"].endswith('strict decoding error: unknown field "extra"')


def test_ignore_drops_unknown_fields_silently(http):
    body = deployment()
    body["spec"]["bogus"] = 1
    response = post_with_headers(http, DEPLOYMENTS, body, fieldValidation="Ignore")
    assert response.status_code == 201 and "Warning" not in response.headers


def test_unknown_fields_in_nested_lists_are_named_with_their_index(http):
    body = deployment()
    body["spec"]["template"]["spec"]["containers"][0]["bogus"] = True
    response = post_with_headers(http, DEPLOYMENTS, body)
    assert 'unknown field \\"spec.template.spec.containers[0].bogus\\"' in response.headers["Warning"]


def test_mistyped_patch_is_400_and_the_object_is_unchanged(http):
    http.ok("post", DEPLOYMENTS, deployment())
    code, _ = http.patch(DEPLOYMENTS + "/web", {"spec": {"replicas": "many"}})
    assert code == 400 and http.ok("get", DEPLOYMENTS + "/web")["spec"]["replicas"] == 1


def test_int_or_string_and_quantities_take_both_forms(http):
    assert http.post(SERVICES, service("a"))[0] == 201
    named = service("b")
    named["spec"]["ports"][0]["targetPort"] = "http"
    assert http.post(SERVICES, named)[0] == 201
    body = deployment()
    body["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 1, "memory": "1Gi"}}
    assert http.post(DEPLOYMENTS, body)[0] == 201


def test_secret_string_data_is_folded_into_data_and_never_stored(http):
    body = secret()
    body["stringData"] = {"extra": "plain"}
    created = http.ok("post", SECRETS, body)
    assert "stringData" not in created and created["data"] == {"token": "c2VjcmV0", "extra": "cGxhaW4="}
    http.ok("patch", SECRETS + "/token", {"stringData": {"token": "new"}})
    assert http.ok("get", SECRETS + "/token")["data"]["token"] == "bmV3"


def test_status_writes_are_decoded_too(http):
    http.ok("post", DEPLOYMENTS, deployment())
    code, body = http.patch(DEPLOYMENTS + "/web/status", {"status": {"readyReplicas": "two"}})
    assert code == 400 and body["message"].endswith("cannot unmarshal string into Go struct field "
                                                    "DeploymentStatus.status.readyReplicas of type int32")


def test_deployment_selector_must_match_the_template_labels(http):
    body = deployment()
    body["spec"]["selector"] = {"matchLabels": {"app": "other"}}
    code, out = http.post(DEPLOYMENTS, body)
    assert code == 422 and out["message"] == ('Deployment.apps "web" is invalid: spec.template.metadata.labels: Invalid '
                                              'value: map[string]string{"app":"web"}: `selector` does not match '
                                              "template `labels`")


def test_deployment_needs_a_selector_and_named_containers(http):
    body = deployment()
    del body["spec"]["selector"]
    body["spec"]["template"]["spec"]["containers"] = [{"image": "nginx"}]
    code, out = http.post(DEPLOYMENTS, body)
    assert code == 422 and [(c["field"], c["message"]) for c in out["details"]["causes"]] == [
        ("spec.selector", "Required value"), ("spec.template.spec.containers[0].name", "Required value")]


def test_a_template_container_may_leave_its_image_to_config_management(http):
    body = deployment()
    del body["spec"]["template"]["spec"]["containers"][0]["image"]
    assert http.post(DEPLOYMENTS, body)[0] == 201


def test_service_ports_lie_in_range(http):
    body = service()
    body["spec"]["ports"][0]["port"] = 70000
    code, out = http.post(SERVICES, body)
    assert code == 422 and "spec.ports[0].port: Invalid value: 70000: must be between 1 and 65535, inclusive" \
        in out["message"]


def test_pdb_sets_min_available_or_max_unavailable_not_both(http):
    code, out = http.post(PDBS, pdb(minAvailable=1))
    assert code == 422 and "minAvailable and maxUnavailable cannot be both set" in out["message"]
