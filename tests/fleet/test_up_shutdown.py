"""However `specfleet up` ends, nothing it started keeps running: Ctrl-C, SIGTERM, SIGHUP (the terminal
closed), its stdout closed (`specfleet up | tee up.log`, then Ctrl-C to the whole pipeline), and even
SIGKILL (its children die with it). Each case starts a real fleet (tiny random model), waits until the
operator, the gateway and an engine process run, ends `up` that way and checks that every one of them is gone."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml

from testkit import BIN, alive, free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
TINY_CR = ROOT / "manifests/examples/tiny-cpu.yaml"

NODE = {"SPECFLEET_NODE_CPUS": "8", "SPECFLEET_NODE_MEMORY": "64Gi"}   # the engine fits whatever it requests

pytestmark = pytest.mark.slow


@pytest.fixture
def tiny_cr(tmp_path, tiny_llama) -> Path:
    doc = yaml.safe_load(TINY_CR.read_text())
    doc["spec"]["model"]["source"] = f"hostpath:{tiny_llama}"
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def running_children(state: Path) -> tuple[int, set[int]]:
    """(pid of `up`, pids of the operator, the gateway and the engine processes), once an engine process runs."""
    info = json.loads((state / "fleet.json").read_text())
    with urllib.request.urlopen(info["api"] + "/api/v1/pods", timeout=5) as response:
        pods = json.loads(response.read())["items"]
    engines = {int(s["containerID"].removeprefix("local://")) for p in pods
               for s in (p.get("status") or {}).get("containerStatuses") or [] if s.get("containerID")}
    assert engines, "no engine process yet"
    return info["pid"], {info["operatorPid"], info["gatewayPid"], *engines}


def start(workdir: Path, cr: Path, pipeline: bool) -> subprocess.Popen:
    argv = [str(BIN / "specfleet"), "up", "-f", str(cr), "--port", str(free_port()), "--plain"]
    if pipeline:   # a shell pipeline in its own process group, as a terminal runs it
        command = " ".join(argv) + " | tee up.log >/dev/null"
        return subprocess.Popen(["bash", "-c", command], cwd=workdir, start_new_session=True,
                                env={**os.environ, **NODE})
    return subprocess.Popen(argv, cwd=workdir, stdout=open(workdir / "up.log", "w"), stderr=subprocess.STDOUT,
                            env={**os.environ, **NODE})


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "SIGHUP", "stdout closed", "SIGKILL"])
def test_up_leaves_nothing_running_however_it_ends(tmp_path, tiny_cr, how):
    proc = start(tmp_path, tiny_cr, pipeline=how == "stdout closed")
    try:
        up, children = wait_for(lambda: running_children(tmp_path / ".specfleet"), timeout=60, every=0.3)
        if how == "stdout closed":
            os.killpg(proc.pid, signal.SIGINT)          # Ctrl-C reaches tee too: up's stdout closes under it
        else:
            os.kill(up, getattr(signal, how))
        proc.wait(40)
        wait_for(lambda: not alive(up) and not any(alive(pid) for pid in children), timeout=15)
        if how.startswith("SIG") and how != "SIGKILL":
            assert proc.returncode == 0
        if how != "SIGKILL":                            # a clean exit also cleans the state folder
            assert not (tmp_path / ".specfleet/fleet.json").exists()
            assert list((tmp_path / ".specfleet/pids").iterdir()) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run([str(BIN / "specfleet"), "down"], cwd=tmp_path, capture_output=True, timeout=60)
        print((tmp_path / "up.log").read_text()[-3000:] if (tmp_path / "up.log").exists() else "")
