"""`specfleet up` runs the operator's and the gateway's command lines from manifests/ (the files themselves),
changed only by the laptop substitutions listed in `manifest_commands.LAPTOP`, and applies the same
Namespace, ServiceAccounts and RBAC that `kubectl kustomize manifests/` builds."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from specfleet.cluster import manifest_commands as mc
from specfleet.cluster import service_accounts
from testkit import BIN

ROOT = Path(__file__).resolve().parents[2]
LOCAL = mc.Local(host="127.0.0.1", gateway_port=18000, liveness_port=18080, metrics_port=19090)


def container(relative: str) -> dict:
    doc = yaml.safe_load((ROOT / "manifests" / relative).read_text())
    return doc["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("component, relative", [("operator", mc.OPERATOR), ("gateway", mc.GATEWAY)])
def test_up_runs_the_manifest_args_but_for_the_listed_substitutions(component, relative):
    declared = [str(a) for a in container(relative)["args"]]
    command = mc.local_command(component, mc.workload(relative), LOCAL)
    assert mc.kept_args(component, command.args) == mc.kept_args(component, declared)
    assert command.args[:2] == tuple(declared[:2])


def test_the_operator_s_liveness_and_metrics_move_to_free_local_ports():
    command = mc.operator_command(LOCAL)
    declared = container(mc.OPERATOR)
    if "--liveness" in declared["args"]:
        assert mc.flag_value(command.args, "--liveness") == "http://127.0.0.1:18080/healthz"
    declared_env = {e["name"]: e.get("value") for e in declared.get("env") or []}
    if "SPECFLEET_METRICS_PORT" in declared_env:
        assert command.env["SPECFLEET_METRICS_PORT"] == "19090"


def test_the_gateway_listens_on_up_s_address_and_port_and_is_named_by_its_local_pod():
    command = mc.gateway_command(LOCAL)
    assert (mc.flag_value(command.args, "--host"), mc.flag_value(command.args, "--port")) == ("127.0.0.1", "18000")
    assert command.env["POD_NAME"] == "specfleet-gateway-local-0"
    assert "--api-key-secret" not in command.args                       # no key files: an open local door
    locked = mc.gateway_command(mc.Local(api_keys=True))
    declared = container(mc.GATEWAY)["args"]
    assert mc.flag_value(locked.args, "--api-key-secret") == mc.flag_value(declared, "--api-key-secret")


def test_new_args_and_downward_api_env_in_a_manifest_reach_the_command_as_declared():
    doc = yaml.safe_load((ROOT / "manifests" / mc.OPERATOR).read_text())
    c = doc["spec"]["template"]["spec"]["containers"][0]
    c["args"] = ["operator", "run", "--all-namespaces", "--leader-elect", "--lease-duration=20"]
    c["env"] = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "EXTRA", "value": "1"}]
    command = mc.local_command("operator", mc.read_workload(yaml.safe_dump(doc)), LOCAL)
    assert command.args == ("operator", "run", "--all-namespaces", "--leader-elect", "--lease-duration=20")
    assert command.env == {"POD_NAME": "specfleet-operator-local-0", "POD_NAMESPACE": "specfleet-system",
                           "EXTRA": "1"}


def test_a_downward_api_field_up_cannot_give_is_refused_not_left_out():
    doc = yaml.safe_load((ROOT / "manifests" / mc.GATEWAY).read_text())
    doc["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}]
    with pytest.raises(mc.ManifestError, match="metadata.uid"):
        mc.local_command("gateway", mc.read_workload(yaml.safe_dump(doc)), LOCAL)


def test_a_flag_given_with_equals_is_substituted_in_place():
    workload = mc.Workload("gw", "ns", "sa", ("gateway", "run", "--port=8000", "--max-held", "3"), (), ())
    assert mc.local_command("gateway", workload, LOCAL).args == (
        "gateway", "run", "--port", "18000", "--max-held", "3", "--host", "127.0.0.1")


def test_the_rbac_up_applies_is_what_kubectl_kustomize_builds():
    built = subprocess.run([str(BIN / "kubectl"), "kustomize", str(ROOT / "manifests")], capture_output=True,
                           text=True, timeout=60, check=True).stdout
    expected = service_accounts.rbac_objects([d for d in yaml.safe_load_all(built) if d])
    ours = service_accounts.rbac_objects()
    key = lambda o: (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])  # noqa: E731
    assert sorted(map(key, ours)) == sorted(map(key, expected))
    assert sorted(ours, key=key) == sorted(expected, key=key)
    kinds = {o["kind"] for o in ours}
    assert {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"} <= kinds


def test_a_kustomization_field_the_reader_does_not_follow_is_refused(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources: [a.yaml]\nnamespace: other\n")
    with pytest.raises(service_accounts.RbacError, match="namespace"):
        service_accounts.kustomize(tmp_path)


def test_each_component_runs_as_the_service_account_its_deployment_names():
    for relative in (mc.OPERATOR, mc.GATEWAY):
        doc = yaml.safe_load((ROOT / "manifests" / relative).read_text())
        workload = mc.workload(relative)
        assert (workload.namespace, workload.service_account) == (
            doc["metadata"]["namespace"], doc["spec"]["template"]["spec"]["serviceAccountName"])
