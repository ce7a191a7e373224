"""End to end: `specfleet up`'s operator and gateway run the manifests' command lines under the manifests'
ServiceAccounts, and the emulator's RBAC refuses nothing they do, and refuses what lies outside it.

The real `Fleet` (what `specfleet up` runs) serves a tiny random model, the gateway locked with an API key
(so it reads the key Secret under its Role). A story in one test: create, SLO edit, scale by a fixed
`spec.replicas`, a PlanOnly service, scale to zero, a wake through the gateway (held requests: the gateway's
annotation, the operator's scale-up), delete; then zero 403s in `server.authorizer.denials`, and the
components' own tokens refused outside the manifests' RBAC. `up` runs in this process's main thread (it
installs signal handlers); the steps run in a second thread.
"""
from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from specfleet.cluster import fleet as fleet_mod
from specfleet.cluster import manifest_commands as mc
from testkit import BIN, free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
NAME, MODEL, PLANNED = "tiny-cpu", "tiny", "tiny-planned"
KEY = "sk-rbac-e2e"
OPERATOR_SA = "system:serviceaccount:specfleet-system:specfleet-operator"
GATEWAY_SA = "system:serviceaccount:specfleet-system:specfleet-gateway"

pytestmark = pytest.mark.slow


def service(tiny_llama: str, name: str = NAME, model: str = MODEL) -> dict:
    doc = yaml.safe_load((ROOT / "manifests/examples/tiny-cpu.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["model"].update(name=model, source=f"hostpath:{tiny_llama}")
    doc["spec"].pop("speculation", None)
    doc["spec"]["autoscaling"] = {"minReplicas": 0, "maxReplicas": 2, "idleSeconds": 4}
    return doc


class Driver:
    """The running fleet as its user drives it: kubectl with the admin kubeconfig, the gateway with the key."""

    def __init__(self, workdir: Path, port: int):
        self.workdir, self.base = workdir, f"http://127.0.0.1:{port}"
        self.state = workdir / ".specfleet"

    def kubectl(self, *args: str, kubeconfig: str = "kubeconfig", stdin: str | None = None,
                check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(BIN / "kubectl"), "--kubeconfig", str(self.state / kubeconfig), "--cache-dir",
                               str(self.workdir / "kcache"), *args], input=stdin, capture_output=True, text=True,
                              timeout=30)
        assert not check or proc.returncode == 0, proc.stderr
        return proc

    def get(self, kind: str, name: str) -> dict | None:
        proc = self.kubectl("get", kind, name, "-o", "json", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def patch(self, name: str, patch: dict) -> None:
        self.kubectl("patch", "infsvc", name, "--type", "merge", "-p", json.dumps(patch))

    def reconciled(self, name: str) -> dict | None:
        svc = self.get("infsvc", name) or {}
        st = svc.get("status") or {}
        return svc if st.get("observedGeneration") == svc.get("metadata", {}).get("generation") else None

    def ready(self) -> int:
        return httpx.get(self.base + "/health", timeout=5).json().get("readyReplicas", {}).get(MODEL, 0)

    def chat(self, timeout: float = 120) -> httpx.Response:
        return httpx.post(self.base + "/v1/chat/completions", timeout=timeout, headers={"Authorization": f"Bearer {KEY}"},
                          json={"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})


def story(d: Driver, tiny_llama: str, seen: dict) -> None:
    # create (applied by `up` from the CR file): one ready replica behind the locked gateway
    wait_for(lambda: d.ready() == 1, timeout=120, every=0.5)
    assert d.chat().status_code == 200
    # SLO edit: the operator re-plans and rolls the Deployment
    generation = d.get("infsvc", NAME)["metadata"]["generation"]
    d.patch(NAME, {"spec": {"slo": {"itlP99Ms": 300}}})
    wait_for(lambda: (s := d.reconciled(NAME)) and s["metadata"]["generation"] > generation, timeout=60, every=0.5)
    # scale: a fixed spec.replicas
    d.patch(NAME, {"spec": {"replicas": 2}})
    wait_for(lambda: d.get("deployment", NAME)["spec"]["replicas"] == 2, timeout=60, every=0.5)
    wait_for(lambda: d.ready() == 2, timeout=120, every=0.5)
    # plan-only: planned actions reported, nothing created
    planned = service(tiny_llama, PLANNED, "tiny-planned")
    planned["spec"]["mode"] = "PlanOnly"
    d.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(planned))
    wait_for(lambda: ((d.get("infsvc", PLANNED) or {}).get("status") or {}).get("plannedActions"), timeout=60)
    assert d.get("deployment", PLANNED) is None
    # scale to zero: back to the autoscaler (minReplicas 0, idle 4 s)
    d.patch(NAME, {"spec": {"replicas": None}})
    wait_for(lambda: d.get("deployment", NAME)["spec"]["replicas"] == 0 and d.ready() == 0, timeout=120, every=0.5)
    # wake through the gateway: the request is held, the gateway annotates, the operator scales up
    answer = d.chat(timeout=150)
    assert answer.status_code == 200, answer.text
    assert wait_for(lambda: (d.get("infsvc", NAME)["status"]).get("coldStart"), timeout=30)
    # delete: the owned objects go with it
    d.kubectl("delete", "infsvc", NAME, PLANNED, "--wait=false")
    wait_for(lambda: d.get("infsvc", NAME) is None and d.get("deployment", NAME) is None, timeout=60, every=0.5)
    seen["story"] = True


def outside_rbac(d: Driver, seen: dict) -> None:
    """The components' own tokens, asking for what the manifests do not grant."""
    seen["operator secrets"] = d.kubectl("get", "secrets", "-A", kubeconfig="operator.kubeconfig", check=False)
    seen["operator delete"] = d.kubectl("delete", "deployment", "anything", "-n", "default",
                                        kubeconfig="operator.kubeconfig", check=False)
    seen["gateway secret"] = d.kubectl("get", "secret", "other", "-n", "specfleet-system",
                                       kubeconfig="gateway.kubeconfig", check=False)


def test_operator_and_gateway_complete_the_lifecycle_under_the_manifests_rbac(tmp_path, tiny_llama, monkeypatch):
    for key, value in {"SPECFLEET_CONTROL_INTERVAL": "1", "SPECFLEET_DETECT_INTERVAL": "0"}.items():
        monkeypatch.setenv(key, value)                                  # the operator's control loop, fast
    monkeypatch.chdir(tmp_path)
    cr, keys = tmp_path / "tiny.yaml", tmp_path / "keys"
    cr.write_text(yaml.safe_dump(service(tiny_llama)))
    keys.write_text(f"{KEY}\n")
    port = free_port()
    config = fleet_mod.FleetConfig(files=[cr], port=port, state_dir=tmp_path / ".specfleet", live=False,
                                   api_key_files=[keys], node_cpus=8, node_memory="64Gi")
    lock, docs = fleet_mod.preflight(config)
    up = fleet_mod.Fleet(config, docs)
    driver, seen, errors = Driver(tmp_path, port), {}, []

    def steps() -> None:
        try:
            wait_for(lambda: (tmp_path / ".specfleet/fleet.json").exists(), timeout=60)
            seen["info"] = json.loads((tmp_path / ".specfleet/fleet.json").read_text())
            seen["environ"] = {c: Path(f"/proc/{seen['info'][f'{c}Pid']}/environ").read_bytes()
                               for c in ("operator", "gateway")}
            seen["cmdline"] = {c: Path(f"/proc/{seen['info'][f'{c}Pid']}/cmdline").read_bytes().split(b"\0")[:-1]
                               for c in ("operator", "gateway")}
            story(driver, tiny_llama, seen)
            seen["denials during the story"] = list(up.api.authorizer.denials)
            outside_rbac(driver, seen)
        except BaseException as exc:  # noqa: BLE001  (reported by the test thread)
            errors.append(exc)
        finally:
            up.request_stop_threadsafe("test done")

    worker = threading.Thread(target=steps)
    worker.start()
    started = time.monotonic()
    with lock:
        code = up.run()
    worker.join(30)
    print(f"fleet ran {time.monotonic() - started:.0f} s")
    for log in ("operator.log", "gateway.log"):
        print(f"--- {log}\n" + (tmp_path / ".specfleet/logs" / log).read_text(errors="replace")[-2500:])
    if errors:
        raise errors[0]
    assert code == 0 and seen.get("story")

    # the command lines are the manifests', under the manifests' ServiceAccounts
    assert seen["info"]["serviceAccounts"] == {"operator": OPERATOR_SA, "gateway": GATEWAY_SA}
    for component, relative in (("operator", mc.OPERATOR), ("gateway", mc.GATEWAY)):
        kubeconfig = f"KUBECONFIG={tmp_path / '.specfleet' / f'{component}.kubeconfig'}".encode()
        assert kubeconfig in seen["environ"][component].split(b"\0")
        args = [a.decode() for a in seen["cmdline"][component]]
        declared = mc.workload(relative).args
        ran = args[args.index(declared[0], 1):]                      # after `python .../specfleet`
        assert mc.kept_args(component, ran) == mc.kept_args(component, declared)
    gateway_args = [a.decode() for a in seen["cmdline"]["gateway"]]
    assert mc.flag_value(gateway_args, "--api-key-secret") == mc.flag_value(mc.workload(mc.GATEWAY).args,
                                                                           "--api-key-secret")

    # zero 403s for everything the story did; then the components' tokens refused outside their RBAC
    assert seen["denials during the story"] == []
    for what in ("operator secrets", "operator delete", "gateway secret"):
        assert seen[what].returncode != 0 and "Forbidden" in seen[what].stderr, (what, seen[what].stderr)
    denied = {(d.user, d.verb, d.resource) for d in up.api.authorizer.denials}
    assert denied == {(OPERATOR_SA, "list", "secrets"), (OPERATOR_SA, "delete", "deployments"),
                      (GATEWAY_SA, "get", "secrets")}
    assert not (tmp_path / ".specfleet/fleet.json").exists()
    assert os.listdir(tmp_path / ".specfleet/pids") == []
