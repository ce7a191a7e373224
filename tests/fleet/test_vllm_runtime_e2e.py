"""End to end, opt-in: a `runtime: vllm` InferenceService served by the real vLLM (its CPU backend) under
`specfleet up`, as a user runs it. The operator renders `vllm serve`, the node agent runs it on the vLLM
venv that `$SPECFLEET_VLLM_BIN` names (else `vllm` on PATH; `cluster/node_agent/vllm_peer.py`), the gateway
routes a chat completion to it by model name (the official `openai` client), and the operator's control
loop reads vLLM's `vllm:` metrics into the service's status. Skipped where this machine has no vLLM: it
is never a dependency of specfleet (docs/fleet.md, "vLLM runtime", has the install and a recorded run).
The tests share one fleet and run in file order; the last one stops it and checks no vLLM process is left.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from specfleet.cluster.node_agent import vllm_peer
from testkit import BIN, alive, specfleet_up, wait_for

ROOT = Path(__file__).resolve().parents[2]
NAME, MODEL = "smollm2-vllm", "smollm2-135m"
VLLM = vllm_peer.find_vllm()

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(VLLM is None, reason=f"no vLLM on this machine: set {vllm_peer.BIN_ENV} to the "
                                                      "`vllm` script of a vLLM venv (docs/fleet.md, vLLM runtime)")]


def service() -> dict:
    """The shipped SmolLM2 CPU example on the vllm runtime: one replica (two vLLMs do not fit two cores),
    eager mode (torch.compile would add a minute to the start)."""
    doc = yaml.safe_load((ROOT / "manifests/examples/smollm2-cpu.yaml").read_text())
    doc["metadata"]["name"] = NAME
    doc["spec"]["runtime"] = {"engine": "vllm", "extraArgs": ["--enforce-eager"]}
    doc["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 1}
    return doc


def process_group(pgid: int) -> set[int]:
    """Every live process of a process group (a pod's container runs in a session of its own)."""
    members = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.add(int(stat.parent.name))
    return members


class VllmFleet:
    def __init__(self, workdir: Path, port: int, proc: subprocess.Popen):
        self.workdir, self.port, self.proc = workdir, port, proc
        self.kubeconfig = workdir / ".specfleet/kubeconfig"
        self.groups: set[int] = set()

    def kubectl(self, *args: str) -> str:
        done = subprocess.run([str(BIN / "kubectl"), "--kubeconfig", str(self.kubeconfig), "--cache-dir",
                               str(self.workdir / "kcache"), *args], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def pods(self) -> list[dict]:
        pods = json.loads(self.kubectl("get", "pods", "-o", "json"))["items"]
        for pod in pods:
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                if status.get("containerID", "").startswith("local://"):
                    self.groups.add(int(status["containerID"].removeprefix("local://")))
        return pods

    def status(self) -> dict:
        return json.loads(self.kubectl("get", "infsvc", NAME, "-o", "json")).get("status") or {}

    def client(self):
        from openai import OpenAI

        return OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="unused", max_retries=0, timeout=120)

    def ready(self) -> bool:
        assert self.proc.poll() is None, f"specfleet up exited with {self.proc.returncode}"
        models = self.client().models.list().data
        return any(m.id == MODEL and m.model_extra["specfleet"]["readyReplicas"] >= 1 for m in models)

    def kill_leftovers(self) -> None:
        for pgid in self.groups:
            for pid in process_group(pgid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("vllm")
    cr = workdir / "smollm2-vllm.yaml"
    cr.write_text(yaml.safe_dump(service()))
    env = {**os.environ, vllm_peer.BIN_ENV: str(VLLM)}
    started, f = time.monotonic(), None
    try:
        with specfleet_up(workdir, cr, env) as (proc, port):
            f = VllmFleet(workdir, port, proc)
            try:
                wait_for(f.ready, timeout=420, every=2)
                print(f"vLLM replica ready {time.monotonic() - started:.0f} s after `specfleet up`")
                yield f
            finally:
                if proc.poll() is None:
                    f.pods()            # the pods' process groups, whatever failed
                logs = sorted((workdir / ".specfleet/logs").glob("*engine.log"))
                print("".join(p.read_text()[-3000:] for p in logs))
    finally:
        if f is not None:
            f.kill_leftovers()          # nothing of vLLM outlives the test, even when `up` failed to stop it


def test_the_pod_runs_vllm_serve_with_the_rendered_flags(fleet):
    pod = fleet.pods()[0]
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["vllm", "serve"] and container["args"][0] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    pid = int(pod["status"]["containerStatuses"][0]["containerID"].removeprefix("local://"))
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    assert argv[1:3] == ["-m", vllm_peer.SERVER_MODULE] and Path(argv[0]).parent == VLLM.parent
    assert argv[argv.index("--host") + 1] == pod["status"]["podIP"]
    model = Path(argv[argv.index("--model") + 1])
    assert (model / "config.json").is_file() and (model / "tokenizer.json").is_file()
    flags = dict(zip(container["args"][1::2], container["args"][2::2]))
    for flag in ("--kv-cache-memory-bytes", "--block-size", "--max-num-seqs", "--max-num-batched-tokens"):
        assert argv[argv.index(flag) + 1] == flags[flag]


def test_a_chat_completion_flows_through_the_gateway_to_vllm(fleet):
    client = fleet.client()
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0)
    print(f"completion: {answer.choices[0].message.content!r} ({answer.usage.completion_tokens} tokens)")
    assert answer.system_fingerprint.startswith("vllm-")          # vLLM answered, not specfleet's engine
    assert answer.model == MODEL and "Paris" in answer.choices[0].message.content
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0,
                                            stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == answer.choices[0].message.content


def test_the_operator_reads_vllm_s_metrics_into_the_status(fleet):
    client, done = fleet.client(), threading.Event()

    def user() -> None:
        while not done.is_set():
            client.chat.completions.create(model=MODEL, max_tokens=16, temperature=0,
                                           messages=[{"role": "user", "content": "Name three colours."}])

    traffic = threading.Thread(target=user, daemon=True)
    traffic.start()
    try:
        observed = wait_for(lambda: (o := fleet.status().get("observed") or {}).get("ttftP99Ms") and o,
                            timeout=120, every=2)
    finally:
        done.set()
        traffic.join(120)
    print(f"status.observed: {observed}")
    assert observed["ttftP99Ms"] > 0 and observed["itlP99Ms"] > 0 and observed["requestsPerSecond"] > 0
    slo = next(c for c in fleet.status()["conditions"] if c["type"] == "SLOMet")
    assert slo["reason"] in ("Observed", "Missed") and "TTFT p99" in slo["message"]


def test_ctrl_c_stops_vllm_and_every_process_it_started(fleet):
    fleet.pods()
    members = {pid for pgid in fleet.groups for pid in process_group(pgid)}
    assert len(members) >= 3          # the API server, its engine core and its worker at least
    fleet.proc.send_signal(signal.SIGINT)
    assert fleet.proc.wait(60) == 0
    wait_for(lambda: not any(alive(p) for p in members), timeout=20)
