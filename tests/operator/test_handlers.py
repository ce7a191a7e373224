"""`handlers.reconcile` against an in-memory fake of the Kube verbs: idempotence, drift, replicas."""
from __future__ import annotations

import copy
import subprocess
import sys

from specfleet.operator import handlers
from specfleet.operator.kube import is_subset

NOW = "2026-01-01T00:00:00Z"
BASE = {"model": {"name": "m", "source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
        "slo": {"ttftP99Ms": 1000, "itlP99Ms": 30, "promptTokens": 1000, "outputTokens": 200}}


class FakeKube:
    def __init__(self):
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.writes = 0

    def get(self, kind, namespace, name):
        return copy.deepcopy(self.objects.get((kind, namespace, name)))

    def apply(self, manifest):
        key = (manifest["kind"], manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        live = self.objects.get(key)
        if live is not None and is_subset(manifest, live):
            return "unchanged"
        self.objects[key], self.writes = copy.deepcopy(manifest), self.writes + 1
        return "created" if live is None else "updated"

    def create_if_missing(self, manifest):
        key = (manifest["kind"], manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        if key in self.objects:
            return False
        self.objects[key] = manifest
        return True


def body(spec=None, generation=1, status=None):
    return {"metadata": {"name": "svc", "namespace": "ns", "uid": "u1", "generation": generation},
            "spec": spec or BASE, "status": status or {}}


def test_a_second_reconcile_writes_nothing_and_posts_no_plan_event():
    kube = FakeKube()
    first = handlers.reconcile(body(), kube, NOW)
    writes = kube.writes
    second = handlers.reconcile(body(status=first.status), kube, NOW)
    assert kube.writes == writes and second.status["plan"] == first.status["plan"]
    assert not any(reason == "Planned" for _, reason, _ in second.events)
    assert {k for k, _, _ in kube.objects} == {"Deployment", "Service", "PodDisruptionBudget", "Secret", "NetworkPolicy"}


def test_drifted_args_are_restored():
    kube = FakeKube()
    handlers.reconcile(body(), kube, NOW)
    dep = kube.objects[("Deployment", "ns", "svc")]
    good = list(dep["spec"]["template"]["spec"]["containers"][0]["args"])
    dep["spec"]["template"]["spec"]["containers"][0]["args"] = ["--tampered"]
    handlers.reconcile(body(), kube, NOW)
    assert kube.objects[("Deployment", "ns", "svc")]["spec"]["template"]["spec"]["containers"][0]["args"] == good


def test_autoscaled_replicas_are_kept_within_bounds():
    kube = FakeKube()
    spec = {**BASE, "autoscaling": {"minReplicas": 1, "maxReplicas": 3}}
    handlers.reconcile(body(spec), kube, NOW)
    kube.objects[("Deployment", "ns", "svc")]["spec"]["replicas"] = 3
    assert handlers.reconcile(body(spec), kube, NOW).status["desiredReplicas"] == 3
    kube.objects[("Deployment", "ns", "svc")]["spec"]["replicas"] = 9
    assert handlers.reconcile(body(spec), kube, NOW).status["desiredReplicas"] == 3


def test_an_invalid_spec_is_degraded_and_touches_nothing():
    kube = FakeKube()
    outcome = handlers.reconcile(body({"model": {"name": "m"}}), kube, NOW)
    assert outcome.status["phase"] == "Failed" and not kube.objects
    assert outcome.events[0][:2] == ("Warning", "InvalidSpec")


def test_the_admin_token_is_created_once():
    kube = FakeKube()
    handlers.reconcile(body(), kube, NOW)
    token = kube.objects[("Secret", "ns", "svc-admin")]["stringData"]["token"]
    handlers.reconcile(body(), kube, NOW)
    assert kube.objects[("Secret", "ns", "svc-admin")]["stringData"]["token"] == token and len(token) > 20


def test_the_operator_never_imports_torch():
    code = ("import sys, specfleet.operator.handlers, specfleet.operator.main, specfleet.cli.operator_cmds; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
