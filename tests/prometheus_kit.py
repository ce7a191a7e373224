"""A real Prometheus server for tests: started on a free loopback port with a given scrape config and
its own data folder, stopped (with its process group) however the test ends; and the shipped Grafana
dashboard's queries, with its template variables substituted as Grafana would."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
import yaml


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


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is not on PATH: .ci/run installs the Debian prometheus package")
        pytest.skip("prometheus is not on PATH (apt-get install prometheus)")
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
    """One Prometheus on a fixed port and data folder, which a test may stop (SIGKILL: no clean shutdown)
    and start again."""

    def __init__(self, folder: Path, config: dict | None = None, port: int | None = None):
        self.folder, self.port = folder, port or free_port()
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config or {"global": {"scrape_interval": "1s"}}))
        self.server = Prometheus(f"http://127.0.0.1:{self.port}")
        self.proc: subprocess.Popen | None = None

    def start(self) -> Prometheus:
        log = open(self.folder / "prometheus.log", "ab")
        self.proc = subprocess.Popen([prometheus_binary(), f"--config.file={self.folder / 'prometheus.yml'}",
                                      f"--storage.tsdb.path={self.folder / 'data'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.server.url}/-/ready", timeout=1).close()
                return self.server
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"prometheus did not start: {(self.folder / 'prometheus.log').read_text()[-2000:]}")
                time.sleep(0.2)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@contextmanager
def running_prometheus(folder: Path, config: dict | None = None, port: int | None = None) -> Iterator[Prometheus]:
    process = PrometheusProcess(folder, config, port)
    try:
        yield process.start()
    finally:
        process.stop()
