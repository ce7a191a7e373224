"""The closed loop with live engines: `specfleet up` (tiny random Llama on CPU) with a 1 s control
interval; concurrent chat completions through the gateway with the `openai` client. No `kubectl scale`:
the operator's control loop scales the Deployment to a second Ready replica, switches speculation off
on every engine pod (checked on each pod's `/admin/speculation` with the token from the mounted Secret),
and says why in `status.lastDecisions`, the conditions and Events. Then Ctrl-C leaves no process.

The CR is `manifests/examples/tiny-cpu.yaml` tuned so that the tiny CPU engine misses its SLO under load:
`--max-num-seqs 4` (8 clients queue), TTFT p99 target 100 ms. The model has random weights, so the
engines' n-gram drafts are never accepted (measured and counterfactual acceptance 0): the loop turns
speculation off for `LowAcceptance` as soon as the first drafts are counted. (For a 140k-parameter model
the performance model says speculation pays up to batch ~4096, so `BatchAboveThreshold` cannot arise
from these engines; the batch path is covered with stand-in pods in tests/control/test_loop_e2e.py.)
The replica that starts after the switch comes up with the plan's setting (on) and must be re-synced.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from testkit import BIN, alive, specfleet_up, wait_for

ROOT = Path(__file__).resolve().parents[2]
TINY_CR = ROOT / "manifests/examples/tiny-cpu.yaml"
NAME, MODEL = "tiny-cpu", "tiny"
CLIENTS, LOAD_LIMIT_S = 8, 45.0

pytestmark = pytest.mark.slow


class LoopSession:
    """The running `specfleet up` of this module: gateway, kubectl, the pods' admin API."""

    def __init__(self, workdir: Path, port: int, proc: subprocess.Popen):
        self.workdir, self.port, self.proc = workdir, port, proc
        self.state = workdir / ".specfleet"
        self.base = f"http://127.0.0.1:{port}"
        self.pids: set[int] = set()
        self.t0 = time.monotonic()
        self.marks: dict[str, float] = {}

    def mark(self, what: str) -> None:
        self.marks[what] = round(time.monotonic() - self.t0, 1)

    def get(self, url: str, token: str | None = None) -> dict:
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def ready_replicas(self) -> int:
        return sum(m["specfleet"]["readyReplicas"] for m in self.get(self.base + "/v1/models")["data"]
                   if m["id"] == MODEL)

    def kubectl_json(self, *args: str) -> dict:
        proc = subprocess.run([str(BIN / "kubectl"), "--kubeconfig", str(self.state / "kubeconfig"), "--cache-dir",
                               str(self.workdir / "kcache"), *args, "-o", "json"],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    def service(self) -> dict:
        return self.kubectl_json("get", "infsvc", NAME)

    def condition(self, kind: str) -> dict:
        return next((c for c in self.service()["status"].get("conditions") or [] if c["type"] == kind), {})

    def events(self, reason: str) -> list[dict]:
        return [e for e in self.kubectl_json("get", "events")["items"] if e.get("reason") == reason]

    def endpoints(self) -> dict[str, str]:
        """{pod: http://podIP:containerPort} of the Ready pods, found as the operator finds them."""
        def url(pod: dict) -> str:
            return f"http://{pod['status']['podIP']}:{pod['spec']['containers'][0]['ports'][0]['containerPort']}"

        return {p["metadata"]["name"]: url(p) for p in self.pods()
                if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])}

    def pods(self) -> list[dict]:
        pods = self.kubectl_json("get", "pods")["items"]
        for pod in pods:
            cid = ((pod.get("status") or {}).get("containerStatuses") or [{}])[0].get("containerID", "")
            if cid.startswith("local://"):
                self.pids.add(int(cid.removeprefix("local://")))
        return pods


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, tiny_llama):
    workdir = tmp_path_factory.mktemp("loop")
    doc = yaml.safe_load(TINY_CR.read_text())
    spec = doc["spec"]
    spec["model"]["source"] = f"hostpath:{tiny_llama}"
    spec["runtime"]["extraArgs"] = ["--num-kv-blocks", "256", "--max-num-seqs", "4"]
    spec["slo"]["ttftP99Ms"] = 100
    spec["autoscaling"] = {"minReplicas": 1, "maxReplicas": 2, "scaleUpStabilizationSeconds": 0,
                           "scaleDownStabilizationSeconds": 600}
    assert spec["speculation"]["method"] == "ngram" and spec["speculation"]["mode"] == "auto"
    cr = workdir / "tiny.yaml"
    cr.write_text(yaml.safe_dump(doc))
    env = {**os.environ, "SPECFLEET_CONTROL_INTERVAL": "1", "SPECFLEET_SPECULATION_DWELL": "2",
           "SPECFLEET_NODE_CPUS": "4", "SPECFLEET_NODE_MEMORY": "64Gi"}     # two tiny engines fit on 2 cores
    with specfleet_up(workdir, cr, env) as (proc, port):
        f = LoopSession(workdir, port, proc)
        try:
            wait_for(lambda: proc.poll() is None and f.ready_replicas() >= 1, timeout=90)
            f.mark("first replica ready")
            f.operator_pid = json.loads((f.state / "fleet.json").read_text())["operatorPid"]
            yield f
        finally:
            print("timings (s since up):", f.marks)
            operator_log = f.state / "logs/operator.log"
            if operator_log.exists():
                print("\n".join(line for line in operator_log.read_text().splitlines()
                                if "HTTP Request" not in line and "succeeded" not in line)[-4000:])


def test_load_makes_the_control_loop_scale_to_a_second_ready_replica(fleet):
    from openai import OpenAI

    client = OpenAI(base_url=fleet.base + "/v1", api_key="unused", max_retries=0, timeout=30)
    done, errors, answered = threading.Event(), [], []
    deadline = time.monotonic() + LOAD_LIMIT_S

    def user(i: int) -> None:
        while not done.is_set() and time.monotonic() < deadline:
            try:
                r = client.chat.completions.create(model=MODEL, max_tokens=32, temperature=0, messages=[
                    {"role": "user", "content": f"user {i}: " + "the cat sat on the mat. " * 4}])
                answered.append(r.usage.completion_tokens)
            except Exception as exc:  # noqa: BLE001  (any failure is a lost request)
                errors.append(repr(exc))

    fleet.mark("load on")
    users = [threading.Thread(target=user, args=(i,), daemon=True) for i in range(CLIENTS)]
    for t in users:
        t.start()
    try:
        wait_for(lambda: fleet.kubectl_json("get", "deployment", NAME)["spec"]["replicas"] == 2, timeout=40)
        fleet.mark("deployment scaled to 2")
        wait_for(lambda: fleet.ready_replicas() == 2, timeout=40)
        fleet.mark("second replica ready")
    finally:
        done.set()
        for t in users:
            t.join(35)
    fleet.mark("load off")
    assert errors == [] and len(answered) >= CLIENTS, (errors[:3], len(answered))

    status = fleet.service()["status"]
    scale = [d for d in status["lastDecisions"] if d["kind"] == "scale"]
    assert scale and (scale[0]["from"], scale[0]["to"]) == ("1", "2"), status["lastDecisions"]
    assert scale[0]["reason"] in ("SLOViolation", "QueueGrowing", "LoadJump", "LoadIncrease"), scale
    assert status["desiredReplicas"] == 2
    assert fleet.service()["spec"].get("replicas") is None          # the CR spec was never written
    up = wait_for(lambda: fleet.events("ScaleUp"), timeout=10)
    assert any(e["message"].startswith(f"1 -> 2 replicas ({scale[0]['reason']})") for e in up), up
    wait_for(lambda: fleet.service()["status"].get("readyReplicas") == 2, timeout=20)
    deployment = fleet.kubectl_json("get", "deployment", NAME)
    assert deployment["status"]["readyReplicas"] == 2
    assert len(fleet.pods()) == 2


def test_speculation_is_switched_off_on_every_pod(fleet):
    endpoints = wait_for(lambda: len(e := fleet.endpoints()) == 2 and e, timeout=10)
    tokens = {p.parent.parent.parent.name: p.read_text().strip()
              for p in (fleet.state / "pods").glob("*/volumes/*/token")}

    def states() -> dict[str, bool]:
        return {pod: fleet.get(url + "/admin/speculation", tokens[f"default_{pod}"])["enabled"]
                for pod, url in endpoints.items()}

    # The second pod starts with the plan's setting (on); the loop re-syncs it within an interval.
    assert wait_for(lambda: not any((s := states()).values()) and s, timeout=15)
    fleet.mark("speculation off on every pod")
    svc = fleet.service()
    print("lastDecisions:", svc["status"]["lastDecisions"])
    spec = [d for d in svc["status"]["lastDecisions"] if d["kind"] == "speculation"]
    assert spec and (spec[0]["from"], spec[0]["to"]) == ("on", "off"), svc["status"]["lastDecisions"]
    assert spec[0]["reason"] == "LowAcceptance", spec        # random weights: no draft is ever accepted
    cond = fleet.condition("SpeculationActive")
    assert cond["status"] == "False", cond
    off = wait_for(lambda: fleet.events("SpeculationOff"), timeout=10)
    assert any("speculation off (LowAcceptance): acceptance 0.00 < minAcceptanceRate" in e["message"]
               for e in off), off
    assert svc["status"]["observed"]["acceptanceRate"] == 0


def test_the_loop_read_prometheus_and_every_dashboard_panel_shows_data(fleet):
    """The fleet's Prometheus (up runs one when it is on PATH, as CI's is) served the control loop that
    scaled and switched above, and every panel and variable of the shipped dashboard returns series."""
    from prometheus_kit import Prometheus, panel_queries, prometheus_binary, substituted, variable_queries

    prometheus_binary()                         # skips here (fails in CI) without it
    url = json.loads((fleet.state / "fleet.json").read_text())["prometheus"]
    assert url, "specfleet up did not start its Prometheus"
    # A new pod is scraped directly until Prometheus has its first samples (targets follow within seconds).
    source = wait_for(lambda: (c := fleet.condition("MetricsSource"))["reason"] == "Prometheus" and c, timeout=30)
    assert source["status"] == "True", source
    prometheus = Prometheus(url)
    values = {"namespace": "default", "service": NAME}
    empty = {}
    for where, expr in panel_queries() + variable_queries():
        query = substituted(expr, values)
        try:                    # the burn rates are rules over rules, each group evaluated every 30 s
            wait_for(lambda: prometheus.query(query)["data"]["result"], timeout=75, every=1.0)
        except AssertionError:
            empty[where] = query
    assert empty == {}, f"panels without data: {empty}"
    fleet.mark("every dashboard panel has data")


def test_ctrl_c_shuts_everything_down(fleet):
    fleet.pods()
    pids = {*fleet.pids, fleet.operator_pid}
    assert len(pids) >= 3   # the operator and two engines
    fleet.proc.send_signal(signal.SIGINT)
    assert fleet.proc.wait(40) == 0
    wait_for(lambda: not any(alive(p) for p in pids), timeout=10)
    fleet.mark("shut down")
    assert not (fleet.state / "fleet.json").exists()
    assert list((fleet.state / "pids").iterdir()) == []
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", fleet.port))
