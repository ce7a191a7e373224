"""Offline validation: built-in manifests with kubernetes-validate, example CRs against the CRD schema,
kustomize, and hadolint on the Dockerfiles."""
from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from specfleet.operator import api, catalogs, planner, render

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
K8S_VERSION = "1.32.0"
CRD = yaml.safe_load((ROOT / "crds/inferenceservice.yaml").read_text())
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
EXAMPLES = sorted((ROOT / "manifests/examples").glob("*.yaml"))
BUILTIN = ["namespace.yaml", "serviceaccount.yaml", "rbac.yaml", "operator.yaml"]


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.mark.parametrize("name", BUILTIN)
def test_builtin_manifests_validate_strictly(name):
    for doc in _docs(ROOT / "manifests" / name):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_crd_validates_as_a_crd():
    kubernetes_validate.validate(CRD, K8S_VERSION, strict=True)
    version = CRD["spec"]["versions"][0]
    assert CRD["spec"]["names"]["shortNames"] == ["infsvc"]
    assert version["subresources"]["scale"] == {"specReplicasPath": ".spec.replicas",
                                                "statusReplicasPath": ".status.replicas",
                                                "labelSelectorPath": ".status.selector"}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Mode", "Engine", "Ready", "Replicas", "SLO", "TTFT p99", "ITL p99", "Spec", "Accept", "Adapters", "Age"]


def test_the_crd_status_schema_has_exactly_the_designed_fields():
    st = SCHEMA["properties"]["status"]["properties"]
    assert set(st) == {"observedGeneration", "phase", "conditions", "plan", "replicas", "readyReplicas",
                       "desiredReplicas", "replicasPending", "selector", "observed", "lastDecisions",
                       "errorBudget", "plannedActions", "coldStart", "calibration", "adapters", "adapterCount",
                       "replanned"}
    assert st["conditions"]["items"]["properties"]["type"]["enum"] == list(api.CONDITION_TYPES)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_match_the_crd_schema_and_plan(path):
    for doc in _docs(path):
        jsonschema.validate(doc, SCHEMA)
        spec = api.parse_spec(doc["spec"])
        result = planner.plan(spec, catalogs.gpus(), catalogs.models())
        assert isinstance(result, planner.Plan), result
        for manifest in render.render(doc["metadata"]["name"], doc["metadata"]["namespace"], spec, result):
            kubernetes_validate.validate(render.with_owner(manifest, "x", "uid"), K8S_VERSION, strict=True)


def test_the_three_required_examples_exist():
    names = {p.name for p in EXAMPLES}
    assert "smollm2-cpu.yaml" in names and len(names) >= 3
    cpu = _docs(ROOT / "manifests/examples/smollm2-cpu.yaml")[0]["spec"]
    assert cpu["model"]["source"] == "builtin:smollm2-135m" and cpu["accelerator"]["type"] == "cpu"


@pytest.mark.parametrize("path, value", [
    (("runtime", "engine"), "tgi"),
    (("slo", "itlP99Ms"), 0),
    (("speculation", "mode"), "sometimes"),
    (("model", "source"), "s3://bucket/model"),
])
def test_the_schema_rejects_bad_values(path, value):
    doc = copy.deepcopy(_docs(ROOT / "manifests/examples/smollm2-cpu.yaml")[0])
    doc["spec"][path[0]][path[1]] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, SCHEMA)


def test_kustomize_builds_the_install():
    out = subprocess.run([str(BIN / "kubectl"), "kustomize", str(ROOT / "manifests")],
                         capture_output=True, text=True, check=True).stdout
    kinds = [d["kind"] for d in yaml.safe_load_all(out) if d]
    assert {"CustomResourceDefinition", "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
            "Deployment"} <= set(kinds)


def test_rbac_is_least_privilege():
    role = next(d for d in _docs(ROOT / "manifests/rbac.yaml") if d["kind"] == "ClusterRole")
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "delete" not in rule["verbs"]
    secrets = next(r for r in role["rules"] if "secrets" in r["resources"])
    assert set(secrets["verbs"]) == {"get", "create"}
    pods = next(r for r in role["rules"] if "pods" in r["resources"])
    assert set(pods["verbs"]) == {"list", "watch", "patch"}     # patch: the pod-deletion-cost annotation only


@pytest.mark.skipif(shutil.which("hadolint", path=str(BIN)) is None, reason="hadolint not installed")
def test_dockerfiles_pass_hadolint():
    files = sorted(str(p) for p in (ROOT / "images").glob("*.Dockerfile"))
    assert len(files) >= 2
    subprocess.run([str(BIN / "hadolint"), *files], check=True)


def test_the_dashboard_charts_the_error_budget_from_metrics_the_operator_exports():
    import json
    import re

    from specfleet.operator.control import telemetry

    dashboard = json.loads((ROOT / "manifests/grafana/dashboard.json").read_text())
    exprs = {p["title"]: " ".join(t["expr"] for t in p.get("targets", [])) for p in dashboard["panels"]}
    budget = {t: e for t, e in exprs.items() if t.startswith("Error budget")}
    assert any("specfleet_error_budget_burn_rate" in e for e in budget.values())
    assert any("specfleet_slo_window_attainment" in e for e in budget.values())
    exported = {m.name for m in telemetry.REGISTRY.collect()}
    for expr in budget.values():
        for name in re.findall(r"specfleet_\w+", expr):
            assert name in exported, f"{name} is charted but the operator does not export it"
