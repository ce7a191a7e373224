"""The wheel installs like a real package: built from the checkout, installed into a fresh virtual
environment outside it, `specfleet plan -f` reads an example manifest shipped in the wheel and
`specfleet up` (CRD and manifests read with importlib.resources) serves a tiny model, then stops cleanly.

The fresh environment gets its dependencies (torch and the rest) from the development environment
through a `.pth` file naming that site-packages folder as a plain path (plain paths do not run the
editable install's finder), and the wheel itself is installed with `--no-deps`."""
from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import urllib.request
from pathlib import Path

import pytest
import yaml

from testkit import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
LOCAL_ONLY = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".specfleet", ".cache", ".pytest_cache")

pytestmark = pytest.mark.slow


def sh(*argv, cwd: Path, timeout: float = 300) -> str:
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{argv}: {proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"    # a copy: setuptools builds in the source tree, whose build/ would go stale
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*LOCAL_ONLY))
    sh(BIN / "pip", "wheel", "-q", "--no-deps", *build_flags(), "-w", work / "dist", source, cwd=work)
    wheel = next((work / "dist").glob("specfleet-*.whl"))
    venv = work / "venv"
    sh(sys.executable, "-m", "venv", "--without-pip", venv, cwd=work)
    site = Path(sh(venv / "bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                   cwd=work).strip())
    (site / "dev-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    sh(BIN / "pip", "--python", venv / "bin/python", "install", "-q", "--no-deps", wheel, cwd=work)
    return venv


def build_flags() -> list[str]:
    """Build with this environment's setuptools when it is recent enough (nothing to download), else in
    pip's isolated build environment."""
    try:
        major = int(importlib.metadata.version("setuptools").split(".")[0])
    except importlib.metadata.PackageNotFoundError:
        return []
    return ["--no-build-isolation"] if major >= 77 else []


def test_the_fresh_environment_imports_specfleet_from_the_wheel(fresh_venv, tmp_path):
    out = sh(fresh_venv / "bin/python", "-c", "import specfleet.cluster.fleet as f, specfleet.operator.api as a; "
             "from specfleet.cluster import resources as r; print(f.__file__); print(a.__file__); "
             "print(r.default_cr()); print(r.crd_text().count('kind: CustomResourceDefinition'))", cwd=tmp_path)
    fleet_file, api_file, default_cr, crds = out.split()
    assert all(Path(p).is_relative_to(fresh_venv) for p in (fleet_file, api_file, default_cr)), out
    assert crds == "1"


def test_the_wheel_ships_the_simulator_and_its_derived_profiles(fresh_venv, tmp_path):
    out = sh(fresh_venv / "bin/python", "-c", "from specfleet.sim import truth as t; "
             "print(t.find_profile('llama-3.1-8b', 'nvidia-h100-80gb')); print(t.find_profile('smollm2-135m', 'cpu'))",
             cwd=tmp_path)
    derived, measured = out.split()
    assert Path(derived).is_relative_to(fresh_venv) and Path(derived).parent.name == "profiles", out
    assert Path(measured).is_relative_to(fresh_venv) and "catalogs" in Path(measured).parts, out


def test_up_reads_the_operator_and_gateway_manifests_and_their_rbac_from_the_wheel(fresh_venv, tmp_path):
    out = sh(fresh_venv / "bin/python", "-c", "from specfleet.cluster import manifest_commands as m, service_accounts "
             "as s; print(m.manifest(m.OPERATOR)); "
             "print(' '.join(sorted({o['kind'] for o in s.rbac_objects()}))); "
             "print(m.operator_command(m.Local()).args[:2], m.gateway_command(m.Local()).args[:2])", cwd=tmp_path)
    operator_yaml, kinds, commands = out.splitlines()
    assert Path(operator_yaml).is_relative_to(fresh_venv), out
    assert kinds == "ClusterRole ClusterRoleBinding Namespace Role RoleBinding ServiceAccount"
    assert commands == "('operator', 'run') ('gateway', 'run')"


def test_plan_reads_an_example_shipped_in_the_wheel(fresh_venv, tmp_path):
    site = Path(sh(fresh_venv / "bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                   cwd=tmp_path).strip())
    example = site / "specfleet/manifests/examples/smollm2-cpu.yaml"
    out = sh(fresh_venv / "bin/specfleet", "plan", "-f", example, "-o", "yaml", cwd=tmp_path)
    planned = yaml.safe_load(out)
    assert planned["name"] == "smollm2-cpu" and planned["replicas"] >= 1, out


def test_up_serves_from_the_fresh_environment_and_stops_cleanly(fresh_venv, tmp_path, tiny_llama):
    doc = yaml.safe_load((ROOT / "manifests/examples/tiny-cpu.yaml").read_text())
    doc["spec"]["model"]["source"] = f"hostpath:{tiny_llama}"
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(doc))
    port = free_port()
    with open(tmp_path / "up.log", "w") as log:
        proc = subprocess.Popen([str(fresh_venv / "bin/specfleet"), "up", "-f", "tiny.yaml", "--port", str(port),
                                 "--plain"], cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "SPECFLEET_NODE_CPUS": "8", "SPECFLEET_NODE_MEMORY": "64Gi"})
    try:
        def ready() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as response:
                return any(m["specfleet"]["readyReplicas"] for m in json.loads(response.read())["data"])

        wait_for(lambda: proc.poll() is None and ready(), timeout=90, every=0.5)
        info = json.loads((tmp_path / ".specfleet/fleet.json").read_text())
        for pid in (info["operatorPid"], info["gatewayPid"]):
            assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode().startswith(str(fresh_venv))
        proc.send_signal(signal.SIGINT)
        assert proc.wait(40) == 0
        assert not (tmp_path / ".specfleet/fleet.json").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
        print((tmp_path / "up.log").read_text()[-3000:])
