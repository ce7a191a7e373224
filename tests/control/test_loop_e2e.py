"""Closed loop through the API emulator: the real operator (`specfleet operator run`, control interval
1 s) scrapes stand-in engine pods (HTTP `/metrics` in the engine's exposition format, `/admin/speculation`
recording calls) named by SPECFLEET_POD_ENDPOINTS_FILE, since no kubelet runs pods in the emulator.

Load raised -> the Deployment scales up; a batch-heavy phase -> speculation off on every pod with the
Secret's bearer token; status and Events say why.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

pytest.importorskip("specfleet.cluster.apiserver", reason="the API emulator is not available")
from specfleet.cluster.apiserver import running_apiserver  # noqa: E402

from specfleet.operator import api  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NS = "ctl"
TTFT_LE = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0)
ITL_LE = (0.05, 0.1, 0.2, 0.5, 1.0)


class FakeEngine:
    """Cumulative engine metrics advancing at set rates; records admin calls."""

    def __init__(self):
        self.lock = threading.Lock()
        self.t = time.monotonic()
        self.rps, self.ttft, self.itl, self.batch, self.waiting = 0.5, 0.3, 0.05, 2.0, 0.0
        self.acceptance, self.enabled, self.k = 0.7, True, 4
        self.c = {"first": 0.0, "ttft_sum": 0.0, "ttft": [0.0] * len(TTFT_LE), "itl": [0.0] * len(ITL_LE),
                  "tokens": 0.0, "steps": 0.0, "seqs": 0.0, "drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0,
                  "cf_draft": 0.0, "cf_accepted": 0.0}
        self.admin_calls: list[tuple[dict, str]] = []

    def set(self, **kw):
        with self.lock:
            self._advance()
            for k, v in kw.items():
                setattr(self, k, v)

    def _advance(self):
        now = time.monotonic()
        dt, self.t = now - self.t, now
        c, n = self.c, self.rps * dt
        c["first"] += n
        c["ttft_sum"] += n * self.ttft
        for i, le in enumerate(TTFT_LE):
            c["ttft"][i] += n if self.ttft <= le else 0
        for i, le in enumerate(ITL_LE):
            c["itl"][i] += n * 50 if self.itl <= le else 0
        c["tokens"] += n * 50
        steps = dt / 0.05
        c["steps"] += steps
        c["seqs"] += steps * self.batch
        drafted = steps * self.batch * self.k
        key = ("draft_tokens", "accepted") if self.enabled else ("cf_draft", "cf_accepted")
        c[key[0]] += drafted
        c[key[1]] += drafted * self.acceptance
        if self.enabled:
            c["drafts"] += steps * self.batch

    def exposition(self) -> str:
        with self.lock:
            self._advance()
            c, m = self.c, '{model_name="chat"}'
            lines = [f"vllm:num_requests_running{m} {self.batch}", f"vllm:num_requests_waiting{m} {self.waiting}",
                     f"vllm:kv_cache_usage_perc{m} 0.2", "# TYPE vllm:generation_tokens_total counter",
                     f"vllm:generation_tokens_total{m} {c['tokens']}",
                     "# TYPE vllm:spec_decode_num_drafts_total counter",
                     f"vllm:spec_decode_num_drafts_total{m} {c['drafts']}",
                     "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
                     f"vllm:spec_decode_num_draft_tokens_total{m} {c['draft_tokens']}",
                     "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
                     f"vllm:spec_decode_num_accepted_tokens_total{m} {c['accepted']}",
                     "# TYPE specfleet:counterfactual_draft_tokens_total counter",
                     f"specfleet:counterfactual_draft_tokens_total{m} {c['cf_draft']}",
                     "# TYPE specfleet:counterfactual_accepted_tokens_total counter",
                     f"specfleet:counterfactual_accepted_tokens_total{m} {c['cf_accepted']}",
                     f"specfleet:speculation_enabled{m} {float(self.enabled)}",
                     f"specfleet:num_speculative_tokens{m} {self.k}"]
            lines += _histogram("vllm:time_to_first_token_seconds", TTFT_LE, c["ttft"], c["first"], c["ttft_sum"])
            lines += _histogram("vllm:inter_token_latency_seconds", ITL_LE, c["itl"], c["first"] * 50,
                                c["first"] * 50 * self.itl)
            lines += _histogram("specfleet:batch_size", (), [], c["steps"], c["seqs"])
            return "\n".join(lines) + "\n"


def _histogram(name, bounds, counts, total, total_sum) -> list[str]:
    out = [f"# TYPE {name} histogram"]
    out += [f'{name}_bucket{{le="{le}",model_name="chat"}} {n}' for le, n in zip(bounds, counts)]
    out += [f'{name}_bucket{{le="+Inf",model_name="chat"}} {total}', f'{name}_sum{{model_name="chat"}} {total_sum}',
            f'{name}_count{{model_name="chat"}} {total}']
    return out


def serve(engine: FakeEngine) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            body = engine.exposition().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            data = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            engine.admin_calls.append((data, self.headers.get("Authorization", "")))
            engine.set(enabled=data["enabled"], k=data["num_speculative_tokens"])
            body = json.dumps({"enabled": data["enabled"]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def wait_for(probe, timeout=40.0, every=0.3):
    deadline, value = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            value = probe()
        except Exception as exc:  # noqa: BLE001
            value = exc
        if value and not isinstance(value, Exception):
            return value
        time.sleep(every)
    raise AssertionError(f"timed out; last value: {value!r}")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    from kubernetes import client, config

    tmp = tmp_path_factory.mktemp("ctl")
    engines = [FakeEngine(), FakeEngine()]
    servers = [serve(e) for e in engines]
    endpoints = tmp / "endpoints.json"
    endpoints.write_text(json.dumps({f"{NS}/chat": {f"pod-{i}": f"http://127.0.0.1:{s.server_address[1]}"
                                                    for i, s in enumerate(servers)}}))
    with running_apiserver(tmp / "kubeconfig", port=0) as server:
        env = {**os.environ, "KUBECONFIG": str(server.kubeconfig), "SPECFLEET_CONTROL_INTERVAL": "1",
               "SPECFLEET_SPECULATION_DWELL": "3",
               "SPECFLEET_POD_ENDPOINTS_FILE": str(endpoints)}
        kubectl = lambda *a, stdin=None: subprocess.run([str(BIN / "kubectl"), *a], input=stdin, text=True,  # noqa
                                                        capture_output=True, env=env, timeout=30, check=True)
        kubectl("apply", "-f", str(ROOT / "crds/inferenceservice.yaml"))
        kubectl("apply", "-f", "-", stdin=yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace",
                                                          "metadata": {"name": NS}}))
        wait_for(lambda: subprocess.run([str(BIN / "kubectl"), "get", "infsvc", "-n", NS], env=env,
                                        capture_output=True).returncode == 0)
        log = (tmp / "operator.log").open("wb")
        proc = subprocess.Popen([str(BIN / "specfleet"), "operator", "run", "--namespace", NS], env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        doc = yaml.safe_load((ROOT / "manifests/examples/smollm2-cpu.yaml").read_text())
        doc["metadata"] = {"name": "chat", "namespace": NS}
        doc["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 4, "scaleUpStabilizationSeconds": 0,
                                      "scaleDownStabilizationSeconds": 600}
        kubectl("apply", "-f", "-", stdin=yaml.safe_dump(doc))
        api_client = config.new_client_from_config(str(server.kubeconfig))
        try:
            yield engines, client.AppsV1Api(api_client), client.CoreV1Api(api_client), \
                client.CustomObjectsApi(api_client)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
            print((tmp / "operator.log").read_text()[-3000:])
            for s in servers:
                s.shutdown()


def service(custom) -> dict:
    return custom.get_namespaced_custom_object(api.GROUP, api.VERSION, NS, api.PLURAL, "chat")


def events(core, reason: str) -> list[dict]:
    items = core.list_namespaced_event(NS, _preload_content=False).json()["items"]
    return [e for e in items if e.get("reason") == reason]


def test_raised_load_scales_the_deployment_up_and_says_why(fleet):
    engines, apps, core, custom = fleet
    start = wait_for(lambda: apps.read_namespaced_deployment("chat", NS).spec.replicas)
    wait_for(lambda: service(custom)["status"].get("observed", {}).get("requestsPerSecond") is not None)
    for e in engines:
        e.set(rps=40.0, ttft=4.0, waiting=30.0, batch=3.0)
        e.set(waiting=60.0)
    scaled = wait_for(lambda: (n := apps.read_namespaced_deployment("chat", NS).spec.replicas) > start and n)
    assert scaled <= 4
    svc = wait_for(lambda: (s := service(custom))["status"].get("lastDecisions") and s)
    decision = next(d for d in svc["status"]["lastDecisions"] if d["kind"] == "scale")
    assert int(decision["to"]) > int(decision["from"]) and decision["reason"] in ("SLOViolation", "QueueGrowing",
                                                                                    "LoadJump", "LoadIncrease")
    slo = wait_for(lambda: (c := next(c for c in service(custom)["status"]["conditions"] if c["type"] == "SLOMet"))
                   ["status"] == "False" and c)
    assert slo["reason"] == "Missed" and "TTFT p99" in slo["message"], slo
    assert any(e["message"].startswith(f"{start} -> ") for e in wait_for(lambda: events(core, "ScaleUp")))
    assert svc["spec"].get("replicas") is None                       # the CR spec was never written


def test_a_batch_heavy_phase_turns_speculation_off_on_every_pod(fleet):
    engines, apps, core, custom = fleet
    for e in engines:
        e.set(rps=2.0, ttft=0.3, waiting=0.0, batch=400.0, acceptance=0.7)
    assert wait_for(lambda: all(e.admin_calls and e.admin_calls[-1][0]["enabled"] is False for e in engines))
    secret = core.read_namespaced_secret("chat-admin", NS)
    token = (secret.string_data or {}).get("token") or __import__("base64").b64decode(secret.data["token"]).decode()
    assert all(e.admin_calls[-1][1] == f"Bearer {token}" for e in engines)
    svc = wait_for(lambda: (s := service(custom)) and any(
        c["type"] == "SpeculationActive" and c["status"] == "False" for c in s["status"]["conditions"]) and s)
    cond = next(c for c in svc["status"]["conditions"] if c["type"] == "SpeculationActive")
    assert cond["reason"] == "BatchAboveThreshold" and "batch" in cond["message"]
    assert any(d["kind"] == "speculation" and d["to"] == "off" for d in svc["status"]["lastDecisions"])
    assert wait_for(lambda: events(core, "SpeculationOff"))
