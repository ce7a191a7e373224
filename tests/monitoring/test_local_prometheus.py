"""The local fleet's Prometheus (cluster/prometheus.py) selects and labels pods as the shipped PodMonitors
do, loads the shipped rules, and scrapes what the targets file names."""
from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from urllib.parse import urlparse

import pytest

from prometheus_kit import prometheus_binary
from specfleet.cluster import prometheus
from specfleet.operator import render
from testkit import free_port

ENGINE_LABELS = render.labels("chat")


def pod(name: str, labels: dict, port_name: str = "http", port: int = 8000, ip: str | None = "127.0.0.7") -> dict:
    return {"metadata": {"name": name, "namespace": "prod", "labels": labels},
            "spec": {"containers": [{"name": "engine", "ports": [{"name": port_name, "containerPort": port}]}]},
            "status": {"podIP": ip} if ip else {}}


def test_the_shipped_pod_monitors_are_read():
    monitors = {m.name: m for m in prometheus.pod_monitors()}
    engines = monitors["specfleet-engines"]
    assert engines.port == "http" and engines.path == "/metrics"
    assert engines.relabel == (("specfleet_io_inferenceservice", "inferenceservice"),)     # discovery-sanitized
    assert monitors["specfleet-operator"].match_labels == {"app.kubernetes.io/name": "specfleet-operator"}


def test_engine_pods_become_targets_labelled_as_the_pod_monitor_labels_them():
    entries = prometheus.targets([pod("chat-0", ENGINE_LABELS), pod("other", {"app": "x"}),
                                  pod("chat-pending", ENGINE_LABELS, ip=None),
                                  pod("chat-no-http", ENGINE_LABELS, port_name="grpc")], prometheus.pod_monitors())
    assert len(entries) == 1
    (entry,) = entries
    assert entry["targets"] == ["127.0.0.7:8000"]
    assert entry["labels"] == {"namespace": "prod", "pod": "chat-0", "container": "engine", "endpoint": "http",
                               "job": "specfleet-system/specfleet-engines", "__metrics_path__": "/metrics",
                               "inferenceservice": "chat"}
    # The operator's label set, as manifests/operator.yaml labels its pod template.
    operator = prometheus.targets([pod("op-0", {"app.kubernetes.io/name": "specfleet-operator"}, "metrics", 9090)],
                                  prometheus.pod_monitors())
    assert operator[0]["labels"]["job"] == "specfleet-system/specfleet-operator"


def test_an_unsupported_relabeling_is_refused():
    text = """
kind: PodMonitor
metadata: {name: m, namespace: n}
spec:
  selector: {matchLabels: {a: b}}
  podMetricsEndpoints:
    - port: http
      relabelings: [{sourceLabels: [__address__], targetLabel: x, action: replace}]
"""
    with pytest.raises(ValueError, match="only pod-label copies"):
        prometheus.pod_monitors(text)


def test_the_targets_file_is_rewritten_only_on_change(tmp_path):
    path = tmp_path / "targets.json"
    entries = prometheus.targets([pod("chat-0", ENGINE_LABELS)], prometheus.pod_monitors())
    assert prometheus.write_targets(path, entries) is True
    assert prometheus.write_targets(path, entries) is False
    assert json.loads(path.read_text()) == entries


@pytest.mark.slow
def test_the_local_prometheus_loads_the_rules_and_scrapes_the_targets(tmp_path, fake_engine_pods):
    prometheus_binary()                       # skips (or fails in CI) without it
    _, urls = fake_engine_pods(1)
    address = urlparse(next(iter(urls.values())))
    local = prometheus.LocalPrometheus(tmp_path, free_port(), interval="1s")
    stand_in = pod("chat-0", ENGINE_LABELS, port=address.port, ip=address.hostname)
    prometheus.write_targets(local.targets_file, prometheus.targets([stand_in], prometheus.pod_monitors()))
    promtool = shutil.which("promtool")
    local.start()
    try:
        if promtool:
            check = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                                   capture_output=True, text=True)
            assert check.returncode == 0, check.stdout + check.stderr
        rules = json.loads(urllib.request.urlopen(f"{local.url}/api/v1/rules").read())["data"]["groups"]
        assert {g["name"] for g in rules} >= {"specfleet-slo-burn-rate", "specfleet-slo-alerts"}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            query = urllib.parse.quote('vllm:num_requests_running{inferenceservice="chat",pod="chat-0"}')
            result = json.loads(urllib.request.urlopen(f"{local.url}/api/v1/query?query={query}").read())
            if result["data"]["result"]:
                assert result["data"]["result"][0]["metric"]["job"] == "specfleet-system/specfleet-engines"
                break
            time.sleep(0.5)
        else:
            raise AssertionError("the stand-in was never scraped")
    finally:
        local.stop()
    assert local.proc.poll() is not None
