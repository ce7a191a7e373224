"""A real Prometheus server for tests: started on a free loopback port with a given scrape config and
its own data folder, stopped (with its process group) however the test ends; and the shipped Grafana
dashboard's queries, with its template variables substituted as Grafana would."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from specfleet.cluster.prometheus import LocalPrometheus
from testkit import free_port

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "manifests/grafana/dashboard.json"
VARIABLE = re.compile(r"\$\{?(\w+)\}?")


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panel_queries() -> list[tuple[str, str]]:
    """(where, expr) for every target of every panel."""
    return [(f"{p['title']} [{t['refId']}]", t["expr"]) for p in dashboard()["panels"] for t in p.get("targets", [])]


def variable_queries() -> list[tuple[str, str]]:
    """(variable, the series selector of its `label_values(selector, label)` query)."""
    out = []
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            inner = re.fullmatch(r"label_values\((.*), *\w+\)", variable["query"])
            out.append((variable["name"], inner.group(1)))
    return out


def substituted(expr: str, values: dict[str, str] | None = None) -> str:
    """`expr` with each `$var` as Grafana sends it: a value given here, else `.*` ('All' of a regex matcher)."""
    return VARIABLE.sub(lambda m: (values or {}).get(m.group(1), ".*"), expr)


def required_binary(name: str) -> str:
    """The path of `prometheus` or `promtool`: skipped without it here, a failure in CI (.ci/run installs
    Debian's prometheus package, which has both)."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not on PATH: .ci/run installs the Debian prometheus package")
        pytest.skip(f"{name} is not on PATH (apt-get install prometheus)")
    return path


def prometheus_binary() -> str:
    return required_binary("prometheus")


class Prometheus:
    def __init__(self, url: str):
        self.url = url

    def query(self, expr: str) -> dict:
        """The `/api/v1/query` reply; a PromQL error comes back as {"status": "error", "error": ...}."""
        data = urllib.parse.urlencode({"query": expr}).encode()
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/query", data=data, timeout=10) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            return json.loads(exc.read())


class PrometheusProcess:
    """The fleet's Prometheus runner (cluster/prometheus.py) with a test's own scrape config, on a fixed port
    and data folder, which a test may stop (SIGKILL: no clean shutdown) and start again."""

    def __init__(self, folder: Path, config: dict | None = None, port: int | None = None):
        self.config = config or {"global": {"scrape_interval": "1s"}}
        self.local = LocalPrometheus(folder, port or free_port())
        self.server = Prometheus(self.local.url)

    def start(self) -> Prometheus:
        prometheus_binary()                  # skips here (fails in CI) without it
        self.local.run(self.config)
        return self.server

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.local.stop(sig=sig)


@contextmanager
def running_prometheus(folder: Path, config: dict | None = None, port: int | None = None) -> Iterator[Prometheus]:
    process = PrometheusProcess(folder, config, port)
    try:
        yield process.start()
    finally:
        process.stop()
