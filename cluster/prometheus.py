"""A Prometheus for the local fleet, configured from the cluster's own monitoring manifests.

On a cluster the Prometheus Operator turns the PodMonitors in `manifests/grafana/podmonitor.yaml` into
scrape targets and `manifests/prometheus/rules.yaml` into rules. Here, `targets(pods, monitors)` does
the same selection and labelling in Python (each monitor's `matchLabels`, its container port by name,
its path, its relabelings from pod labels, and the Operator's `namespace`/`pod`/`container`/`job`
labels) and `specfleet up` writes the result as a `file_sd` file whenever its pods change, so the local
scrape config cannot drift from the PodMonitors. Debian's `prometheus` has no Kubernetes discovery, which
is why the targets come through a file.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from specfleet.cluster import resources

MANIFESTS = "specfleet.manifests"
POD_MONITORS = "grafana/podmonitor.yaml"
RULES = "prometheus/rules.yaml"
LABEL_META = "__meta_kubernetes_pod_label_"


@dataclass(frozen=True)
class PodMonitor:
    """What one PodMonitor selects and how it labels a target."""

    namespace: str
    name: str
    match_labels: dict[str, str]
    port: str
    path: str
    interval: str
    relabel: tuple[tuple[str, str], ...]        # (pod label, target label)

    def selects(self, pod: dict) -> bool:
        labels = pod["metadata"].get("labels") or {}
        return all(labels.get(k) == v for k, v in self.match_labels.items())


def pod_monitors(text: str | None = None) -> list[PodMonitor]:
    """The PodMonitors of `manifests/grafana/podmonitor.yaml` (the installed package's copy by default)."""
    text = text if text is not None else resources.data_file(MANIFESTS, POD_MONITORS).read_text()
    return [_monitor(doc) for doc in yaml.safe_load_all(text) if doc and doc.get("kind") == "PodMonitor"]


def _monitor(doc: dict) -> PodMonitor:
    endpoint = doc["spec"]["podMetricsEndpoints"][0]
    relabel = []
    for rule in endpoint.get("relabelings") or []:
        (source,) = rule["sourceLabels"]
        if not source.startswith(LABEL_META) or rule.get("action", "replace") != "replace":
            raise ValueError(f"PodMonitor {doc['metadata']['name']}: only pod-label copies are supported, got {rule}")
        relabel.append((source.removeprefix(LABEL_META), rule["targetLabel"]))
    return PodMonitor(doc["metadata"]["namespace"], doc["metadata"]["name"],
                      dict(doc["spec"]["selector"]["matchLabels"]), endpoint["port"],
                      endpoint.get("path", "/metrics"), endpoint.get("interval", "30s"), tuple(relabel))


def _sanitized(label: str) -> str:
    """A pod label as Kubernetes discovery names it (`specfleet.io/x` -> `specfleet_io_x`)."""
    return "".join(c if c.isalnum() else "_" for c in label)


def targets(pods: list[dict], monitors: list[PodMonitor]) -> list[dict]:
    """`file_sd` entries for every running pod a monitor selects, one per matching container port."""
    out = []
    for monitor in monitors:
        for pod in pods:
            ip = (pod.get("status") or {}).get("podIP")
            if not ip or not monitor.selects(pod):
                continue
            labels = {_sanitized(k): v for k, v in (pod["metadata"].get("labels") or {}).items()}
            for container in pod["spec"].get("containers") or []:
                for port in container.get("ports") or []:
                    if port.get("name") != monitor.port:
                        continue
                    entry = {"namespace": pod["metadata"]["namespace"], "pod": pod["metadata"]["name"],
                             "container": container["name"], "endpoint": monitor.port,
                             "job": f"{monitor.namespace}/{monitor.name}", "__metrics_path__": monitor.path}
                    entry.update({target: labels[source] for source, target in monitor.relabel
                                  if source in labels})
                    out.append({"targets": [f"{ip}:{port['containerPort']}"], "labels": entry})
    return sorted(out, key=lambda e: (e["labels"]["job"], e["labels"]["namespace"], e["labels"]["pod"]))


def write_targets(path: Path, entries: list[dict]) -> bool:
    """Replace the targets file atomically; False when it already held exactly these."""
    text = json.dumps(entries, indent=1, sort_keys=True)
    if path.exists() and path.read_text() == text:
        return False
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return True


def config(targets_file: Path, rules_file: Path, interval: str = "5s") -> dict:
    """The scrape config: every target from the file (each carries its job and path), and the rules."""
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(rules_file)],
            # A target's own `job` and `__metrics_path__` labels win over the scrape config's defaults.
            "scrape_configs": [{"job_name": "specfleet", "honor_labels": True,
                                "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "2s"}]}]}


def rule_groups(text: str | None = None) -> dict:
    """The PrometheusRule's groups, as the plain rule file Prometheus reads."""
    text = text if text is not None else resources.data_file(MANIFESTS, RULES).read_text()
    return yaml.safe_load(text)["spec"]


class LocalPrometheus:
    """The fleet's Prometheus: its folder (config, rules, targets, data, log) and its process."""

    def __init__(self, folder: Path, port: int, host: str = "127.0.0.1", interval: str = "2s"):
        self.folder, self.port, self.host, self.interval = folder, port, host, interval
        self.targets_file = folder / "targets.json"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @staticmethod
    def binary() -> str | None:
        return shutil.which("prometheus")

    def start(self, timeout: float = 30.0, preexec_fn=None) -> None:
        """The fleet's configuration: the shipped rules, and targets from `targets_file`."""
        self.folder.mkdir(parents=True, exist_ok=True)
        rules = self.folder / "rules.yml"
        rules.write_text(yaml.safe_dump(rule_groups(), sort_keys=False))
        if not self.targets_file.exists():
            write_targets(self.targets_file, [])
        self.run(config(self.targets_file, rules, self.interval), timeout, preexec_fn)

    def run(self, scrape_config: dict, timeout: float = 30.0, preexec_fn=None) -> None:
        """Start with `scrape_config` as prometheus.yml (again after `stop`: same port, same data); return
        once it answers /-/ready."""
        binary = self.binary()
        if binary is None:
            raise FileNotFoundError("prometheus is not on PATH (Debian: apt-get install prometheus)")
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "prometheus.yml").write_text(yaml.safe_dump(scrape_config))
        with open(self.folder / "prometheus.log", "ab") as log:
            self.proc = subprocess.Popen([binary, f"--config.file={self.folder / 'prometheus.yml'}",
                                          f"--storage.tsdb.path={self.folder / 'data'}",
                                          f"--web.listen-address={self.host}:{self.port}"],
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         stdin=subprocess.DEVNULL, preexec_fn=preexec_fn)
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    tail = (self.folder / "prometheus.log").read_text(errors="replace")[-1000:]
                    raise RuntimeError(f"prometheus did not start: {tail}")
                time.sleep(0.2)

    def stop(self, grace: float = 10.0, sig: int = signal.SIGTERM) -> None:
        """End it (SIGKILL: without a clean shutdown, as a crash), SIGKILL after `grace` seconds."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


async def follow_pods(api_url: str, token: str, local: LocalPrometheus, also: list[dict],
                      every_s: float = 1.0) -> None:
    """Keep `local`'s targets file equal to what the PodMonitors select among the emulator's pods (plus
    `also`: pods that run outside the emulator, such as the local operator), until cancelled."""
    import asyncio
    import logging

    from specfleet.cluster.api_client import ApiClient

    monitors = pod_monitors()
    async with ApiClient(api_url, user_agent="specfleet-up-prometheus", token=token) as api:
        while True:
            try:
                pods = await api.list("Pod")
                write_targets(local.targets_file, targets(pods + also, monitors))
            except Exception as exc:      # noqa: BLE001  (the emulator stopping under us; try again)
                logging.getLogger("specfleet.up").debug("prometheus targets: %s", exc)
            await asyncio.sleep(every_s)


def pod_of(deployment_text: str, host: str, ports: dict[str, int]) -> dict:
    """A stand-in Pod for a Deployment that `up` runs as a local process: its template's labels, `host`
    as its address, and its named container ports at the local ones in `ports`."""
    doc = yaml.safe_load(deployment_text)
    template = doc["spec"]["template"]
    container = template["spec"]["containers"][0]
    return {"metadata": {"name": f"{doc['metadata']['name']}-local-0",
                         "namespace": doc["metadata"].get("namespace", "default"),
                         "labels": dict(template["metadata"].get("labels") or {})},
            "spec": {"containers": [{"name": container["name"],
                                     "ports": [{"name": n, "containerPort": p} for n, p in ports.items()]}]},
            "status": {"podIP": host}}
