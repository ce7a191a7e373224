"""The Argo CD health check, executed by a real Lua runtime (lupa) on the script exactly as
`kubectl kustomize manifests/argocd` renders it into argocd-cm, over sample InferenceService objects."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

lupa = pytest.importorskip("lupa")

ROOT = Path(__file__).resolve().parents[2]
KEY = "resource.customizations.health.specfleet.io_InferenceService"


@pytest.fixture(scope="module")
def health():
    rendered = subprocess.run([str(Path(sys.executable).parent / "kubectl"), "kustomize",
                               str(ROOT / "manifests/argocd")], capture_output=True, text=True, check=True).stdout
    cm = yaml.safe_load(rendered)
    assert (cm["kind"], cm["metadata"]["name"], cm["metadata"]["namespace"]) == ("ConfigMap", "argocd-cm", "argocd")
    script = cm["data"][KEY]
    assert script == (ROOT / "manifests/argocd/health-inferenceservice.lua").read_text()
    runtime = lupa.LuaRuntime()
    check = runtime.eval(f"function(obj)\n{script}\nend")

    def to_lua(value):
        if isinstance(value, dict):
            return runtime.table_from({k: to_lua(v) for k, v in value.items()})
        if isinstance(value, list):
            return runtime.table_from([to_lua(v) for v in value])
        return value

    def run(obj: dict) -> tuple[str, str]:
        hs = check(to_lua(obj))
        return hs["status"], hs["message"]
    return run


def obj(*conditions: tuple[str, str, str], generation: int = 2, observed: int = 2) -> dict:
    return {"metadata": {"generation": generation},
            "status": {"observedGeneration": observed,
                       "conditions": [{"type": t, "status": s, "reason": t + "Reason", "message": m}
                                      for t, s, m in conditions]}}


def test_no_status_is_progressing(health):
    assert health({"metadata": {"generation": 1}})[0] == "Progressing"


def test_an_unobserved_generation_is_progressing(health):
    status, message = health(obj(("Ready", "True", "2/2"), generation=3, observed=2))
    assert status == "Progressing" and "not yet observed" in message


def test_ready_and_meeting_the_slo_is_healthy(health):
    assert health(obj(("Ready", "True", "2/2 replicas"), ("SLOMet", "True", "ok"))) == ("Healthy", "2/2 replicas")


def test_a_missed_slo_is_degraded(health):
    status, message = health(obj(("Ready", "True", ""), ("SLOMet", "False", "ttft p99 900ms > 500ms")))
    assert status == "Degraded" and "900ms" in message


def test_a_fast_burning_error_budget_is_degraded_even_while_the_slo_is_met(health):
    status, message = health(obj(("Ready", "True", ""), ("SLOMet", "True", ""),
                                 ("SLOAtRisk", "True", "fast burn: 20.0x over 1h")))
    assert status == "Degraded" and "fast burn" in message


def test_a_degraded_condition_wins(health):
    status, message = health(obj(("Degraded", "True", "bad accelerator"), ("Ready", "False", "")))
    assert status == "Degraded" and message == "DegradedReason: bad accelerator"


def test_not_ready_yet_is_progressing_with_the_operator_message(health):
    assert health(obj(("Ready", "False", "0/1 replicas ready"))) == ("Progressing", "0/1 replicas ready")
