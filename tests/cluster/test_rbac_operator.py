"""The real operator under its ServiceAccount and the project's own RBAC (manifests/), one verb taken away:
it must say which permission is missing, report it in status, and keep running.

Also the proof that manifests/rbac.yaml grants everything else the operator uses: the only denials the
emulator records are the `create` on services that was removed.
"""
from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from specfleet.cluster.apiserver import running_apiserver

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NS = "rbac-e2e"
OPERATOR = "system:serviceaccount:specfleet-system:specfleet-operator"
MISSING = (f'services is forbidden: User "{OPERATOR}" cannot create resource "services" in API group "" '
           f'in the namespace "{NS}"')


def without_create_on_services(docs: list[dict]) -> list[dict]:
    docs = copy.deepcopy(docs)
    for doc in docs:
        if doc["kind"] == "ClusterRole" and doc["metadata"]["name"] == "specfleet-operator":
            for rule in doc["rules"]:
                if rule.get("resources") == ["services"]:
                    rule["verbs"] = [v for v in rule["verbs"] if v != "create"]
    return docs


def wait_for(probe, timeout: float = 60.0):
    deadline, value = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out; last value: {value!r}")


def test_a_missing_verb_is_logged_reported_as_degraded_forbidden_and_the_operator_keeps_running(tmp_path):
    with running_apiserver(tmp_path / "kubeconfig") as server:
        env = {**os.environ, "KUBECONFIG": str(server.kubeconfig), "HOME": str(tmp_path)}

        def kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
            return subprocess.run([str(BIN / "kubectl"), *args], input=stdin, capture_output=True, text=True,
                                  env=env, timeout=60, check=True)

        kubectl("apply", "-f", str(ROOT / "crds/inferenceservice.yaml"))
        rbac = [d for f in ("namespace.yaml", "serviceaccount.yaml", "rbac.yaml")
                for d in yaml.safe_load_all((ROOT / "manifests" / f).read_text()) if d]
        kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(without_create_on_services(rbac)))
        kubectl("apply", "-f", "-", stdin=yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace",
                                                          "metadata": {"name": NS}}))
        token = kubectl("create", "token", "specfleet-operator", "-n", "specfleet-system").stdout.strip()
        operator_kubeconfig = server.write_kubeconfig(tmp_path / "operator" / "kubeconfig", token=token,
                                                      user="specfleet-operator")
        log = tmp_path / "operator.log"
        proc = subprocess.Popen([str(BIN / "specfleet"), "operator", "run", "-A"], stdout=log.open("wb"),
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env={**env, "KUBECONFIG": str(operator_kubeconfig)})
        try:
            service = yaml.safe_load((ROOT / "manifests/examples/smollm2-cpu.yaml").read_text())
            service["metadata"] = {"name": "svc", "namespace": NS}
            kubectl("apply", "-f", "-", stdin=yaml.safe_dump(service))

            def degraded():
                got = kubectl("get", "infsvc", "svc", "-n", NS, "-o", "yaml").stdout
                conditions = (yaml.safe_load(got).get("status") or {}).get("conditions") or []
                return next((c for c in conditions if c["type"] == "Degraded" and c["reason"] == "Forbidden"), None)

            condition = wait_for(degraded, timeout=90)
            assert condition["status"] == "True" and MISSING in condition["message"]
            assert wait_for(lambda: MISSING in log.read_text() and "missing RBAC permission" in log.read_text())
            events = json.loads(kubectl("get", "events", "-n", NS, "-o", "json").stdout)["items"]
            assert any(e["type"] == "Warning" and e["reason"] == "Forbidden" and MISSING in e["message"]
                       for e in events), events
            # what it may do, it did: the Deployment exists
            assert kubectl("get", "deployment", "svc", "-n", NS).returncode == 0
            time.sleep(3)
            assert proc.poll() is None, log.read_text()[-3000:]
            denied = {(d.user, d.verb, d.resource, d.subresource) for d in server.authorizer.denials}
            assert denied == {(OPERATOR, "create", "services", "")}, denied
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
