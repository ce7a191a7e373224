"""What keeps an idle fleet cheap: a step that changes nothing writes nothing (no status patch for a window
length alone, no publish for an unchanged outcome), the scheduler keeps each body as compact JSON of the
fields a step reads, the operator's API client keeps a connection per calling thread, and a service's gauges
are set only when their values change."""
from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from specfleet.operator import kube, status
from specfleet.operator.control import loop, scheduler
from specfleet.operator.control.discovery import EngineView
from specfleet.operator.control.runner import ControlOutcome, ServiceControl, effective_patch
from specfleet.operator.control.sources import SourceReport
from specfleet.operator.control.window import Scrape
from tests.control.scheduler_kit import INTERVAL, FakeControl, run_for, serving_pod


def _step(observed: dict, events=()) -> loop.Step:
    return loop.Step(None, None, observed, [], [], list(events))


def _body(observed: dict) -> dict:
    return {"metadata": {"name": "chat", "generation": 1}, "status": {"observed": observed}}


def test_observed_is_rewritten_only_when_a_measured_value_changes():
    old = {"window": "15s", "queueDepth": 0.0}
    assert "observed" not in loop.status_patch(_body(old), _step({"window": "14s", "queueDepth": 0.0}), "t")
    assert "observed" not in loop.status_patch(_body(old), _step({"window": "30s", "queueDepth": 0.0}), "t")
    assert loop.status_patch(_body(old), _step({"window": "15s", "queueDepth": 2.0}), "t")["observed"] == {
        "window": "15s", "queueDepth": 2.0}
    assert loop.status_patch(_body({}), _step({"window": "15s"}), "t")["observed"] == {"window": "15s"}
    gone = loop.status_patch(_body({"window": "15s", "ttftP99Ms": 90.0}), _step({"window": "15s"}), "t")
    assert gone["observed"] == {"window": "15s"}


def merge_patch(target, patch):
    """RFC 7396, as the API server applies a status patch: null deletes, objects merge."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def test_a_null_that_deletes_nothing_is_left_out_of_the_patch():
    old = {"source": "roofline", "samples": 0, "gone": 1, "nested": {"a": 1}}
    patch = {"source": "roofline", "profile": None, "fitError": None, "samples": 0, "gone": None,
             "nested": {"a": None, "b": None}, "new": {"x": None, "y": 2}}
    effective = effective_patch(old, patch)
    assert effective == {"source": "roofline", "samples": 0, "gone": None, "nested": {"a": None}, "new": {"y": 2}}
    assert merge_patch(old, effective) == merge_patch(old, patch)


class _Sampled:
    """A source whose one pod has a new sample at every call (an idle engine: counters unchanged)."""

    stale_after_s = 0.0

    def __init__(self):
        self.t = 100.0

    async def scrape(self, namespace, endpoints):
        self.t += 15.0
        return ({p: Scrape(self.t, counters={"vllm:request_success": 10.0, "vllm:generation_tokens": 1000.0},
                           gauges={"vllm:num_requests_running": 1.0, "vllm:num_requests_waiting": 0.0})
                 for p in endpoints}, SourceReport("prometheus", "Prometheus", "test", True))


def test_an_idle_service_writes_its_status_once_then_not_again():
    """What the API server stores after a step's patch is what the next step compares with: an unchanged
    interval finds nothing to write (a roofline `calibration`, whose unset profile and fit error were sent
    as nulls, once wrote every interval)."""
    from specfleet.operator.control.discovery import EnginePod

    spec = {"model": {"name": "smollm2-135m", "source": "builtin:smollm2-135m"},      # no bfloat16 profile
            "accelerator": {"type": "cpu", "count": 1},
            "slo": {"ttftP99Ms": 2000, "itlP99Ms": 200, "maxContextTokens": 2048, "promptTokens": 256,
                    "outputTokens": 128, "requestsPerSecond": 0.5}}
    body = {"metadata": {"name": "chat", "namespace": "ns", "generation": 1}, "spec": spec, "status": {}}
    control = ServiceControl("ns", "chat", None, loop.LoopConfig(), source=_Sampled())
    pods = [EnginePod("ns", "chat", "chat-0", "http://127.0.0.1:1", None)]
    writes = []
    for _ in range(6):
        outcome = asyncio.run(control.interval(body, pods, (1, 1), "2026-01-01T00:00:00Z"))
        writes.append(status.changes(body["status"], outcome.status))
        body = {**body, "status": merge_patch(body["status"], outcome.status)}
    assert writes[0] and not any(writes[3:]), writes
    assert "profile" not in body["status"]["calibration"]


def test_status_changes_ignores_only_transition_times_and_fields_the_patch_leaves_alone():
    old = {"observed": {"queueDepth": 0.0}, "plan": {"k": 1},
           "conditions": [{"type": "SLOMet", "status": "Unknown", "lastTransitionTime": "a"}]}
    same = {"conditions": [{"type": "SLOMet", "status": "Unknown", "lastTransitionTime": "b"}]}
    assert not status.changes(old, same)
    assert status.changes(old, {**same, "observed": {"queueDepth": 1.0}})
    assert status.changes(old, {"conditions": [{"type": "SLOMet", "status": "True", "lastTransitionTime": "b"}]})


class Unchanging(FakeControl):
    """Reports the same status every interval, and an Event on its third."""

    async def interval(self, body, pods, replicas, when):
        self.steps.append("interval")
        events = [("Normal", "Third", "x")] if self.steps.count("interval") == 3 else []
        return ControlOutcome({"observed": {"queueDepth": 0.0}}, events)


def test_a_step_that_changes_nothing_is_not_published_but_one_with_events_is():
    view, published = EngineView(), []
    view.pod_changed(serving_pod("quiet"))

    async def publish(body, outcome):
        published.append(outcome.events)

    async def main():
        sched = scheduler.ControlScheduler(view, publish)
        control = Unchanging("quiet")
        body = {"metadata": {"name": "quiet"}, "status": {"observed": {"queueDepth": 0.0}}}
        sched.track(("ns", "quiet"), control, scheduler.StoredBody.of(body))
        await run_for(INTERVAL * 4.5, sched)
        return control
    control = asyncio.run(main())
    assert control.steps.count("interval") >= 3
    assert published == [[("Normal", "Third", "x")]]


def test_the_stored_body_keeps_what_a_step_reads_and_drops_kopfs_bookkeeping():
    body = {"apiVersion": "specfleet.io/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": "chat", "namespace": "ns", "uid": "u-1", "generation": 3, "resourceVersion": "9",
                         "labels": {"team": "a"},
                         "annotations": {"specfleet.io/last-handled-configuration": "{" + "x" * 2000 + "}"},
                         "managedFields": [{"manager": "kopf", "fieldsV1": {"f:status": {}}}] * 20},
            "spec": {"model": {"name": "m"}, "slo": {"itlP99Ms": 200}},
            "status": {"observedGeneration": 3, "conditions": [{"type": "Ready", "status": "True"}]}}
    stored = scheduler.StoredBody.of(body)
    again = stored()
    assert again["spec"] == body["spec"] and again["status"] == body["status"]
    assert again["metadata"] == {"name": "chat", "namespace": "ns", "uid": "u-1", "generation": 3,
                                 "resourceVersion": "9", "labels": {"team": "a"}}
    assert again["apiVersion"] == body["apiVersion"] and again["kind"] == body["kind"]
    assert len(stored.data) < 400
    again["status"]["phase"] = "changed"            # each call gives a fresh copy
    assert "phase" not in stored()["status"]


def test_the_api_client_keeps_a_connection_for_every_thread_that_calls_it(tmp_path, monkeypatch):
    assert kube.connection_pool_size(16, cpus=2) == 24
    assert kube.connection_pool_size(16, cpus=64) == 50
    config = tmp_path / "kubeconfig"
    config.write_text("apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                      "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
                      "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {}}]\n")
    from kubernetes.config import kube_config

    monkeypatch.setenv("KUBECONFIG", str(config))
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(config))   # read at its import
    client = kube.Kube.from_environment()
    pool = client.core.api_client.rest_client.pool_manager.connection_pool_kw
    assert pool["maxsize"] == kube.connection_pool_size()
    assert client.core.api_client.configuration.host == "http://127.0.0.1:1"


class _KeepAlive(BaseHTTPRequestHandler):
    """Answers every request 200 `{}` over HTTP/1.1 keep-alive, counting the connections it was given."""

    protocol_version = "HTTP/1.1"
    connections: list[int] = []

    def setup(self) -> None:
        super().setup()
        self.connections.append(1)

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"kind": "Status", "metadata": {}}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PATCH = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


def test_writes_whose_answer_is_not_read_reuse_one_connection():
    from kubernetes import client

    server = ThreadingHTTPServer(("127.0.0.1", 0), _KeepAlive)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        configuration = client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
        k = kube.Kube(client.ApiClient(configuration))
        for i in range(5):
            k.patch_service_status("ns", "chat", {"desiredReplicas": i})
            k.scale("Deployment", "ns", "chat", i)
            k.post_event({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}},
                         "Normal", "R", "m", "2026-01-01T00:00:00Z")
        assert len(_KeepAlive.connections) == 1
    finally:
        server.shutdown()
        server.server_close()


def test_a_service_gauge_is_set_only_when_its_value_changes_and_always_shows_the_last(monkeypatch):
    from specfleet.operator.control import telemetry

    metrics, sets = telemetry.ServiceMetrics("idle-cost", "chat"), []
    child = metrics(telemetry.TARGET, "ttft")
    monkeypatch.setattr(child, "set", lambda value, real=child.set: (sets.append(value), real(value)))
    for value in (2.0, 2.0, 2.0, 0.5, 0.5, 2.0):
        metrics.set(telemetry.TARGET, value, "ttft")
    assert sets == [2.0, 0.5, 2.0]
    shown = telemetry.REGISTRY.get_sample_value("specfleet_slo_target_seconds",
                                                {"namespace": "idle-cost", "name": "chat", "metric": "ttft"})
    assert shown == 2.0
    metrics.set(telemetry.TARGET, 1.5, "itl")      # another label set is another gauge
    assert telemetry.REGISTRY.get_sample_value("specfleet_slo_target_seconds",
                                               {"namespace": "idle-cost", "name": "chat", "metric": "itl"}) == 1.5
