"""The real kopf, as a subprocess, runs a tiny operator against the emulator: create, update, status patch,
delete with a finalizer, and restart + resume."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testkit import interrupt

from tests.cluster.conftest import WIDGETS, widget

SCRIPT = Path(__file__).parent / "kopf_operator.py"


class Kopf:
    def __init__(self, api, tmp_path: Path):
        self.env = {**os.environ, "KUBECONFIG": str(api.kubeconfig), "EVENTS_FILE": str(tmp_path / "events")}
        self.events = tmp_path / "events"
        self.log = tmp_path / "kopf.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "kopf", "run", "--standalone", "-n", "default",
                                      str(SCRIPT)], env=self.env, stdout=open(self.log, "a"),
                                     stderr=subprocess.STDOUT)

    def stop(self) -> None:
        interrupt(self.proc, timeout=10)

    def seen(self) -> list[str]:
        return self.events.read_text().splitlines() if self.events.exists() else []

    def wait_for(self, line: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if line in self.seen():
                return
            time.sleep(0.1)
        raise AssertionError(f"kopf never logged {line!r}: {self.seen()}\n{self.log.read_text()[-3000:]}")


@pytest.fixture
def kopf_operator(api, tmp_path):
    operator = Kopf(api, tmp_path)
    yield operator
    operator.stop()


def eventually(check, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def test_kopf_operator_lifecycle(http, crd, kopf_operator):
    kopf_operator.start()
    http.ok("post", WIDGETS, widget("w1"))
    kopf_operator.wait_for("create w1 small")
    assert eventually(lambda: http.ok("get", WIDGETS + "/w1").get("status", {}).get("phase") == "Created")
    obj = http.ok("get", WIDGETS + "/w1")
    assert obj["status"]["created"] == {"size": "small"}
    assert "example.specfleet.io/finalizer" in obj["metadata"]["finalizers"]

    http.ok("patch", WIDGETS + "/w1", {"spec": {"size": "large"}})
    kopf_operator.wait_for("update w1 small->large")
    assert eventually(lambda: http.ok("get", WIDGETS + "/w1")["status"]["phase"] == "Resized-large")

    kopf_operator.stop()
    http.ok("post", WIDGETS, widget("w2"))
    kopf_operator.start()
    kopf_operator.wait_for("resume w1")
    kopf_operator.wait_for("create w2 small")

    http.ok("delete", WIDGETS + "/w1")
    kopf_operator.wait_for("delete w1")
    assert eventually(lambda: http.get(WIDGETS + "/w1")[0] == 404)
    events = lambda: http.ok("get", "/api/v1/namespaces/default/events")["items"]
    assert eventually(lambda: any(e["involvedObject"]["name"] == "w1" for e in events())), \
        (events(), kopf_operator.log.read_text()[-3000:])
