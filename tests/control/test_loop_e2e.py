"""Closed loop through the API emulator: the real operator (`specfleet operator run`, control interval
1 s) finds its engine pods the way it does on a cluster, from Pod objects (labels, Ready, `status.podIP`,
the container's port), and scrapes them: stand-in engines (HTTP `/metrics` in the engine's exposition
format, `/admin/speculation` recording calls) behind Pods this test writes into the emulator, where no
kubelet runs (podIP 127.0.0.1, container port = the stand-in's port).

The stand-ins (`FakeEngine`, fixture `fake_engine_pods`) live in tests/conftest.py, shared with
tests/reliability/test_operator_faults.py.

Load raised -> the Deployment scales up; a batch-heavy phase -> speculation off on every pod with the
Secret's bearer token; status and Events say why.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

pytest.importorskip("specfleet.cluster.apiserver", reason="the API emulator is not available")
from specfleet.cluster.apiserver import running_apiserver  # noqa: E402

from specfleet.operator import api, render  # noqa: E402
from testkit import interrupt, service_account_kubeconfigs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NS = "ctl"


def stand_in_pods(ns: str, service: str, urls: dict[str, str]) -> list[tuple[dict, dict]]:
    """(Pod, its status) for each stand-in `{pod: http://127.0.0.1:port}`: labelled as the operator renders
    its pods, the stand-in's port as the container port, Ready on podIP 127.0.0.1."""
    out = []
    for name, url in urls.items():
        host, port = urlparse(url).hostname, urlparse(url).port
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"{service}-{name}", "namespace": ns, "labels": render.labels(service)},
               "spec": {"containers": [{"name": "engine", "image": "stand-in",
                                        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}]}]}}
        status = {"phase": "Running", "podIP": host, "podIPs": [{"ip": host}],
                  "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]}
        out.append((pod, status))
    return out


def create_pods(core, ns: str, pods: list[tuple[dict, dict]]) -> None:
    for pod, status in pods:
        core.create_namespaced_pod(ns, pod)
        core.patch_namespaced_pod_status(pod["metadata"]["name"], ns, {"status": status})


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


@contextmanager
def operator_for(tmp: Path, urls: dict, ns: str, env: dict, autoscaling: dict):
    """The real operator on the API emulator, one InferenceService `chat` in `ns` (the CPU example with
    `autoscaling`) whose Pods front the stand-ins at `urls`; yields (AppsV1Api, CoreV1Api, CustomObjectsApi)."""
    from kubernetes import client, config

    with running_apiserver(tmp / "kubeconfig", port=0) as server:
        env = {**os.environ, "KUBECONFIG": str(server.kubeconfig), **env}
        kubectl = lambda *a, stdin=None: subprocess.run([str(BIN / "kubectl"), *a], input=stdin, text=True,  # noqa
                                                        capture_output=True, env=env, timeout=30, check=True)
        kubectl("apply", "-f", str(ROOT / "crds/inferenceservice.yaml"))
        kubectl("apply", "-f", "-", stdin=yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace",
                                                          "metadata": {"name": ns}}))
        wait_for(lambda: subprocess.run([str(BIN / "kubectl"), "get", "infsvc", "-n", ns], env=env,
                                        capture_output=True).returncode == 0)
        log = (tmp / "operator.log").open("wb")
        kubeconfigs = service_account_kubeconfigs(server, tmp)      # the operator under manifests/' RBAC
        proc = subprocess.Popen([str(BIN / "specfleet"), "operator", "run", "--namespace", ns],
                                env={**env, "KUBECONFIG": str(kubeconfigs["operator"])},
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        doc = yaml.safe_load((ROOT / "manifests/examples/smollm2-cpu.yaml").read_text())
        doc["metadata"] = {"name": "chat", "namespace": ns}
        doc["spec"]["autoscaling"] = autoscaling
        kubectl("apply", "-f", "-", stdin=yaml.safe_dump(doc))
        api_client = config.new_client_from_config(str(server.kubeconfig))
        create_pods(client.CoreV1Api(api_client), ns, stand_in_pods(ns, "chat", urls))
        try:
            yield client.AppsV1Api(api_client), client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
        finally:
            interrupt(proc, timeout=15)
            print((tmp / "operator.log").read_text()[-3000:])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, fake_engine_pods):
    engines, urls = fake_engine_pods(2)
    env = {"SPECFLEET_CONTROL_INTERVAL": "1", "SPECFLEET_SPECULATION_DWELL": "3"}
    autoscaling = {"minReplicas": 1, "maxReplicas": 4, "scaleUpStabilizationSeconds": 0,
                   "scaleDownStabilizationSeconds": 600}
    with operator_for(tmp_path_factory.mktemp("ctl"), urls, NS, env, autoscaling) as (apps, core, custom):
        yield engines, apps, core, custom


def service(custom, ns: str = NS) -> dict:
    return custom.get_namespaced_custom_object(api.GROUP, api.VERSION, ns, api.PLURAL, "chat")


def speculation_active(custom) -> dict:
    conditions = service(custom).get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "SpeculationActive"), {})


def light_and_speculating(status: dict) -> bool:
    """Whether one status says both: the last window carried under half a request per second (speculation
    costs no replica there), and speculation on."""
    active = next((c for c in status.get("conditions") or [] if c["type"] == "SpeculationActive"), {})
    return status.get("observed", {}).get("requestsPerSecond", float("inf")) < 0.5 and active.get("status") == "True"


def events(core, reason: str, ns: str = NS) -> list[dict]:
    items = core.list_namespaced_event(ns, _preload_content=False).json()["items"]
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
    # Light load first: whatever the raised load above left (a shallower depth, or speculation off), it clears.
    for e in engines:
        e.set(rps=0.05, ttft=0.3, waiting=0.0, batch=2.0, alpha=0.86)      # one replica's worth, well within
    # One status read must show both: a decision taken on a window of the light load alone, and speculation on.
    # Speculation may have stayed on through the raised load (at 0.86 a shallower depth costs no replica); then
    # "on" alone proves nothing, and on a busy machine the first window at 0.67 could still hold the raised load
    # and turn speculation off for costing replicas, not for the batch.
    assert wait_for(lambda: light_and_speculating(service(custom)["status"]))
    assert wait_for(lambda: all(e.admin_calls and e.admin_calls[-1][0]["enabled"] is True for e in engines))
    # At 0.67 per token (0.4 of 4 drafted tokens accepted) the shipped CPU profile prices speculation to stop
    # paying, past the dead band's edge, at a batch well below 400; at 0.86 (0.7 of 4) it pays at every batch
    # (docs/control.md, "Calibration: profile, online, roofline"). Both stay above minAcceptanceRate at any depth
    # the loop picked in the light phase, so the batch is the reason.
    for e in engines:
        e.set(batch=400.0, alpha=0.67)
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


# -- the loop through Prometheus -------------------------------------------------------------------------
PROM_NS = "ctl-prom"


def metrics_source(custom) -> dict:
    conditions = service(custom, PROM_NS).get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "MetricsSource"), {})


@pytest.mark.slow
def test_the_loop_reads_prometheus_falls_back_when_it_dies_and_returns(tmp_path, fake_engine_pods):
    """The operator with `SPECFLEET_PROMETHEUS_URL` reads the stand-ins through a real Prometheus; with
    Prometheus killed it scrapes the pods within an interval and says so; with it back, it returns.
    A decision needs a window from fresh data either way, so nothing is decided on stale data."""
    from prometheus_kit import PrometheusProcess

    engines, urls = fake_engine_pods(2)
    targets = [{"targets": [urlparse(url).netloc],
                "labels": {"namespace": PROM_NS, "pod": f"chat-{pod}", "inferenceservice": "chat"}}
               for pod, url in urls.items()]
    prometheus = PrometheusProcess(tmp_path / "prometheus", {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "engines", "scrape_interval": "1s", "static_configs": targets}]})
    prometheus.start()
    env = {"SPECFLEET_CONTROL_INTERVAL": "1", "SPECFLEET_PROMETHEUS_URL": prometheus.server.url}
    autoscaling = {"minReplicas": 1, "maxReplicas": 4, "scaleUpStabilizationSeconds": 0,
                   "scaleDownStabilizationSeconds": 600}
    try:
        with operator_for(tmp_path, urls, PROM_NS, env, autoscaling) as (apps, core, custom):
            on = wait_for(lambda: (c := metrics_source(custom)).get("reason") == "Prometheus" and c, timeout=60)
            assert on["status"] == "True" and prometheus.server.url in on["message"]
            wait_for(lambda: service(custom, PROM_NS)["status"].get("observed", {}).get("requestsPerSecond"))
            prometheus.stop(signal.SIGKILL)
            killed = time.monotonic()
            off = wait_for(lambda: (c := metrics_source(custom)).get("reason") == "PrometheusUnavailable" and c)
            assert time.monotonic() - killed < 10 and off["status"] == "False"
            replicas = apps.read_namespaced_deployment("chat", PROM_NS).spec.replicas
            prometheus.start()
            back = wait_for(lambda: (c := metrics_source(custom)).get("reason") == "Prometheus" and c, timeout=60)
            assert back["status"] == "True"
            # The steady stand-ins never asked for more: neither source switch moved the replicas.
            assert apps.read_namespaced_deployment("chat", PROM_NS).spec.replicas == replicas
    finally:
        prometheus.stop()
