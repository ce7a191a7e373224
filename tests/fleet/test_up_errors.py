"""`specfleet up` refuses bad starts with one clear line and a non-zero exit, and leaves nothing behind."""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TINY_CR = ROOT / "manifests/examples/tiny-cpu.yaml"


def up(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "specfleet"), "up", "--plain", *args], cwd=workdir, capture_output=True,
                          text=True, timeout=60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_refused(proc: subprocess.CompletedProcess, workdir: Path, words: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and proc.stdout == "", proc.stderr
    assert lines[0].startswith("specfleet up: ") and words in lines[0]
    state = workdir / ".specfleet"
    assert not (state / "fleet.json").exists() and not (state / "pids").exists()


@pytest.fixture
def tiny_cr(tmp_path, tiny_llama):
    def write(**model) -> Path:
        doc = yaml.safe_load(TINY_CR.read_text())
        doc["spec"]["model"].update({"source": f"hostpath:{tiny_llama}", **model})
        path = tmp_path / "cr.yaml"
        path.write_text(yaml.safe_dump(doc))
        return path
    return write


def test_a_port_in_use_is_refused(tmp_path, tiny_cr):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = up(tmp_path, "-f", str(tiny_cr()), "--port", str(port))
    assert_refused(proc, tmp_path, f"port {port} is already in use")


def test_a_missing_model_is_refused(tmp_path, tiny_cr):
    proc = up(tmp_path, "-f", str(tiny_cr(source="hostpath:/no/such/model")), "--port", str(free_port()))
    assert_refused(proc, tmp_path, "model not found for tiny-cpu: hostpath:/no/such/model")


@pytest.mark.parametrize("text, words", [
    ("apiVersion: specfleet.io/v1alpha1\nkind: InferenceService\nmetadata: {name: x\nspec: [\n", "broken CR file"),
    ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "no InferenceService"),
    ("apiVersion: specfleet.io/v1alpha1\nkind: InferenceService\nmetadata: {name: x}\nspec: {model: {name: m}}\n",
     "invalid InferenceService x"),
])
def test_a_broken_cr_file_is_refused(tmp_path, text, words):
    cr = tmp_path / "cr.yaml"
    cr.write_text(text)
    assert_refused(up(tmp_path, "-f", str(cr), "--port", str(free_port())), tmp_path, words)


def test_a_node_size_that_is_not_a_quantity_is_refused(tmp_path, tiny_cr):
    proc = up(tmp_path, "-f", str(tiny_cr()), "--port", str(free_port()), "--node-memory", "lots")
    assert_refused(proc, tmp_path, "--node-cpus/--node-memory: not a resource quantity: 'lots'")


def test_without_a_file_up_serves_the_builtin_smollm2_on_cpu(tmp_path):
    from specfleet.cluster import fleet, resources

    docs = fleet.load_manifests([resources.default_cr()])
    assert resources.default_cr().name == "smollm2-cpu.yaml"
    spec = docs[0]["spec"]
    assert (spec["model"]["source"], spec["accelerator"]["type"]) == ("builtin:smollm2-135m", "cpu")


def test_down_without_a_fleet_says_so(tmp_path):
    proc = subprocess.run([str(BIN / "specfleet"), "down"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0 and "not running" in proc.stdout
    status = subprocess.run([str(BIN / "specfleet"), "status"], cwd=tmp_path, capture_output=True, text=True)
    assert status.returncode == 1 and "not running" in status.stderr
