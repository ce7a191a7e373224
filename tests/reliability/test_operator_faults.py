"""Operator faults against the API emulator: the real `specfleet operator run -A` as a subprocess,

* SIGKILLed in the middle of reconciling a batch of InferenceServices (and a CR deleted, another edited
  while it is down): after a restart every CR has exactly one Deployment / Service / PDB / Secret /
  NetworkPolicy, the deleted CR's objects are collected, status and observedGeneration converge;
* SIGKILLed right after the control loop applied a scale-down (stand-in engines from the shared
  `fake_engine_pods` fixture behind Pod objects the operator discovers from the API): the replica count only ever steps down by
  the policy's bound, never below minReplicas, never back up, and reaches the minimum after the restart;
* facing API calls that hang past its client timeout (the emulator's /_faults hook, `delay_s`): the
  reconcile is retried with a doubling backoff, the process stays up, and it converges once the fault
  clears.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from specfleet.cluster.apiserver import running_apiserver
from specfleet.operator import api, render

sys.path.insert(0, str(Path(__file__).parents[1] / "control"))
from test_loop_e2e import stand_in_pods  # noqa: E402
from testkit import service_account_kubeconfigs  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NS = "rel"
EXAMPLE = yaml.safe_load((ROOT / "manifests/examples/smollm2-cpu.yaml").read_text())
CR_PATH = f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{NS}/{api.PLURAL}"
OWNED = {"Deployment": f"/apis/apps/v1/namespaces/{NS}/deployments",
         "Service": f"/api/v1/namespaces/{NS}/services",
         "PodDisruptionBudget": f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets",
         "Secret": f"/api/v1/namespaces/{NS}/secrets",
         "NetworkPolicy": f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies"}


class HttpCluster:
    def __init__(self, server):
        self.server, self.url = server, server.url
        self.http = httpx.Client(base_url=server.url, timeout=10)

    def items(self, path: str) -> list[dict]:
        response = self.http.get(path)
        response.raise_for_status()
        return response.json()["items"]

    def create(self, name: str, **autoscaling) -> dict:
        doc = json.loads(json.dumps(EXAMPLE))
        doc["metadata"] = {"name": name, "namespace": NS}
        if autoscaling:
            doc["spec"]["autoscaling"] = autoscaling
        response = self.http.post(CR_PATH, json=doc)
        assert response.status_code == 201, response.text
        return response.json()

    def service(self, name: str) -> dict | None:
        response = self.http.get(f"{CR_PATH}/{name}")
        return response.json() if response.status_code == 200 else None

    def replicas(self, name: str) -> int | None:
        response = self.http.get(f"{OWNED['Deployment']}/{name}")
        return response.json()["spec"]["replicas"] if response.status_code == 200 else None

    def owned(self) -> dict[str, dict[str, list[dict]]]:
        """kind -> owner name -> the operator's objects of that kind (by owner reference)."""
        out: dict[str, dict[str, list[dict]]] = {}
        for kind, path in OWNED.items():
            for obj in self.items(path):
                if (obj["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") != render.MANAGED_BY:
                    continue
                owner = next((r for r in obj["metadata"].get("ownerReferences") or [] if r["kind"] == api.KIND), None)
                out.setdefault(kind, {}).setdefault(owner and owner["name"], []).append(obj)
        return out


class KillableOperator:
    """`specfleet operator run -A` as a child process in its own session (SIGKILL takes all of it)."""

    def __init__(self, env: dict, log: Path):
        self.env, self.log, self.proc, self.starts = env, log, None, 0

    def start(self) -> None:
        self.proc = subprocess.Popen([str(BIN / "specfleet"), "operator", "run", "-A"], env=self.env,
                                     stdout=self.log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():                 # the emulator goes with the test: no graceful shutdown needed
            self.kill()


@pytest.fixture
def cluster(tmp_path):
    with running_apiserver(tmp_path / "kubeconfig", faults=True) as server:
        env = {**os.environ, "KUBECONFIG": str(server.kubeconfig)}
        subprocess.run([str(BIN / "kubectl"), "apply", "-f", str(ROOT / "crds/inferenceservice.yaml")], env=env,
                       check=True, capture_output=True, timeout=60)
        c = HttpCluster(server)
        c.http.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        c.env = env
        yield c


@pytest.fixture
def operator(cluster, tmp_path):
    """The operator under manifests/' ServiceAccount and RBAC (the tests drive the cluster as its admin)."""
    kubeconfig = service_account_kubeconfigs(cluster.server, tmp_path)["operator"]
    op = KillableOperator({**cluster.env, "KUBECONFIG": str(kubeconfig)}, tmp_path / "operator.log")
    yield op
    op.stop()
    print(op.log.read_text()[-3000:] if op.log.exists() else "(no operator log)")


def converged(cluster: HttpCluster, names: set[str]) -> bool:
    for name in names:
        svc = cluster.service(name)
        st = (svc or {}).get("status") or {}
        if not st.get("plan") or st.get("observedGeneration") != svc["metadata"]["generation"]:
            return False
    owned = cluster.owned()
    return all(set(owned.get(kind, {})) == names for kind in OWNED)


def test_killed_mid_batch_the_operator_resumes_without_duplicates_or_orphans(cluster, operator, rel):
    names = [f"svc-{i}" for i in range(10)]
    operator.start()
    for name in names:
        cluster.create(name)
    rel.wait_for(lambda: cluster.items(OWNED["Deployment"]), timeout=60, every=0.02)
    operator.kill()                                              # mid-batch: some reconciled, some not
    done = {d["metadata"]["name"] for d in cluster.items(OWNED["Deployment"])}
    print(f"killed with {len(done)} of {len(names)} Deployments created")

    # While it is down: one CR with objects is deleted, another is edited.
    gone = sorted(done)[0]
    edited = next(n for n in names if n != gone)
    assert cluster.http.delete(f"{CR_PATH}/{gone}").status_code in (200, 202)
    patched = cluster.http.patch(f"{CR_PATH}/{edited}", json={"spec": {"slo": {"itlP99Ms": 300}}},
                                 headers={"Content-Type": "application/merge-patch+json"})
    assert patched.status_code == 200 and patched.json()["metadata"]["generation"] == 2
    operator.start()

    live = set(names) - {gone}
    rel.wait_for(lambda: converged(cluster, live) and cluster.service(gone) is None, timeout=60, every=0.3)
    owned = cluster.owned()
    for kind in OWNED:                                           # exactly one of each, owned by the live CR
        assert {n: len(objs) for n, objs in owned[kind].items()} == {n: 1 for n in live}, kind
        for name, (obj,) in owned[kind].items():
            assert obj["metadata"]["ownerReferences"][0]["uid"] == cluster.service(name)["metadata"]["uid"]
    edited_status = cluster.service(edited)["status"]
    assert edited_status["observedGeneration"] == 2 and edited_status["plan"]["predicted"]["itlP99Ms"] <= 300
    assert operator.alive()


def test_killed_around_a_scale_down_it_neither_double_scales_nor_oscillates(cluster, operator, rel,
                                                                            fake_engine_pods, tmp_path):
    engines, urls = fake_engine_pods(2)
    for pod, status in stand_in_pods(NS, "chat", urls):
        assert cluster.http.post(f"/api/v1/namespaces/{NS}/pods", json=pod).status_code == 201
        patched = cluster.http.patch(f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}/status",
                                     json={"status": status}, headers={"Content-Type": "application/merge-patch+json"})
        assert patched.status_code == 200, patched.text
    operator.env.update(SPECFLEET_CONTROL_INTERVAL="1")
    span, t0 = 3, time.monotonic()
    phase = lambda what: print(f"{time.monotonic() - t0:6.1f} s  {what}")  # noqa: E731
    operator.start()
    cluster.create("chat", minReplicas=1, maxReplicas=4, scaleUpStabilizationSeconds=0,
                   scaleDownStabilizationSeconds=span)
    rel.wait_for(lambda: cluster.replicas("chat"), timeout=60)
    rel.wait_for(lambda: ((cluster.service("chat") or {}).get("status") or {}).get("observed", {})
                 .get("requestsPerSecond") is not None, timeout=40)
    phase("first window")
    for e in engines:                                            # load -> scale up to the maximum
        e.set(rps=40.0, ttft=4.0, waiting=30.0, batch=3.0)
        e.set(waiting=60.0)
    rel.wait_for(lambda: cluster.replicas("chat") == 4, timeout=40)

    phase("scaled up to 4")
    trace: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            n = cluster.replicas("chat")
            if n is not None and (not trace or trace[-1][1] != n):
                trace.append((time.monotonic(), n))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    for e in engines:                                            # load vanishes -> a scale-down is decided
        e.set(rps=0.02, ttft=0.3, itl=0.05, waiting=0.0, batch=1.0)
    rel.wait_for(lambda: trace and trace[-1][1] < 4, timeout=40, every=0.01)
    operator.kill()                                              # right after the decision was applied
    phase("scale-down applied; operator killed")
    killed_at = trace[-1]
    time.sleep(0.5)
    operator.start()
    restarted = time.monotonic()
    try:
        rel.wait_for(lambda: trace[-1][1] == 1, timeout=40)
        phase("at minReplicas")
        time.sleep(2.0)                                          # stays there: no oscillation
    finally:
        stop.set()
        sampler.join(5)
    counts = [n for _, n in trace]
    print(f"replicas after the load vanished: {counts}; killed at {killed_at[1]}")
    assert counts == sorted(counts, reverse=True), counts        # never back up
    assert all(a - b == 1 for a, b in zip(counts, counts[1:])), counts   # one bounded step at a time (4: -25% = 1)
    assert counts[-1] == 1 and min(counts) >= 1                  # converged, never under minReplicas
    after = [t for t, n in trace if t > restarted]
    assert not after or after[0] - restarted >= span, "the restarted loop must wait out its scale-down window"
    svc = rel.wait_for(lambda: (s := cluster.service("chat"))["status"].get("desiredReplicas") == 1 and s)
    decisions = [(d["from"], d["to"]) for d in svc["status"].get("lastDecisions", [])
                 if d["kind"] == "scale" and int(d["to"]) < int(d["from"])]
    print(f"scale-down decisions in status: {decisions}")
    assert len(decisions) == len(set(decisions)) and set(decisions) <= {(str(a), str(b)) for a, b in
                                                                       zip(counts, counts[1:])}, decisions
    assert operator.alive()


def test_api_timeouts_are_retried_with_backoff_without_a_crash_loop(cluster, operator, rel):
    operator.env.update(SPECFLEET_API_TIMEOUT="1")
    # The next 3 Deployment creates hang 2.5 s (past the operator's 1 s client timeout), then fail.
    rule = {"method": "POST", "path": f"/namespaces/{NS}/deployments", "status": 504, "count": 3, "delay_s": 2.5}
    assert cluster.http.post("/_faults", json=rule).status_code == 201
    operator.start()
    cluster.create("slow")
    alive = []
    rel.wait_for(lambda: alive.append(operator.alive()) or converged(cluster, {"slow"}), timeout=60, every=0.2)
    assert all(alive) and operator.alive() and operator.starts == 1          # no crash, no restart
    fired = cluster.http.get("/_faults").json()[0]
    assert fired["fired"] == 3
    gaps = [b - a for a, b in zip(fired["fired_at"], fired["fired_at"][1:])]
    print(f"create attempts {fired['fired'] + 1}, gaps between the timed-out ones: {[round(g, 2) for g in gaps]} s")
    assert gaps[0] >= 1 + 1 - 0.1 and gaps[1] >= 1 + 2 - 0.1, gaps   # client timeout + doubling backoff
    owned = cluster.owned()
    assert {kind: len(owned[kind]["slow"]) for kind in OWNED} == {kind: 1 for kind in OWNED}
    log = operator.log.read_text()
    assert log.count("failed temporarily") >= 3, log[-3000:]
