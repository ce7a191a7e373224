"""End to end: `specfleet up` with a tiny random model, as a user runs it (a subprocess), driven with the
official `openai` client and `kubectl`. The tests share one fleet and run in file order: serve, read
status, refuse a second `up`, scale to two replicas (each pod on its own address, as on a cluster), kill
an engine under load, shut down. The node offers 4 CPUs and 64 GiB whatever this machine has, so that two
tiny engines fit on a 2-core CI machine (the scheduler itself is tested in test_node_agent.py).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import urllib.request
from pathlib import Path

import pytest
import yaml

from testkit import BIN, alive, free_port, specfleet_up, wait_for

ROOT = Path(__file__).resolve().parents[2]
TINY_CR = ROOT / "manifests/examples/tiny-cpu.yaml"
NAME, MODEL = "tiny-cpu", "tiny"
NODE = {"SPECFLEET_NODE_CPUS": "4", "SPECFLEET_NODE_MEMORY": "64Gi"}

pytestmark = pytest.mark.slow


class UpSession:
    """The running `specfleet up` of this module, seen as a user sees it (gateway, kubectl)."""

    def __init__(self, workdir: Path, port: int, proc: subprocess.Popen):
        self.workdir, self.port, self.proc = workdir, port, proc
        self.base = f"http://127.0.0.1:{port}"
        self.kubeconfig = workdir / ".specfleet/kubeconfig"
        self.pids: set[int] = set()

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.base + path, timeout=10) as response:
            return json.loads(response.read())

    def ready_replicas(self) -> int:
        return sum(m["specfleet"]["readyReplicas"] for m in self.get("/v1/models")["data"] if m["id"] == MODEL)

    def kubectl(self, *args: str) -> str:
        proc = subprocess.run([str(BIN / "kubectl"), "--kubeconfig", str(self.kubeconfig), "--cache-dir",
                               str(self.workdir / "kcache"), *args], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def pods(self) -> list[dict]:
        pods = json.loads(self.kubectl("get", "pods", "-o", "json"))["items"]
        for pod in pods:
            cid = ((pod.get("status") or {}).get("containerStatuses") or [{}])[0].get("containerID", "")
            if cid.startswith("local://"):
                self.pids.add(int(cid.removeprefix("local://")))
        return pods

    def client(self):
        from openai import OpenAI

        return OpenAI(base_url=self.base + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, tiny_llama):
    workdir = tmp_path_factory.mktemp("up")
    doc = yaml.safe_load(TINY_CR.read_text())
    doc["spec"]["model"]["source"] = f"hostpath:{tiny_llama}"
    cr = workdir / "tiny.yaml"
    cr.write_text(yaml.safe_dump(doc))
    with specfleet_up(workdir, cr, {**os.environ, **NODE}) as (proc, port):
        f = UpSession(workdir, port, proc)
        wait_for(lambda: proc.poll() is None and f.ready_replicas() >= 1, timeout=90)
        info = json.loads((workdir / ".specfleet/fleet.json").read_text())
        f.operator_pid, f.gateway_pid = info["operatorPid"], info["gatewayPid"]
        yield f


def test_chat_completions_flow_through_the_gateway(fleet):
    client = fleet.client()
    models = [m.id for m in client.models.list().data]
    assert models == [MODEL]
    answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello"}],
                                            max_tokens=8, temperature=0)
    assert answer.usage.completion_tokens == 8 and answer.choices[0].finish_reason == "length"
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello"}],
                                            max_tokens=8, temperature=0, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == answer.choices[0].message.content


def test_kubectl_shows_the_inferenceservice_with_printer_columns(fleet):
    def table() -> list[list[str]]:
        return [line.split() for line in fleet.kubectl("get", "infsvc").splitlines()]
    # The gateway sees a pod Ready from the pod itself; the status follows the Deployment's next report.
    header, row = wait_for(lambda: (rows := table())[1][3] == "True" and rows, timeout=30)
    assert header[:5] == ["NAME", "MODE", "ENGINE", "READY", "REPLICAS"] and "SLO" in header
    status = json.loads(fleet.kubectl("get", "infsvc", NAME, "-o", "json"))["status"]
    assert row[:5] == [NAME, "Serving", "specfleet", "True", "1"]
    assert status["plan"]["speculation"]["method"] == "ngram" and status["readyReplicas"] == 1


def test_a_second_up_in_the_same_folder_is_refused(fleet):
    proc = subprocess.run([str(BIN / "specfleet"), "up", "--port", str(free_port())], cwd=fleet.workdir,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "already running" in proc.stderr and proc.stdout == ""
    assert fleet.ready_replicas() >= 1


def test_scaling_the_inferenceservice_brings_a_second_ready_replica(fleet):
    fleet.kubectl("scale", "infsvc", NAME, "--replicas", "2")
    wait_for(lambda: fleet.ready_replicas() == 2, timeout=60)
    pods = fleet.pods()
    assert len(pods) == 2
    ips = {p["status"]["podIP"] for p in pods}
    assert len(ips) == 2 and "127.0.0.1" not in ips            # each pod its own address, not the node's
    assert {p["spec"]["containers"][0]["ports"][0]["containerPort"] for p in pods} == {8000}
    for ip in ips:                                               # podIP:containerPort, as the operator reads it
        with urllib.request.urlopen(f"http://{ip}:8000/health", timeout=10) as response:
            assert response.status == 200
    def deployment_status() -> dict:          # the controller writes it on its next pass after the pods turn Ready
        return json.loads(fleet.kubectl("get", "deployment", NAME, "-o", "json"))["status"]
    wait_for(lambda: deployment_status().get("readyReplicas") == 2, timeout=10)
    assert deployment_status()["updatedReplicas"] == 2
    wait_for(lambda: json.loads(fleet.kubectl("get", "infsvc", NAME, "-o", "json"))["status"]
             .get("readyReplicas") == 2, timeout=20)


def test_a_killed_engine_is_restarted_and_no_request_is_lost(fleet):
    client = fleet.client()
    done, errors, answered = threading.Event(), [], []

    def user(i: int) -> None:
        while not done.is_set():
            try:
                r = client.chat.completions.create(model=MODEL, max_tokens=24, temperature=0,
                                                   messages=[{"role": "user", "content": f"user {i} says hi"}])
                answered.append(r.usage.completion_tokens)
            except Exception as exc:  # noqa: BLE001  (any failure is a lost request)
                errors.append(repr(exc))

    users = [threading.Thread(target=user, args=(i,)) for i in range(4)]
    for t in users:
        t.start()
    try:
        wait_for(lambda: len(answered) >= 4, timeout=30)
        victim = fleet.pods()[0]
        pid = int(victim["status"]["containerStatuses"][0]["containerID"].removeprefix("local://"))
        os.kill(pid, signal.SIGKILL)
        killed_at = len(answered)

        def restarted():
            pod = next(p for p in fleet.pods() if p["metadata"]["name"] == victim["metadata"]["name"])
            status = pod["status"]["containerStatuses"][0]
            return status["restartCount"] >= 1 and status["ready"] and fleet.ready_replicas() == 2

        wait_for(restarted, timeout=60)
        wait_for(lambda: len(answered) >= killed_at + 8, timeout=30)
    finally:
        done.set()
        for t in users:
            t.join(60)
    assert errors == []
    assert len(answered) >= 12 and set(answered) == {24}
    assert not alive(pid)


def test_ctrl_c_shuts_everything_down(fleet):
    fleet.pods()
    pids = {*fleet.pids, fleet.operator_pid, fleet.gateway_pid}
    assert len(pids) >= 5   # the operator, the gateway, two engines, one of them restarted
    fleet.proc.send_signal(signal.SIGINT)
    assert fleet.proc.wait(40) == 0
    wait_for(lambda: not any(alive(p) for p in pids), timeout=10)
    assert not (fleet.workdir / ".specfleet/fleet.json").exists()
    assert list((fleet.workdir / ".specfleet/pids").iterdir()) == []
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", fleet.port))   # nothing listens on the gateway port any more
    down = subprocess.run([str(BIN / "specfleet"), "down"], cwd=fleet.workdir, capture_output=True, text=True)
    assert down.returncode == 0 and "not running" in down.stdout
