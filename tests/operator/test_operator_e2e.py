"""End to end: the real operator (`specfleet operator run`) as a subprocess against the API emulator,
driven with kubectl and the kubernetes client.

The tests share one emulator and one operator and run in file order (a story: apply, edit, drift,
invalid, restart, delete).
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

pytest.importorskip("specfleet.cluster.apiserver", reason="the API emulator (specfleet.cluster.apiserver) "
                    "is not available")
from specfleet.cluster.apiserver import running_apiserver  # noqa: E402

from specfleet.operator import api, catalogs, planner, render  # noqa: E402

from tests.operator.operator_kit import NS, ROOT, Cluster, Operator, example, wait_for  # noqa: E402


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    with running_apiserver(tmp / "kubeconfig", port=0) as server:
        c = Cluster(Path(server.kubeconfig))
        c.server = server
        c.kubectl("apply", "-f", str(ROOT / "crds/inferenceservice.yaml"))
        c.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        wait_for(lambda: c.kubectl("get", "infsvc", "-n", NS, check=False).returncode == 0)
        yield c


@pytest.fixture(scope="module")
def operator(cluster, tmp_path_factory):
    """The operator under manifests/' ServiceAccount and RBAC (the tests drive the cluster as its admin)."""
    from testkit import service_account_kubeconfigs

    folder = tmp_path_factory.mktemp("operator")
    kubeconfig = service_account_kubeconfigs(cluster.server, folder)["operator"]
    op = Operator({**cluster.env, "KUBECONFIG": str(kubeconfig)}, folder / "operator.log")
    op.start()
    yield op
    op.stop()
    print(op.log.read_text()[-4000:])


def expected_args(doc: dict) -> list[str]:
    spec = api.parse_spec(doc["spec"])
    plan = planner.plan(spec, catalogs.gpus(), catalogs.models(), catalogs.profiles())
    deployment = render.render(doc["metadata"]["name"], NS, spec, plan)[0]
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def condition(svc: dict, kind: str) -> dict:
    return next((c for c in svc.get("status", {}).get("conditions", []) if c["type"] == kind), {})


def test_apply_creates_deployment_service_and_pdb_with_the_planned_args(cluster, operator):
    doc = example("chat")
    cluster.apply(doc)
    assert wait_for(lambda: cluster.args("chat")) == expected_args(doc)
    assert wait_for(lambda: cluster.core.read_namespaced_service("chat", NS)).spec.ports[0].port == 8000
    assert wait_for(lambda: cluster.policy.read_namespaced_pod_disruption_budget("chat", NS)).spec.max_unavailable == 1
    ingress = wait_for(lambda: cluster.networking.read_namespaced_network_policy("chat", NS)).spec.ingress
    assert {r._from[0].pod_selector.match_labels.get("app.kubernetes.io/name") for r in ingress} >= {"specfleet-operator"}
    owner = cluster.deployment("chat")["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "InferenceService" and owner["name"] == "chat" and owner["controller"]
    svc = wait_for(lambda: (s := cluster.service("chat")).get("status", {}).get("plan") and s)
    assert svc["status"]["observedGeneration"] == svc["metadata"]["generation"]
    assert svc["status"]["selector"] == "specfleet.io/inferenceservice=chat"
    assert condition(svc, "Degraded")["status"] == "False"
    assert wait_for(lambda: any(e["reason"] == "Planned" for e in cluster.events("chat")))


def test_printer_columns_show_engine_and_conditions(cluster, operator):
    out = cluster.kubectl("get", "infsvc", "chat", "-n", NS).stdout
    header = out.splitlines()[0].split()
    assert header[:4] == ["NAME", "MODE", "ENGINE", "READY"] and "ACCEPT" in header
    assert "Serving" in out and "specfleet" in out


def test_ready_replicas_flow_into_status(cluster, operator):
    planned = planner.plan(api.parse_spec(example("chat")["spec"]), catalogs.gpus(), catalogs.models(),
                           catalogs.profiles()).replicas
    cluster.kubectl("patch", "deployment", "chat", "-n", NS, "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": {"replicas": planned, "readyReplicas": planned}}))
    svc = wait_for(lambda: (s := cluster.service("chat"))["status"].get("readyReplicas") == planned and s)
    assert condition(svc, "Ready")["status"] == "True" and svc["status"]["replicas"] == planned
    scale = cluster.custom.get_namespaced_custom_object_scale(api.GROUP, api.VERSION, NS, api.PLURAL, "chat")
    assert scale["status"]["replicas"] == planned


def test_editing_the_slo_changes_args_and_status(cluster, operator):
    before = cluster.service("chat")
    cluster.kubectl("patch", "infsvc", "chat", "-n", NS, "--type=merge",
                    "-p", json.dumps({"spec": {"slo": {"itlP99Ms": 400}}}))
    want = expected_args(example("chat", itlP99Ms=400))
    assert want != expected_args(example("chat"))
    assert wait_for(lambda: cluster.args("chat") == want)
    after = wait_for(lambda: (s := cluster.service("chat"))["status"]["observedGeneration"]
                     == s["metadata"]["generation"] and s)
    assert after["metadata"]["generation"] > before["metadata"]["generation"]
    assert after["status"]["plan"]["maxNumSeqs"] > before["status"]["plan"]["maxNumSeqs"]
    assert after["spec"]["slo"]["itlP99Ms"] == 400          # the operator never rewrote the spec


def test_the_log_says_what_was_processed_and_not_each_handler_of_each_watch_event(cluster, operator):
    wait_for(lambda: "Creation is processed" in operator.log.read_text())
    log = operator.log.read_text()
    assert "Creation is processed: 1 succeeded; 0 failed." in log
    assert not re.search(r"Handler '\w+' succeeded", log)      # kopf's line per handler per watch event


def test_a_deleted_deployment_is_recreated(cluster, operator):
    uid = cluster.deployment("chat")["metadata"]["uid"]
    cluster.kubectl("delete", "deployment", "chat", "-n", NS, "--wait=false")
    recreated = wait_for(lambda: (d := cluster.deployment("chat")) and d["metadata"]["uid"] != uid and d)
    assert recreated["spec"]["template"]["spec"]["containers"][0]["args"] == expected_args(example("chat", itlP99Ms=400))


def test_drift_in_the_deployment_is_corrected(cluster, operator):
    cluster.kubectl("patch", "deployment", "chat", "-n", NS, "--type=json", "-p", json.dumps(
        [{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": ["--tampered"]}]))
    assert wait_for(lambda: cluster.args("chat") == expected_args(example("chat", itlP99Ms=400)))


def test_a_schema_invalid_service_is_rejected_by_the_api(cluster, operator):
    doc = example("bad-engine")
    doc["spec"]["runtime"]["engine"] = "tgi"
    proc = cluster.apply(doc, check=False)
    assert proc.returncode != 0 and "engine" in proc.stderr


def test_a_cel_rule_violation_is_rejected_by_the_api(cluster, operator):
    doc = example("bad-bounds")
    doc["spec"]["autoscaling"] = {"minReplicas": 3, "maxReplicas": 2}
    proc = cluster.apply(doc, check=False)
    assert proc.returncode != 0 and "minReplicas must not exceed maxReplicas" in proc.stderr


def test_an_objective_outside_zero_and_one_is_rejected_by_the_api(cluster, operator):
    proc = cluster.apply(example("bad-objective", objective=1.0), check=False)
    assert proc.returncode != 0 and "objective must be strictly between 0 and 1" in proc.stderr


def test_plan_only_plans_and_reports_actions_creates_nothing_then_serving_creates_the_workload(cluster, operator):
    doc = example("dry")
    doc["spec"]["mode"] = "PlanOnly"
    cluster.apply(doc)
    svc = wait_for(lambda: (s := cluster.service("dry")).get("status", {}).get("plannedActions") and s)
    assert "create Deployment dry (1 replica)" in svc["status"]["plannedActions"]
    assert svc["status"]["phase"] == "Pending" and svc["status"]["plan"]["maxNumSeqs"] >= 1
    assert wait_for(lambda: [e for e in cluster.events("dry") if e["reason"] == "PlanOnly"])
    row = cluster.kubectl("get", "infsvc", "dry", "-n", NS, "--no-headers").stdout.split()
    assert row[:2] == ["dry", "PlanOnly"]
    assert cluster.deployment("dry") is None
    for read in (cluster.core.read_namespaced_service, cluster.policy.read_namespaced_pod_disruption_budget,
                 cluster.core.read_namespaced_secret):
        with pytest.raises(cluster.ApiException):
            read("dry" if read is not cluster.core.read_namespaced_secret else "dry-admin", NS)
    cluster.kubectl("patch", "infsvc", "dry", "-n", NS, "--type=merge", "-p", json.dumps({"spec": {"mode": "Serving"}}))
    assert wait_for(lambda: cluster.args("dry")) == expected_args(doc)
    served = wait_for(lambda: (s := cluster.service("dry"))["status"].get("plannedActions") is None and s)
    assert condition(served, "Ready").get("reason") != "PlanOnly"


def test_held_requests_wake_a_service_at_zero_and_the_cold_start_is_reported(cluster, operator):
    doc = example("idle")
    doc["spec"]["autoscaling"] = {"minReplicas": 0, "maxReplicas": 2, "idleSeconds": 60}
    cluster.apply(doc)
    wait_for(lambda: cluster.deployment("idle"))
    cluster.apps.patch_namespaced_deployment("idle", NS, {"spec": {"replicas": 0}})
    wait_for(lambda: cluster.service("idle").get("status", {}).get("desiredReplicas") == 0)
    cluster.kubectl("annotate", "infsvc", "idle", "-n", NS, "held.gateway.specfleet.io/gw-0=2")
    assert wait_for(lambda: cluster.deployment("idle")["spec"]["replicas"] == 1)
    assert wait_for(lambda: [e for e in cluster.events("idle") if e["reason"] == "ScaleFromZero"])
    decisions = wait_for(lambda: cluster.service("idle")["status"].get("lastDecisions"))
    assert (decisions[-1]["from"], decisions[-1]["to"], decisions[-1]["reason"]) == ("0", "1", "HeldRequests")
    cluster.apps.patch_namespaced_deployment_status("idle", NS, {"status": {"replicas": 1, "readyReplicas": 1}})
    cold = wait_for(lambda: cluster.service("idle")["status"].get("coldStart"))
    assert cold["heldRequests"] == 2 and cold["lastSeconds"] > 0
    assert wait_for(lambda: [e for e in cluster.events("idle") if e["reason"] == "ColdStart"])


def test_a_small_context_alone_is_accepted_and_planned_within_it(cluster, operator):
    doc = example("small-context")
    # 409-token prompts (the default share of 512): one replica carries 0.065 req/s by the measured profile
    doc["spec"]["slo"] = {"ttftP99Ms": 2000, "itlP99Ms": 200, "maxContextTokens": 512, "requestsPerSecond": 0.05}
    cluster.apply(doc)
    svc = wait_for(lambda: (s := cluster.service("small-context")).get("status", {}).get("plan") and s)
    assert condition(svc, "Degraded")["status"] == "False"
    args = wait_for(lambda: cluster.args("small-context"))
    flag = lambda name: int(args[args.index(name) + 1])  # noqa: E731
    assert flag("--num-kv-blocks") * flag("--block-size") >= 512


def test_an_infeasible_service_is_degraded_with_a_reason_and_the_operator_keeps_going(cluster, operator):
    cluster.apply(example("too-fast", itlP99Ms=1))
    svc = wait_for(lambda: (s := cluster.service("too-fast")) and condition(s, "Degraded").get("status") == "True"
                   and s)
    degraded = condition(svc, "Degraded")
    assert degraded["reason"] == "ITLUnreachable" and "closest feasible" in degraded["message"]
    assert cluster.deployment("too-fast") is None
    assert wait_for(lambda: any(e["type"] == "Warning" and e["reason"] == "ITLUnreachable"
                                for e in cluster.events("too-fast")))
    cluster.apply(example("after-bad"))
    assert wait_for(lambda: cluster.args("after-bad")) == expected_args(example("after-bad"))
    assert operator.alive()


def test_a_restarted_operator_resumes_and_applies_changes_made_while_down(cluster, operator):
    operator.stop()
    cluster.kubectl("patch", "infsvc", "after-bad", "-n", NS, "--type=merge",
                    "-p", json.dumps({"spec": {"slo": {"itlP99Ms": 300}}}))
    cluster.apply(example("while-down"))
    time.sleep(0.5)
    assert cluster.deployment("while-down") is None
    operator.start()
    assert wait_for(lambda: cluster.args("while-down")) == expected_args(example("while-down"))
    assert wait_for(lambda: cluster.args("after-bad") == expected_args(example("after-bad", itlP99Ms=300)))
    svc = wait_for(lambda: (s := cluster.service("after-bad"))["status"]["observedGeneration"]
                   == s["metadata"]["generation"] and s)
    assert svc["status"]["plan"]["maxNumSeqs"] > 0


def test_deleting_the_service_collects_its_objects(cluster, operator):
    cluster.kubectl("delete", "infsvc", "chat", "-n", NS)
    assert wait_for(lambda: cluster.deployment("chat") is None)
    assert wait_for(lambda: not cluster.core.list_namespaced_service(
        NS, label_selector=render.selector_string("chat")).items)
    assert wait_for(lambda: not cluster.policy.list_namespaced_pod_disruption_budget(
        NS, label_selector=render.selector_string("chat")).items)
    assert operator.alive()
