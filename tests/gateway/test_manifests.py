"""The gateway's install: manifests valid for Kubernetes 1.32, RBAC read-only but for the one annotation
it writes, the Dockerfile clean under hadolint, and the Deployment running the CLI that exists."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from specfleet.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
FILES = ["serviceaccount.yaml", "rbac.yaml", "deployment.yaml", "service.yaml"]


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((ROOT / "manifests/gateway" / name).read_text()) if d]


@pytest.mark.parametrize("name", FILES)
def test_gateway_manifests_validate_strictly(name):
    for doc in _docs(name):
        kubernetes_validate.validate(doc, "1.32.0", strict=True)


def test_the_install_kustomization_includes_the_gateway():
    out = subprocess.run([str(BIN / "kubectl"), "kustomize", str(ROOT / "manifests")],
                         capture_output=True, text=True, check=True).stdout
    names = {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(out) if d}
    assert {("Deployment", "specfleet-gateway"), ("Service", "specfleet-gateway"),
            ("ClusterRole", "specfleet-gateway"), ("Role", "specfleet-gateway-api-keys")} <= names


def test_gateway_rbac_reads_only_what_it_routes_by_and_one_secret():
    rbac = {d["kind"]: d for d in _docs("rbac.yaml")}
    rules = {(g, r): set(rule["verbs"]) for rule in rbac["ClusterRole"]["rules"]
             for g in rule["apiGroups"] for r in rule["resources"]}
    assert rules == {("specfleet.io", "inferenceservices"): {"get", "list", "watch", "patch"},
                     ("", "services"): {"get", "list", "watch"}, ("", "pods"): {"get", "list", "watch"}}
    [secrets] = rbac["Role"]["rules"]
    assert secrets["resources"] == ["secrets"] and set(secrets["verbs"]) == {"get", "list", "watch"}
    assert secrets["resourceNames"] == ["specfleet-gateway-api-keys"]


def test_the_deployment_runs_flags_the_cli_accepts():
    container = _docs("deployment.yaml")[0]["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[:2] == ["gateway", "run"] and "--api-key-secret" in args
    help_text = CliRunner().invoke(app, ["gateway", "run", "--help"], env={"COLUMNS": "200"}).output
    for flag in (a for a in args[2:] if a.startswith("--")):
        assert flag in help_text, flag
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"


@pytest.mark.skipif(shutil.which("hadolint", path=str(BIN)) is None, reason="hadolint not installed")
def test_the_gateway_dockerfile_passes_hadolint():
    subprocess.run([str(BIN / "hadolint"), str(ROOT / "images/gateway.Dockerfile")], check=True)
