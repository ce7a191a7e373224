"""Operator at scale: N InferenceServices against the API emulator.

Runs `specfleet cluster apiserver` and `specfleet operator run` as separate processes, creates N
InferenceServices in one burst, and measures:
  - time until every one is reconciled (status.plan written and its Deployment present),
  - per-object latency from create to reconciled, under that burst (p50/p99),
  - reconcile latency of single SLO edits on a settled fleet (edit -> observedGeneration follows),
    with the control loop running for every service (one daemon each, default 15 s interval),
  - the operator's CPU while the settled fleet is idle (the control loop's idle cost),
`--pods N` gives the first N services one Ready engine Pod each (podIP 127.0.0.1, container port of a
stub engine serving a static `/metrics`), so their loops discover, scrape and decide every interval
instead of idling; the emulator runs no kubelet, so without it no service has a pod.
  - the operator's resident memory (peak and at the end).
`--repeats N` runs the whole measurement N times (fresh processes each) and reports the median and the
spread (min..max) of every figure. Prints a table and writes benchmarks/results/operator_scale.json.

    .venv/bin/python benchmarks/operator_scale.py --count 1000
    .venv/bin/python benchmarks/operator_scale.py --count 200 --edits 50 --repeats 3
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
NS = "bench"
GROUP, VERSION, PLURAL = "specfleet.io", "v1alpha1", "inferenceservices"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def service(name: str, itl: float = 200) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceService",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"model": {"name": "smollm2-135m", "source": "builtin:smollm2-135m"},
                     "accelerator": {"type": "cpu", "count": 1},
                     "slo": {"ttftP99Ms": 2000, "itlP99Ms": itl, "maxContextTokens": 2048, "promptTokens": 256,
                             "outputTokens": 128, "requestsPerSecond": 0.5}}}


STUB_METRICS = "\n".join([
    "# TYPE vllm:num_requests_running gauge", "vllm:num_requests_running 1",
    "# TYPE vllm:num_requests_waiting gauge", "vllm:num_requests_waiting 0",
    "# TYPE vllm:request_success counter", "vllm:request_success_total 10",
    "# TYPE vllm:generation_tokens counter", "vllm:generation_tokens_total 1000", ""]).encode()


class _Metrics(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(STUB_METRICS)))
        self.end_headers()
        self.wfile.write(STUB_METRICS)

    def log_message(self, *args) -> None:
        pass


def stub_engine() -> ThreadingHTTPServer:
    """One HTTP server answering `/metrics` for every benchmark pod (a static exposition)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def engine_pod(name: str, port: int) -> tuple[dict, dict]:
    """A Pod as the operator renders it for service `name` (its labels, the container port), and a Ready
    status on 127.0.0.1 (the emulator runs no kubelet)."""
    labels = {"app.kubernetes.io/name": "specfleet-engine", "app.kubernetes.io/instance": name,
              "app.kubernetes.io/component": "inference-engine",
              "app.kubernetes.io/managed-by": "specfleet-operator", "specfleet.io/inferenceservice": name}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{name}-0", "namespace": NS, "labels": labels},
           "spec": {"containers": [{"name": "engine", "image": "stub",
                                    "ports": [{"name": "http", "containerPort": port}]}]}}
    status = {"phase": "Running", "podIP": "127.0.0.1",
              "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]}
    return pod, status


def add_pods(fleet: "Processes", names: list[str], port: int) -> float:
    """One Ready pod per service in `names`; returns the seconds it took."""
    start = time.monotonic()

    def add(name: str) -> None:
        pod, status = engine_pod(name, port)
        fleet.core.create_namespaced_pod(NS, pod, _preload_content=False)
        fleet.core.patch_namespaced_pod_status(pod["metadata"]["name"], NS, {"status": status},
                                               _preload_content=False)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(add, names))
    return round(time.monotonic() - start, 2)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] if ordered else float("nan")


class MemorySampler(threading.Thread):
    """Samples a process's RSS every 0.5 s; `peak` and `last` in MiB."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        import psutil

        self.proc, self.peak, self.last, self.stop = psutil.Process(pid), 0.0, 0.0, threading.Event()

    def cpu_percent(self, seconds: float) -> float:
        """The process's CPU use over the next `seconds` (100 = one core busy)."""
        start = self.proc.cpu_times()
        time.sleep(seconds)
        end = self.proc.cpu_times()
        return round(100 * (end.user + end.system - start.user - start.system) / seconds, 1)

    def run(self) -> None:
        while not self.stop.wait(0.5):
            try:
                self.last = self.proc.memory_info().rss / 2**20
            except Exception:  # noqa: BLE001  (the process ended)
                return
            self.peak = max(self.peak, self.last)


class Processes:
    """The emulator and operator processes, and a kubernetes client."""

    def __init__(self, workdir: Path):
        self.kubeconfig = workdir / "kubeconfig"
        self.env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        self.logs = workdir
        port = free_port()
        self.apiserver = self._spawn("apiserver", [str(BIN / "specfleet"), "cluster", "apiserver", "--port", str(port),
                                                   "--kubeconfig", str(self.kubeconfig)])
        deadline = time.monotonic() + 30
        while not self.kubeconfig.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.kubectl("apply", "-f", str(ROOT / "crds/inferenceservice.yaml"))
        self.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "Namespace",
                                                          "metadata": {"name": NS}}))
        from kubernetes import client, config

        api_client = config.new_client_from_config(str(self.kubeconfig))
        api_client.rest_client.pool_manager.connection_pool_kw["maxsize"] = 32
        self.custom, self.apps = client.CustomObjectsApi(api_client), client.AppsV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.operator = self._spawn("operator", [str(BIN / "specfleet"), "operator", "run", "--namespace", NS])

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        log = (self.logs / f"{name}.log").open("wb")
        return subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def kubectl(self, *args: str, stdin: str | None = None) -> None:
        subprocess.run([str(BIN / "kubectl"), *args], input=stdin, text=True, env=self.env, check=True,
                       capture_output=True, timeout=60)

    def close(self) -> None:
        for proc in (self.operator, self.apiserver):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()

    def statuses(self) -> dict[str, dict]:
        items = self.custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, _preload_content=False).json()
        return {i["metadata"]["name"]: i for i in items["items"]}

    def deployments(self) -> set[str]:
        items = self.apps.list_namespaced_deployment(NS, _preload_content=False).json()["items"]
        return {i["metadata"]["name"] for i in items}


def burst(fleet: Processes, count: int, timeout: float) -> dict:
    """Create `count` services at once; poll until every one has a plan and a Deployment."""
    names = [f"svc-{i:04d}" for i in range(count)]
    created: dict[str, float] = {}

    def create(name: str) -> None:
        fleet.custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, service(name))
        created[name] = time.monotonic()

    start = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create, names))
    create_s = time.monotonic() - start
    done: dict[str, float] = {}
    while len(done) < count and time.monotonic() - start < timeout:
        now, items, deployments = time.monotonic(), fleet.statuses(), fleet.deployments()
        for name, obj in items.items():
            if name not in done and (obj.get("status") or {}).get("plan") and name in deployments:
                done[name] = now
        time.sleep(0.5)
    latencies = [done[n] - created[n] for n in done]
    return {"count": count, "reconciled": len(done), "create_seconds": round(create_s, 2),
            "all_reconciled_seconds": round(max(done.values()) - start, 2) if done else None,
            "burst_latency_p50_s": round(percentile(latencies, 50), 2),
            "burst_latency_p99_s": round(percentile(latencies, 99), 2)}


def edits(fleet: Processes, count: int, edits: int) -> dict:
    """Edit one service's SLO at a time on the settled fleet; time until observedGeneration follows."""
    latencies = []
    for i in range(edits):
        name = f"svc-{(i * 37) % count:04d}"
        start = time.monotonic()
        obj = fleet.custom.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name,
                                                          {"spec": {"slo": {"itlP99Ms": 300 + i}}})
        generation = obj["metadata"]["generation"]
        while time.monotonic() - start < 30:
            got = fleet.custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
            if (got.get("status") or {}).get("observedGeneration") == generation:
                latencies.append(time.monotonic() - start)
                break
            time.sleep(0.01)
    return {"edits": edits, "edit_latency_p50_s": round(percentile(latencies, 50), 3),
            "edit_latency_p99_s": round(percentile(latencies, 99), 3), "edits_observed": len(latencies),
            "edit_latencies_s": [round(x, 3) for x in latencies]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--edits", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--pods", type=int, default=0, help="Services (the first N) that get a Ready engine pod.")
    parser.add_argument("--idle-seconds", type=float, default=30.0, help="How long to sample the idle CPU.")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/operator_scale.json")
    args = parser.parse_args()
    runs = [once(args) for _ in range(args.repeats)]
    result = summary(runs) | {"count": args.count, "edits": args.edits, "repeats": args.repeats, "pods": args.pods,
                              "cpus": os.cpu_count(), "runs": runs}
    report(result, args.out)


def once(args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        fleet = Processes(Path(tmp))
        sampler = MemorySampler(fleet.operator.pid)
        sampler.start()
        try:
            time.sleep(3)
            result = burst(fleet, args.count, args.timeout)
            if args.pods:
                engine = stub_engine()
                result["pods_seconds"] = add_pods(fleet, [f"svc-{i:04d}" for i in range(min(args.pods, args.count))],
                                                  engine.server_address[1])
                time.sleep(20)      # every loop has found its pod and scraped it at least once
            time.sleep(2)
            result |= edits(fleet, args.count, args.edits)
            result["operator_idle_cpu_percent"] = sampler.cpu_percent(args.idle_seconds)
        finally:
            sampler.stop.set()
            fleet.close()
    return result | {"operator_rss_peak_mib": round(sampler.peak, 1), "operator_rss_end_mib": round(sampler.last, 1)}


def summary(runs: list[dict]) -> dict:
    """Median and spread (min..max) of each numeric figure over the runs."""
    out = {}
    for key in runs[0]:
        values = sorted(r[key] for r in runs if isinstance(r.get(key), (int, float)))
        if not values or key == "count":
            continue
        median = values[len(values) // 2] if len(values) % 2 else (values[len(values) // 2 - 1] +
                                                                   values[len(values) // 2]) / 2
        out[key] = {"median": round(median, 3), "min": values[0], "max": values[-1]}
    return out


def report(result: dict, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"operator at scale: {result['count']} InferenceServices ({result['pods']} with a pod), "
                        f"{result['repeats']} run(s) "
                        f"(API emulator, one operator process, {result['cpus']} CPUs)")
    table.add_column("metric")
    table.add_column("median", justify="right")
    table.add_column("min .. max", justify="right")
    for key, value in result.items():
        if isinstance(value, dict):
            table.add_row(key, str(value["median"]), f"{value['min']} .. {value['max']}")
    Console().print(table)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
