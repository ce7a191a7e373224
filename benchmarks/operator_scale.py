"""Operator at scale: N InferenceServices against the API emulator, engine metrics from Prometheus or the pods.

Runs `specfleet cluster apiserver` and `specfleet operator run` as separate processes (and, with
`--metrics-source prometheus`, a real Prometheus), creates N InferenceServices in one burst, and measures:
  - time until every one is reconciled (status.plan written and its Deployment present), and the
    per-object latency from create to reconciled under that burst (p50/p99);
  - reconcile latency of single SLO edits on a settled fleet (edit -> observedGeneration follows), with the
    control loop running for every service (default 15 s interval, `--control-interval`);
  - CPU (% of one core) of the operator, the emulator and Prometheus during the burst and while the settled
    fleet is idle, and their resident memory (peak and at the end): who the bottleneck is;
  - Prometheus queries the operator made per control interval while idle (its
    `specfleet_prometheus_queries_total`, read on its metrics port before and after the idle window);
  - creations kopf processed (`creations_processed`, from the operator's log): one per service unless
    some were handled twice;
  - where the services' loops got their metrics: each service's `specfleet_metrics_source` gauge, and the
    `MetricsSource` condition of a sample of services (expected True/Prometheus, or True/DirectScrape).

`--pods N` gives the first N services one Ready engine Pod each (the operator's pod labels, podIP 127.0.0.1, the
container port of one stub HTTP server answering a static `/metrics` for every pod: the series a real engine
exports, `engine_exposition`; `--stub busy` the same series moving every few seconds, as a fleet serving
steadily has them, so no refresh finds a pod's sample unmoved and the window after the edits measures a
busy fleet's cost, not an idle one's; `--stub minimal` serves the four series the tables before commit
e3864b0 measured). The emulator runs no kubelet, so without it no service has a pod and the loops idle.

`--metrics-source prometheus` (the default when `prometheus` is on PATH) starts Prometheus through
`cluster/prometheus.py`'s LocalPrometheus, with one file_sd target per pod labelled by `targets()` from the
very Pod objects created here (namespace, pod, inferenceservice, ... as the PodMonitor labels them; all
targets share the stub's address and differ by labels), scraped every 15 s as the PodMonitor says, or every
control interval when that is shorter; the operator gets `--prometheus-url`. `direct`: the operator scrapes
each pod itself.

`--repeats N` runs the whole measurement N times (fresh processes each) and reports the median and the
spread (min..max) of every figure. Prints a table and writes JSON (with command, commit, machine and date).

    .venv/bin/python benchmarks/operator_scale.py --count 300 --pods 60 --edits 10 --repeats 1
    .venv/bin/python benchmarks/operator_scale.py --count 1000 --edits 50 --repeats 3 --pods 200
    .venv/bin/python benchmarks/operator_scale.py --count 1000 --pods 200 --metrics-source direct
    .venv/bin/python benchmarks/operator_scale.py --count 5000 --pods 1000 --stub busy --repeats 3
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

from provenance import commit, machine   # benchmarks/: the script's own folder is on sys.path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
NS = "bench"
GROUP, VERSION, PLURAL = "specfleet.io", "v1alpha1", "inferenceservices"
POD_MONITOR_INTERVAL_S = 15.0          # manifests/grafana/podmonitor.yaml
DEFAULT_CONTROL_INTERVAL_S = 15.0      # the operator's default (operator/control/loop.py)
BUSY_STEP_S = 5.0                      # `--stub busy`: the series move this often, thrice per Prometheus sample
SOURCE_CHECK_SAMPLE = 10               # services whose MetricsSource condition is read
EXPECTED_REASON = {"prometheus": "Prometheus", "direct": "DirectScrape"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def names(count: int) -> list[str]:
    return [f"svc-{i:04d}" for i in range(count)]


def service(name: str, itl: float = 200) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceService",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"model": {"name": "smollm2-135m", "source": "builtin:smollm2-135m"},
                     "accelerator": {"type": "cpu", "count": 1},
                     "slo": {"ttftP99Ms": 2000, "itlP99Ms": itl, "maxContextTokens": 2048, "promptTokens": 256,
                             "outputTokens": 128, "requestsPerSecond": 0.5}}}


def engine_exposition(rounds: int = 1) -> bytes:
    """What a real engine serves (its own `ServerMetrics`: 203 series, 635 before the step time was a summary) after
    `rounds` steps at every batch-size bucket, speculating and not, and one request: Prometheus and the
    operator get as many series per pod as from an engine on a cluster (tests/control/exposition_kit.py
    serves it to the source tests too)."""
    return EngineMetrics().after(rounds)


class EngineMetrics:
    """A real engine's `ServerMetrics`, stepped a round at a time: a round is one step at every batch-size
    bucket, speculating and not, and one finished request."""

    def __init__(self):
        from specfleet.engine.server.metrics import ServerMetrics

        self.metrics, self.rounds = ServerMetrics("smollm2-135m"), 0

    def after(self, rounds: int) -> bytes:
        """The exposition once `rounds` rounds are done (never fewer than already are)."""
        from specfleet.engine.stats import StepRecord

        for _ in range(self.rounds, rounds):
            for n in (1, 2, 3, 5, 9, 17, 33, 65, 129):
                for speculating in (True, False):
                    self.metrics.observe_step(StepRecord(0.002 * n, n, 2 * n, n, 0, speculating))
            self.metrics.first_token(0.2)
            self.metrics.inter_token(0.02, 10)
            self.metrics.finished("stop", 1.0)
        self.rounds = max(self.rounds, rounds)
        return self.metrics.render()


class BusyExposition:
    """`--stub busy`: a real engine's series that move every `BUSY_STEP_S` (a round more each time), so every
    Prometheus sample of every pod differs from the one before, as a fleet's that serves steadily does.
    Rendered once per round, for all pods alike."""

    def __init__(self, clock=time.monotonic):
        self.clock, self.start, self.engine, self.lock = clock, clock(), EngineMetrics(), threading.Lock()
        self.round, self.body = 0, b""

    def __call__(self) -> bytes:
        due = 1 + int((self.clock() - self.start) / BUSY_STEP_S)
        with self.lock:
            if due != self.round:
                self.round, self.body = due, self.engine.after(due)
            return self.body


# What the stub pods served before `e3864b0` (`--stub minimal`): four series, an engine with no histograms.
MINIMAL_EXPOSITION = "\n".join([
    "# TYPE vllm:num_requests_running gauge", "vllm:num_requests_running 1",
    "# TYPE vllm:num_requests_waiting gauge", "vllm:num_requests_waiting 0",
    "# TYPE vllm:request_success counter", "vllm:request_success_total 10",
    "# TYPE vllm:generation_tokens counter", "vllm:generation_tokens_total 1000", ""]).encode()
STUB_METRICS = engine_exposition()


def series_in(exposition: bytes) -> int:
    return sum(1 for line in exposition.decode().splitlines() if line and not line.startswith("#"))


class _Metrics(BaseHTTPRequestHandler):
    exposition: Callable[[], bytes] = staticmethod(lambda: STUB_METRICS)

    def do_GET(self) -> None:  # noqa: N802
        body = self.exposition()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def stub_engine() -> ThreadingHTTPServer:
    """One HTTP server answering `/metrics` for every benchmark pod (`_Metrics.exposition`)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    server.daemon_threads = True
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


def add_pods(fleet: "Processes", services: list[str], port: int) -> list[dict]:
    """One Ready pod per service in `services`; returns the Pods (with their status) as created."""
    def add(name: str) -> dict:
        pod, status = engine_pod(name, port)
        fleet.core.create_namespaced_pod(NS, pod, _preload_content=False)
        fleet.core.patch_namespaced_pod_status(pod["metadata"]["name"], NS, {"status": status},
                                               _preload_content=False)
        return pod | {"status": status}
    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(add, services))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] if ordered else float("nan")


class ProcessSampler(threading.Thread):
    """A process's RSS every 0.5 s (`peak`, `last`, MiB) and its CPU over phases (`mark`, `cpu_percent`)."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        import psutil

        self.proc, self.peak, self.last, self.stop = psutil.Process(pid), 0.0, 0.0, threading.Event()
        self.marked = (time.monotonic(), self.cpu_seconds())

    def cpu_seconds(self) -> float:
        try:
            times = self.proc.cpu_times()
        except Exception:  # noqa: BLE001  (the process ended)
            return float("nan")
        return times.user + times.system

    def mark(self) -> None:
        self.marked = (time.monotonic(), self.cpu_seconds())

    def cpu_percent(self) -> float:
        """CPU use since the last `mark` (100 = one core busy)."""
        start, cpu = self.marked
        return round(100 * (self.cpu_seconds() - cpu) / max(time.monotonic() - start, 1e-6), 1)

    def run(self) -> None:
        while not self.stop.wait(0.5):
            try:
                self.last = self.proc.memory_info().rss / 2**20
            except Exception:  # noqa: BLE001  (the process ended)
                return
            self.peak = max(self.peak, self.last)


class Profiler:
    """`py-spy record` (sampling, out of process) of the emulator and the operator over a phase; each
    writes a collapsed-stack file, and `hot_spots` lists where the samples fell."""

    def __init__(self, folder: Path, pids: dict[str, int], label: str):
        import shutil

        binary = shutil.which("py-spy") or str(BIN / "py-spy")
        folder.mkdir(parents=True, exist_ok=True)
        self.files = {name: folder / f"{label}-{name}.txt" for name in pids}
        self.procs = [subprocess.Popen([binary, "record", "--pid", str(pid), "--rate", "50", "--nonblocking",
                                        "--format", "raw", "--output", str(self.files[name])],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                      for name, pid in pids.items()]

    def stop(self) -> dict[str, list[str]]:
        for proc in self.procs:
            proc.send_signal(signal.SIGINT)
        for proc in self.procs:
            proc.wait(timeout=60)
        return {name: hot_spots(path) for name, path in self.files.items() if path.exists()}


def hot_spots(path: Path, top: int = 12) -> list[str]:
    """The functions with the most samples in a collapsed-stack file: inclusive share, then own share."""
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames, n = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")], int(count)
        total += n
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n
    ranked = sorted(inclusive, key=lambda f: (-own.get(f, 0), -inclusive[f]))[:top]
    return [f"{100 * inclusive[f] / total:5.1f}% incl {100 * own.get(f, 0) / total:5.1f}% own  {f}" for f in ranked]


@dataclass(frozen=True)
class Setup:
    """What one run starts: the metrics source and the intervals."""

    source: str                 # "prometheus" | "direct"
    control_interval_s: float
    scrape_interval_s: float    # Prometheus's, for every target


class Processes:
    """The emulator, the operator and (for the Prometheus source) Prometheus, and a kubernetes client."""

    def __init__(self, workdir: Path, setup: Setup):
        self.kubeconfig, self.apiserver = workdir / "kubeconfig", None
        self.metrics_port = free_port()
        self.env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "SPECFLEET_METRICS_PORT": str(self.metrics_port),
                    "SPECFLEET_CONTROL_INTERVAL": f"{setup.control_interval_s:g}"}
        self.env.pop("SPECFLEET_PROMETHEUS_URL", None)
        self.logs, self.prometheus, self.operator = workdir, None, None
        try:
            self._start(setup)
        except BaseException:
            self.close()
            raise

    def _start(self, setup: Setup) -> None:
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
        command = [str(BIN / "specfleet"), "operator", "run", "--namespace", NS]
        if setup.source == "prometheus":
            from specfleet.cluster.prometheus import LocalPrometheus

            self.prometheus = LocalPrometheus(self.logs / "prometheus", free_port(),
                                              interval=f"{setup.scrape_interval_s:g}s")
            self.prometheus.start()
            command += ["--prometheus-url", self.prometheus.url]
        self.operator = self._spawn("operator", command)

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        with (self.logs / f"{name}.log").open("wb") as log:
            return subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def logged(self, text: str) -> int:
        """Lines of the operator's log that hold `text`."""
        with (self.logs / "operator.log").open(errors="replace") as log:
            return sum(text in line for line in log)

    def kubectl(self, *args: str, stdin: str | None = None) -> None:
        subprocess.run([str(BIN / "kubectl"), *args], input=stdin, text=True, env=self.env, check=True,
                       capture_output=True, timeout=60)

    def close(self) -> None:
        for proc in (self.operator, self.apiserver):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self.prometheus is not None:
            self.prometheus.stop()

    def operator_metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=30) as reply:
            return reply.read().decode()

    def promql(self, expr: str) -> list[dict]:
        data = urllib.parse.urlencode({"query": expr}).encode()
        with urllib.request.urlopen(f"{self.prometheus.url}/api/v1/query", data=data, timeout=30) as reply:
            return json.loads(reply.read())["data"]["result"]

    def active_targets(self) -> int:
        with urllib.request.urlopen(f"{self.prometheus.url}/api/v1/targets?state=active", timeout=30) as reply:
            return len(json.loads(reply.read())["data"]["activeTargets"])


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The samples of `name` in a text exposition: (labels, value) each."""
    out = []
    for match in re.finditer(rf"^{re.escape(name)}(?:\{{(.*?)\}})? (\S+)$", text, re.MULTILINE):
        out.append((dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(1) or "")), float(match.group(2))))
    return out


def queries_made(fleet: Processes) -> float:
    return sum(value for _, value in samples(fleet.operator_metrics(), "specfleet_prometheus_queries_total"))


class FirstSeen(threading.Thread):
    """Watches one kind in the benchmark namespace from `rv` and records, per name, when an object first met
    `test`. A watch costs the emulator one encode per event, where polling lists of a large fleet would cost
    it the whole fleet every poll and skew what is measured."""

    def __init__(self, list_call, rv: str, test):
        super().__init__(daemon=True)
        self.list_call, self.rv, self.test = list_call, rv, test
        self.first: dict[str, float] = {}
        self.events = 0                 # every event seen (writes to the kind, when counted over a window)
        self.stop, self.response = threading.Event(), None

    def run(self) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        while not self.stop.is_set():
            try:
                self.response = self.list_call(watch=True, resource_version=self.rv, timeout_seconds=60,
                                               _preload_content=False)
                for line in iter_resp_lines(self.response):
                    if line:
                        self._event(json.loads(line))
            except Exception:  # noqa: BLE001  (the emulator stopping, or a dropped stream: resume from rv)
                time.sleep(0.2)

    def close(self) -> None:
        self.stop.set()
        if self.response is not None:
            try:
                self.response.shutdown()        # wakes the read in `run`
            except RuntimeError:                # the stream already ended and went back to the pool
                pass

    def _event(self, event: dict) -> None:
        obj = event["object"]
        self.events += 1
        self.rv = obj["metadata"].get("resourceVersion", self.rv)
        name = obj["metadata"].get("name")
        if event["type"] in ("ADDED", "MODIFIED") and name not in self.first and self.test(obj):
            self.first[name] = time.monotonic()


def watchers(fleet: Processes) -> tuple[FirstSeen, FirstSeen]:
    """Started watches: when each service first had `status.plan`, when its Deployment first existed."""
    return (watch(fleet, "services", lambda o: bool((o.get("status") or {}).get("plan"))),
            watch(fleet, "deployments", lambda o: True))


def watch(fleet: Processes, kind: str, test=lambda o: False) -> FirstSeen:
    """A started `FirstSeen` on the benchmark namespace's InferenceServices ("services"), Deployments or
    Events, from their current resourceVersion."""
    call = {"services": lambda **kw: fleet.custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, **kw),
            "deployments": lambda **kw: fleet.apps.list_namespaced_deployment(NS, **kw),
            "events": lambda **kw: fleet.core.list_namespaced_event(NS, **kw)}[kind]
    rv = call(_preload_content=False, limit=1).json()["metadata"]["resourceVersion"]
    seen = FirstSeen(call, rv, test)
    seen.start()
    return seen


def burst(fleet: Processes, count: int, timeout: float, progress) -> dict:
    """Create `count` services at once; a service is reconciled once it has a plan and a Deployment (both
    seen through watches opened before the burst)."""
    created: dict[str, float] = {}
    task = progress.add_task("  reconciled", total=count)
    planned, deployed = watchers(fleet)

    def create(name: str) -> None:
        fleet.custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, service(name))
        created[name] = time.monotonic()

    start = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create, names(count)))
    create_s = time.monotonic() - start
    done: dict[str, float] = {}
    while len(done) < count and time.monotonic() - start < timeout:
        done = {n: max(t, deployed.first[n]) for n, t in list(planned.first.items()) if n in deployed.first}
        progress.update(task, completed=len(done))
        time.sleep(0.5)
    planned.close()
    deployed.close()
    progress.remove_task(task)
    latencies = [done[n] - created[n] for n in done if n in created]
    return {"reconciled": len(done), "create_seconds": round(create_s, 2),
            "all_reconciled_seconds": round(max(done.values()) - start, 2) if done else None,
            "burst_latency_p50_s": round(percentile(latencies, 50), 2),
            "burst_latency_p99_s": round(percentile(latencies, 99), 2)}


def edits(fleet: Processes, count: int, edits: int, progress) -> dict:
    """Edit one service's SLO at a time on the settled fleet; time until observedGeneration follows."""
    latencies = []
    task = progress.add_task("  SLO edits", total=edits)
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
        progress.advance(task)
    progress.remove_task(task)
    return {"edit_latency_p50_s": round(percentile(latencies, 50), 3),
            "edit_latency_p99_s": round(percentile(latencies, 99), 3), "edits_observed": len(latencies),
            "edit_latencies_s": [round(x, 3) for x in latencies]}


def wait_for_prometheus(fleet: Processes, pods: int, setup: Setup, progress) -> dict:
    """Until Prometheus holds a sample of every pod (its engine series, as the operator queries them)."""
    task = progress.add_task("  Prometheus scraped", total=pods)
    start, seen = time.monotonic(), 0
    deadline = start + 3 * setup.scrape_interval_s + 60
    while time.monotonic() < deadline:
        result = fleet.promql('count(vllm:num_requests_running{inferenceservice!=""})')
        seen = int(float(result[0]["value"][1])) if result else 0
        progress.update(task, completed=seen)
        if seen >= pods:
            break
        time.sleep(1)
    progress.remove_task(task)
    return {"prometheus_pods_seen": seen, "prometheus_all_scraped_seconds": round(time.monotonic() - start, 1),
            "prometheus_active_targets": fleet.active_targets()}


def idle(fleet: Processes, samplers: dict[str, ProcessSampler], setup: Setup, seconds: float, progress,
         profiler: "Profiler | None" = None) -> dict:
    """CPU of every process over an idle window (nothing changes: no edits, no new pods, every loop
    running), the Prometheus queries the operator made in it, and the writes it made per interval
    (InferenceService status patches, Deployment changes, Events; each seen through a watch): on an idle
    fleet whose metrics do not change every write is overhead. With `profiler`, py-spy over the window."""
    before = queries_made(fleet)
    counted = {kind: watch(fleet, kind) for kind in ("services", "deployments", "events")}
    for sampler in samplers.values():
        sampler.mark()
    task = progress.add_task("  idle window", total=seconds)
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        progress.update(task, completed=elapsed)
        time.sleep(min(1.0, seconds - elapsed))
    progress.remove_task(task)
    out = {f"{name}_idle_cpu_percent": sampler.cpu_percent() for name, sampler in samplers.items()}
    per_interval = setup.control_interval_s / seconds
    for kind, seen in counted.items():
        seen.close()
        out[f"idle_{kind}_writes_per_interval"] = round(seen.events * per_interval, 1)
    if profiler is not None:
        out["idle_profile"] = profiler.stop()
    if setup.source == "prometheus":
        made = queries_made(fleet) - before
        out["prometheus_queries_per_interval"] = round(made * per_interval, 2)
    return out


def source_check(fleet: Processes, with_pods: list[str], setup: Setup) -> dict:
    """Services whose loops read `setup.source` (the operator's gauge, all services with a pod), and the
    `MetricsSource` condition of a sample of them (True with the source's reason)."""
    on = {labels.get("name") for labels, value in samples(fleet.operator_metrics(), "specfleet_metrics_source")
          if labels.get("namespace") == NS and labels.get("source") == setup.source and value == 1}
    on_source = sum(name in on for name in with_pods)
    step = max(1, len(with_pods) // SOURCE_CHECK_SAMPLE)
    sample, reasons = with_pods[::step][:SOURCE_CHECK_SAMPLE], {}
    for name in sample:
        got = fleet.custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
        condition = next((c for c in (got.get("status") or {}).get("conditions") or []
                          if c.get("type") == "MetricsSource"), {})
        reasons[name] = f"{condition.get('status')}/{condition.get('reason')}"
    expected = f"True/{EXPECTED_REASON[setup.source]}"
    return {"services_on_source": on_source,
            "metrics_source_condition_ok": sum(r == expected for r in reasons.values()),
            "metrics_source_condition_sampled": len(reasons),
            "metrics_source_conditions": reasons}


def once(args, setup: Setup, progress, label: str) -> dict:
    """One whole run with fresh processes: burst, engine pods, SLO edits, idle window, source check."""
    with tempfile.TemporaryDirectory() as tmp:
        phase = progress.add_task(f"{label}: starting", total=None)
        fleet, engine = Processes(Path(tmp), setup), stub_engine()
        samplers = {"operator": ProcessSampler(fleet.operator.pid), "emulator": ProcessSampler(fleet.apiserver.pid),
                    "harness": ProcessSampler(os.getpid())}
        if fleet.prometheus is not None:
            samplers["prometheus"] = ProcessSampler(fleet.prometheus.proc.pid)
        for sampler in samplers.values():
            sampler.start()
        try:
            result = measure(fleet, engine, samplers, args, setup, progress, lambda text: progress.update(
                phase, description=f"{label}: {text}"), label.replace(" ", "").replace("/", "of"))
        finally:
            for sampler in samplers.values():
                sampler.stop.set()
            fleet.close()
            engine.shutdown()
            engine.server_close()
            progress.remove_task(phase)
        # kopf says this once per creation it handles: more than `count` means some were handled twice.
        result["creations_processed"] = fleet.logged("Creation is processed")
    for name, sampler in samplers.items():
        if name != "harness":
            result |= {f"{name}_rss_peak_mib": round(sampler.peak, 1), f"{name}_rss_end_mib": round(sampler.last, 1)}
    return result


def measure(fleet: Processes, engine: ThreadingHTTPServer, samplers: dict[str, ProcessSampler], args, setup: Setup,
            progress, say, label: str) -> dict:
    time.sleep(3)
    say(f"burst of {args.count}")
    for sampler in samplers.values():
        sampler.mark()
    profiler = Profiler(args.profile, {"emulator": fleet.apiserver.pid, "operator": fleet.operator.pid},
                        label) if args.profile else None
    result = burst(fleet, args.count, args.timeout, progress)
    if profiler is not None:
        result["burst_profile"] = profiler.stop()
    result |= {f"{name}_burst_cpu_percent": s.cpu_percent() for name, s in samplers.items()}
    with_pods = names(min(args.pods, args.count))
    if with_pods:
        say(f"{len(with_pods)} engine pods")
        result |= engine_pods(fleet, engine, with_pods, setup, progress)
    time.sleep(2)
    say("SLO edits")
    profiler = Profiler(args.profile, {"emulator": fleet.apiserver.pid, "operator": fleet.operator.pid},
                        f"{label}-edits") if args.profile else None
    result |= edits(fleet, args.count, args.edits, progress)
    if profiler is not None:
        result["edits_profile"] = profiler.stop()
    say("idle fleet")
    # The edits' reconciles, and the next interval of each edited service (its conditions for the new
    # generation), end before the idle window.
    time.sleep(args.settle_seconds if args.settle_seconds is not None else setup.control_interval_s + 5)
    profiler = Profiler(args.profile, {"emulator": fleet.apiserver.pid, "operator": fleet.operator.pid},
                        f"{label}-idle") if args.profile else None
    result |= idle(fleet, samplers, setup, args.idle_seconds, progress, profiler)
    if with_pods:
        result |= source_check(fleet, with_pods, setup)
    return result


def engine_pods(fleet: Processes, engine: ThreadingHTTPServer, services: list[str], setup: Setup, progress) -> dict:
    """Give `services` a Ready pod each; with Prometheus, make them its targets and wait until it has them all;
    then wait until every loop has read its pod (from Prometheus, once it has the pod) at least once."""
    started = time.monotonic()
    pods = add_pods(fleet, services, engine.server_address[1])
    result = {"pods_seconds": round(time.monotonic() - started, 2)}
    if fleet.prometheus is not None:
        from specfleet.cluster.prometheus import pod_monitors, targets, write_targets

        write_targets(fleet.prometheus.targets_file, targets(pods, pod_monitors()))
        result |= wait_for_prometheus(fleet, len(pods), setup, progress)
    time.sleep(max(20.0, setup.control_interval_s + 5))
    return result


def summary(runs: list[dict]) -> dict:
    """Median and spread (min..max) of each numeric figure over the runs."""
    out = {}
    for key in runs[0]:
        values = sorted(r[key] for r in runs if isinstance(r.get(key), (int, float)))
        if not values:
            continue
        median = values[len(values) // 2] if len(values) % 2 else (values[len(values) // 2 - 1] +
                                                                   values[len(values) // 2]) / 2
        out[key] = {"median": round(median, 3), "min": values[0], "max": values[-1]}
    return out


def report(result: dict, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    setup = result["setup"]
    source = (f"metrics from Prometheus (scraped every {setup['scrape_interval_s']:g} s)"
              if setup["source"] == "prometheus" else "metrics scraped by the operator")
    table = Table(title=f"operator at scale: {result['count']} InferenceServices, {result['pods']} with a pod, "
                        f"{result['repeats']} run(s)",
                  caption=f"{source}; control interval {setup['control_interval_s']:g} s; API emulator, one "
                          f"operator process, {result['machine']['cpus']} CPUs; CPU in % of one core")
    table.add_column("metric")
    table.add_column("median", justify="right")
    table.add_column("min .. max", justify="right")
    runs = result["runs"] if len(result["runs"]) > 1 else []
    for i in range(len(runs)):
        table.add_column(f"run {i + 1}", justify="right")
    for key, value in result["summary"].items():
        table.add_row(key, str(value["median"]), f"{value['min']} .. {value['max']}",
                      *(str(run.get(key, "")) for run in runs))
    Console(width=max(120, Console().width)).print(table)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


def parse_args() -> argparse.Namespace:
    from specfleet.cluster.prometheus import LocalPrometheus

    default_source = "prometheus" if LocalPrometheus.binary() else "direct"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=1000, help="InferenceServices created in the burst.")
    parser.add_argument("--edits", type=int, default=50, help="Single SLO edits timed on the settled fleet.")
    parser.add_argument("--repeats", type=int, default=1, help="Whole runs (fresh processes each).")
    parser.add_argument("--pods", type=int, default=0, help="Services (the first N) that get a Ready engine pod.")
    parser.add_argument("--metrics-source", choices=("prometheus", "direct"), default=default_source,
                        help="Where the operator reads engine metrics (default: prometheus when the binary is on "
                             f"PATH, else direct; here: {default_source}).")
    parser.add_argument("--control-interval", type=float, default=DEFAULT_CONTROL_INTERVAL_S,
                        help="The operator's control interval, s (SPECFLEET_CONTROL_INTERVAL; default 15). "
                             "Prometheus scrapes every min(15 s, this).")
    parser.add_argument("--idle-seconds", type=float, default=60.0,
                        help="How long to sample the idle CPU (default 60: four default control intervals).")
    parser.add_argument("--settle-seconds", type=float, default=None,
                        help="Pause between the last SLO edit and the idle window (default: one control "
                             "interval + 5 s, so the edited services' next intervals are not counted as idle).")
    parser.add_argument("--stub", choices=("engine", "busy", "minimal"), default="engine",
                        help="What each stub pod's /metrics serves: a real engine's series (default; 635 before "
                             "commit 2ebfa81, 203 from it), idle; the same series moving every "
                             f"{BUSY_STEP_S:g} s (busy: an engine serving steadily, so every sample is new); or "
                             "the four series the tables measured before commit e3864b0 had.")
    parser.add_argument("--timeout", type=float, default=900, help="Give up on the burst after this many s.")
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="py-spy (pip install py-spy) the emulator and the operator during the burst, the SLO "
                             "edits and the idle window: collapsed stacks in DIR, hot spots in the JSON. Costs "
                             "CPU: not for figures.")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/operator_scale.json",
                        help="Where the JSON goes (default benchmarks/results/operator_scale.json).")
    args = parser.parse_args()
    if args.metrics_source == "prometheus" and not LocalPrometheus.binary():
        parser.error("--metrics-source prometheus: prometheus is not on PATH (Debian: apt-get install prometheus)")
    return args


def main() -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    args = parse_args()
    _Metrics.exposition = staticmethod({"engine": lambda: STUB_METRICS, "minimal": lambda: MINIMAL_EXPOSITION,
                                        "busy": BusyExposition()}[args.stub])
    # SIGTERM unwinds like Ctrl-C, so each run's `finally` stops the processes it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    setup = Setup(args.metrics_source, args.control_interval, min(POD_MONITOR_INTERVAL_S, args.control_interval))
    started = time.monotonic()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn()) as progress:
        runs = [once(args, setup, progress, f"run {i + 1}/{args.repeats}") for i in range(args.repeats)]
    result = {"command": " ".join([".venv/bin/python", "benchmarks/operator_scale.py", *sys.argv[1:]]),
              "commit": commit(), "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "count": args.count, "edits": args.edits, "repeats": args.repeats, "pods": args.pods,
              "setup": {"source": setup.source, "control_interval_s": setup.control_interval_s,
                        "scrape_interval_s": setup.scrape_interval_s if setup.source == "prometheus" else None,
                        "idle_seconds": args.idle_seconds, "stub": args.stub,
                        "stub_series_per_pod": series_in(_Metrics.exposition())},
              "wall_s": round(time.monotonic() - started, 1), "summary": summary(runs), "runs": runs}
    report(result, args.out)


if __name__ == "__main__":
    main()
