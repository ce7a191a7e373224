"""The operator fail-over scenario, shared by tests/operator/test_leader_election.py and
benchmarks/operator_failover.py: two real `specfleet operator run -A --leader-elect` processes (distinct
POD_NAME, a short Lease) against the API emulator, one InferenceService `chat` with a fixed
`spec.replicas`, and two stand-in engine pods (HTTP `/metrics` with the speculation gauges, and
`/admin/speculation` recording every switch) so that the control loop switches speculation whenever a
plan changes it.

`edit_stream` makes SLO edits (each one changes the plan, so the rendered args) together with a new
`spec.replicas` (a scale event), kills or stops the leader in the middle, and returns what happened:
how long the Lease went without an acting holder, whether the last edit reached the Deployment and
status, and how many Deployment spec writes and speculation switches were made, so that a lost edit or
an action taken twice shows.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import yaml

from specfleet.operator import api, catalogs, planner, render
from testkit import free_port, service_account_kubeconfigs, wait_for

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
NS = "ha"
SERVICE = "chat"
LEASE = "specfleet-operator"
LEASE_NS = "specfleet-system"      # where manifests/operator.yaml keeps it (POD_NAMESPACE), and its Role allows
DURATION_S, RENEW_DEADLINE_S, RETRY_S = 3, 2.0, 0.5
#: itlP99Ms values whose plans all differ (args, and speculation on k=2 / on k=1 / off) for the CPU example.
ITL_MS = (100, 400, 150, 500, 200, 600, 250, 800, 300, 1000)


class StandIn:
    """A stand-in engine pod: speculation gauges in `/metrics`; `/admin/speculation` switches them."""

    def __init__(self):
        self.enabled, self.k, self.calls = True, 4, []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                with outer.lock:
                    body = (f'specfleet:speculation_enabled{{model_name="chat"}} {float(outer.enabled)}\n'
                            f'specfleet:num_speculative_tokens{{model_name="chat"}} {outer.k}\n'
                            'vllm:num_requests_running{model_name="chat"} 0\n'
                            'vllm:num_requests_waiting{model_name="chat"} 0\n').encode()
                self._answer(body, "text/plain; version=0.0.4")

            def do_POST(self):
                data = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.calls.append((bool(data["enabled"]), int(data["num_speculative_tokens"])))
                    outer.enabled, outer.k = bool(data["enabled"]), int(data["num_speculative_tokens"])
                self._answer(json.dumps({"enabled": outer.enabled}).encode(), "application/json")

            def _answer(self, body: bytes, kind: str):
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def duplicate_switches(self) -> int:
        """Switches that repeat the one before (a second leader, or a re-send after a takeover)."""
        with self.lock:
            return sum(1 for a, b in zip(self.calls, self.calls[1:]) if a == b)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Replica:
    """One operator process; `POD_NAME` is its identity."""

    name: str
    env: dict
    log: Path
    proc: subprocess.Popen | None = None
    liveness: int = field(default_factory=free_port)
    metrics: int = field(default_factory=free_port)

    def start(self) -> "Replica":
        command = [str(BIN / "specfleet"), "operator", "run", "-A", "--leader-elect", "--lease-namespace", LEASE_NS,
                   "--lease-duration", str(DURATION_S), "--renew-deadline", str(RENEW_DEADLINE_S),
                   "--retry-period", str(RETRY_S), "--liveness", f"http://127.0.0.1:{self.liveness}/healthz"]
        env = {**self.env, "POD_NAME": self.name, "SPECFLEET_METRICS_PORT": str(self.metrics)}
        self.proc = subprocess.Popen(command, env=env, stdout=self.log.open("ab"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 20.0) -> None:
        if not self.alive():
            return
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait()

    def health(self) -> dict:
        return httpx.get(f"http://127.0.0.1:{self.liveness}/healthz", timeout=2).json()

    def leader_gauge(self) -> float | None:
        text = httpx.get(f"http://127.0.0.1:{self.metrics}/metrics", timeout=2).text
        line = next((x for x in text.splitlines() if x.startswith("specfleet_operator_leader ")), None)
        return None if line is None else float(line.split()[1])


@dataclass
class Outcome:
    """One kill (or stop) of the leader under an edit stream."""

    old: str
    new: str
    takeover_s: float              # from the signal to the follower holding the Lease
    edits: int
    lost: int                      # edits whose effect is missing once the operator settled (0 or 1: the last)
    deployment_writes: int         # spec changes of the Deployment during the stream (generation steps)
    revisits: int                  # a Deployment state seen again after another one
    duplicate_switches: int
    transitions: int               # leaseTransitions added

    @property
    def duplicates(self) -> int:
        return max(0, self.deployment_writes - self.edits) + self.revisits + self.duplicate_switches


class Fleet:
    """The emulator, the service and its stand-in pods, and the operator replicas; a context manager."""

    def __init__(self, tmp: Path, names: tuple[str, ...] = ("op-a", "op-b")):
        self.tmp, self.names, self.stack = tmp, names, ExitStack()
        self.replicas: dict[str, Replica] = {}
        self.stand_ins: list[StandIn] = []
        self.edit = 0

    def __enter__(self) -> "Fleet":
        from kubernetes import client, config

        from specfleet.cluster.apiserver import running_apiserver

        try:
            server = self.stack.enter_context(running_apiserver(self.tmp / "kubeconfig", port=0,
                                                                  faults=True))
            # The replicas run as the operator's ServiceAccount under manifests/' RBAC (the Lease's Role included).
            operator_kubeconfig = service_account_kubeconfigs(server, self.tmp)["operator"]
            self.env = {**os.environ, "KUBECONFIG": str(operator_kubeconfig), "SPECFLEET_CONTROL_INTERVAL": "1"}
            self.admin_env = {**os.environ, "KUBECONFIG": str(server.kubeconfig)}
            api_client = config.new_client_from_config(str(server.kubeconfig))
            self.api_client = api_client
            self.apps, self.core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
            self.custom, self.leases = client.CustomObjectsApi(api_client), client.CoordinationV1Api(api_client)
            self._kubectl("apply", "-f", str(ROOT / "crds/inferenceservice.yaml"))
            self._kubectl("apply", "-f", "-", stdin=yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace",
                                                                    "metadata": {"name": NS}}))
            wait_for(lambda: self._kubectl("get", "infsvc", "-n", NS, check=False).returncode == 0)
            self._kubectl("apply", "-f", "-", stdin=yaml.safe_dump(self.document(ITL_MS[-1], 2)))
            self.stand_ins = [StandIn(), StandIn()]
            self.stack.callback(lambda: [s.close() for s in self.stand_ins])
            self._create_pods()
            for name in self.names:
                self.replicas[name] = Replica(name, self.env, self.tmp / f"{name}.log")
                self.stack.callback(self.replicas[name].stop)
        except BaseException:
            self.stack.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stack.close()

    # -- the cluster -----------------------------------------------------------------------------------
    def _kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "kubectl"), *args], input=stdin, text=True, capture_output=True,
                              env=self.admin_env, timeout=30, check=check)

    @staticmethod
    def document(itl_ms: int, replicas: int) -> dict:
        doc = yaml.safe_load((ROOT / "manifests/examples/smollm2-cpu.yaml").read_text())
        doc["metadata"] = {"name": SERVICE, "namespace": NS}
        doc["spec"]["slo"]["itlP99Ms"] = itl_ms
        doc["spec"]["replicas"] = replicas
        return doc

    @staticmethod
    def expected(itl_ms: int, replicas: int) -> tuple[int, tuple[str, ...], dict]:
        """(replicas, args, plan) the operator should render for this spec."""
        spec = api.parse_spec(Fleet.document(itl_ms, replicas)["spec"])
        plan = planner.plan(spec, catalogs.gpus(), catalogs.models(), catalogs.profiles())
        container = render.render(SERVICE, NS, spec, plan, replicas)[0]["spec"]["template"]["spec"]["containers"][0]
        return replicas, tuple(container["args"]), {"maxNumSeqs": plan.max_num_seqs,
                                                     "maxNumBatchedTokens": plan.max_num_batched_tokens}

    def _create_pods(self) -> None:
        for i, stand_in in enumerate(self.stand_ins):
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": f"{SERVICE}-{i}", "namespace": NS, "labels": render.labels(SERVICE)},
                   "spec": {"containers": [{"name": "engine", "image": "stand-in", "ports": [
                       {"name": "http", "containerPort": stand_in.port, "protocol": "TCP"}]}]}}
            self.core.create_namespaced_pod(NS, pod)
            self.core.patch_namespaced_pod_status(pod["metadata"]["name"], NS, {"status": {
                "phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
                "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]}})

    def faults(self, method: str, rule: dict | None = None) -> None:
        """The emulator's fault hook (cluster/apiserver/faults.py): POST a rule, DELETE them all."""
        self.api_client.rest_client.pool_manager.request(
            method, self.api_client.configuration.host + "/_faults", body=json.dumps(rule) if rule else None,
            headers={"Content-Type": "application/json"})

    def lease(self) -> dict:
        try:
            return self.leases.read_namespaced_lease(LEASE, LEASE_NS, _preload_content=False).json()["spec"]
        except Exception:  # noqa: BLE001  (not created yet)
            return {}

    def holder(self) -> str:
        return self.lease().get("holderIdentity") or ""

    def deployment(self) -> dict | None:
        try:
            return self.apps.read_namespaced_deployment(SERVICE, NS, _preload_content=False).json()
        except Exception:  # noqa: BLE001
            return None

    def service(self) -> dict:
        return self.custom.get_namespaced_custom_object(api.GROUP, api.VERSION, NS, api.PLURAL, SERVICE)

    def patch(self, itl_ms: int, replicas: int) -> None:
        self.custom.patch_namespaced_custom_object(api.GROUP, api.VERSION, NS, api.PLURAL, SERVICE, {
            "spec": {"slo": {"itlP99Ms": itl_ms}, "replicas": replicas}})

    # -- the operator replicas -------------------------------------------------------------------------
    def start(self, name: str) -> Replica:
        return self.replicas[name].start()

    def wait_leading(self, timeout: float = 60.0) -> str:
        """The one replica that holds the Lease and says so (health and gauge); the others follow."""
        def settled():
            holder = self.holder()
            rep = self.replicas.get(holder)
            if rep is None or not rep.alive() or rep.leader_gauge() != 1.0 or rep.health().get("leader") is not True:
                return None
            return holder
        holder = wait_for(settled, timeout, 0.1)
        self.wait_settled(timeout)
        return holder

    def wait_following(self, name: str, timeout: float = 60.0) -> None:
        rep = self.replicas[name]
        wait_for(lambda: rep.health().get("leader") is False and rep.leader_gauge() == 0.0, timeout, 0.1)

    def wait_settled(self, timeout: float = 60.0) -> dict:
        """Until the Deployment, the status and the stand-ins all reflect the current spec."""
        def settled():
            svc = self.service()
            spec = svc["spec"]
            want_replicas, want_args, want_plan = self.expected(spec["slo"]["itlP99Ms"], spec["replicas"])
            dep = self.deployment()
            st = svc.get("status") or {}
            plan = st.get("plan") or {}
            return (dep is not None and dep["spec"]["replicas"] == want_replicas
                    and tuple(dep["spec"]["template"]["spec"]["containers"][0]["args"]) == want_args
                    and st.get("observedGeneration") == svc["metadata"]["generation"]
                    and st.get("desiredReplicas") == want_replicas
                    and all(plan.get(k) == v for k, v in want_plan.items())) and svc
        return wait_for(settled, timeout, 0.1)

    def edit_stream(self, edits: int = 8, kill_at: int = 3, sig: int = signal.SIGKILL, every_s: float = 0.6,
                    settle_s: float = 60.0) -> Outcome:
        """`edits` spec edits `every_s` apart; the leader gets `sig` just before edit `kill_at`."""
        old = self.wait_leading()
        follower = next(n for n, r in self.replicas.items() if n != old and r.alive())
        self.wait_following(follower)
        transitions = int(self.lease().get("leaseTransitions") or 0)
        states: list[tuple] = []
        watching = threading.Event()
        watcher = threading.Thread(target=self._watch_deployment, args=(states, watching), daemon=True)
        watcher.start()
        first_generation = self.deployment()["metadata"]["generation"]
        takeover: list[float] = []
        last = None
        try:
            for i in range(edits):
                if i == kill_at:
                    signalled = time.monotonic()
                    self.replicas[old].signal(sig)
                    threading.Thread(target=self._time_takeover, args=(follower, signalled, takeover),
                                     daemon=True).start()
                self.edit += 1
                last = (ITL_MS[self.edit % len(ITL_MS)], 1 + self.edit % 3)
                self.patch(*last)
                time.sleep(every_s)
            wait_for(lambda: takeover, settle_s, 0.1)
            lost = 0
            try:
                self.wait_settled(settle_s)
            except AssertionError:
                lost = 1
        finally:
            watching.set()
            watcher.join(5)
        final = self.deployment()["metadata"]["generation"]
        seen = [s for i, s in enumerate(states) if i == 0 or s != states[i - 1]]
        switches = sum(s.duplicate_switches() for s in self.stand_ins)
        return Outcome(old, follower, takeover[0], edits, lost, final - first_generation,
                       len(seen) - len(set(seen)), switches,
                       int(self.lease().get("leaseTransitions") or 0) - transitions)

    def _time_takeover(self, follower: str, since: float, out: list[float]) -> None:
        deadline = since + 60
        while time.monotonic() < deadline:
            if self.holder() == follower:
                out.append(time.monotonic() - since)
                return
            time.sleep(0.02)

    def _watch_deployment(self, states: list[tuple], stop: threading.Event) -> None:
        """The Deployment's spec states as often as the API answers (every distinct generation counts)."""
        while not stop.is_set():
            dep = self.deployment()
            if dep is not None:
                states.append((dep["spec"]["replicas"],
                               tuple(dep["spec"]["template"]["spec"]["containers"][0]["args"])))
            time.sleep(0.02)
