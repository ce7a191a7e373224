"""The real operator against the API emulator, for end-to-end tests (tests/operator/test_operator_e2e.py,
test_worker_limit.py): kubectl and the kubernetes client on one emulator (`Cluster`), `specfleet operator
run` as a child process (`Operator`), the CPU example as an InferenceService (`example`), and `wait_for`."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml
from testkit import interrupt

from specfleet.operator import api

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NS = "e2e"
CPU_EXAMPLE = ROOT / "manifests/examples/smollm2-cpu.yaml"


def wait_for(probe, timeout: float = 20.0, every: float = 0.2):
    """Poll `probe` until it returns something truthy; fail with its last value."""
    deadline, value = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            value = probe()
        except Exception as exc:  # noqa: BLE001  (the object may not exist yet)
            value = exc
        if value and not isinstance(value, Exception):
            return value
        time.sleep(every)
    raise AssertionError(f"timed out; last value: {value!r}")


class Cluster:
    """kubectl and the kubernetes client against one emulator."""

    def __init__(self, kubeconfig: Path):
        from kubernetes import client, config

        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        api_client = config.new_client_from_config(str(kubeconfig))
        self.apps = client.AppsV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.policy = client.PolicyV1Api(api_client)
        self.networking = client.NetworkingV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.ApiException = client.ApiException

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(BIN / "kubectl"), *args], input=stdin, capture_output=True, text=True,
                              env=self.env, timeout=30)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stderr}")
        return proc

    def apply(self, doc: dict, check: bool = True) -> subprocess.CompletedProcess:
        return self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(doc), check=check)

    def service(self, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(api.GROUP, api.VERSION, NS, api.PLURAL, name)

    def deployment(self, name: str) -> dict | None:
        try:
            return self.apps.read_namespaced_deployment(name, NS, _preload_content=False).json()
        except self.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def args(self, name: str) -> list[str] | None:
        dep = self.deployment(name)
        return dep and dep["spec"]["template"]["spec"]["containers"][0]["args"]

    def events(self, name: str) -> list[dict]:
        items = self.core.list_namespaced_event(NS, _preload_content=False).json()["items"]
        return [e for e in items if e.get("involvedObject", {}).get("name") == name]


class Operator:
    """`specfleet operator run --namespace e2e` as a child process."""

    def __init__(self, env: dict, log: Path):
        self.env, self.log, self.proc = env, log, None

    def start(self) -> None:
        command = [str(BIN / "specfleet"), "operator", "run", "--namespace", NS]
        self.proc = subprocess.Popen(command, env=self.env, stdout=self.log.open("ab"), stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def stop(self) -> None:
        interrupt(self.proc, timeout=15)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def example(name: str, **slo) -> dict:
    doc = yaml.safe_load(CPU_EXAMPLE.read_text())
    doc["metadata"] = {"name": name, "namespace": NS}
    doc["spec"]["slo"].update(slo)
    return doc
