"""One version: pyproject.toml's. Every image that `kubectl apply -k manifests/` runs and every image the
operator puts in an engine pod is one that a Dockerfile in images/ builds, under that version; the
Makefile's `make images` / `make kind-load` build and load exactly those, and the README's cluster path
spells out the same commands."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from images_kit import ROOT, images, project_version
from specfleet.operator import api, catalogs, planner, render

BIN = Path(sys.executable).parent
REGISTRY = "ghcr.io/specfleet/"


def built() -> set[str]:
    """`name:tag` of every image a Dockerfile in images/ builds."""
    return {image.reference for image in images().values()}


def container_images(doc: dict) -> list[str]:
    pod = doc.get("spec", {}).get("template", {}).get("spec", {})
    return [c["image"] for key in ("containers", "initContainers") for c in pod.get(key, [])]


def rendered(example: str, **runtime) -> list[dict]:
    doc = yaml.safe_load((ROOT / "manifests/examples" / example).read_text())
    doc["spec"]["runtime"] |= runtime
    spec = api.parse_spec(doc["spec"])
    plan = planner.plan(spec, catalogs.gpus(), catalogs.models(), catalogs.profiles())
    return render.render(doc["metadata"]["name"], "default", spec, plan)


def test_each_dockerfile_declares_one_image_of_this_project_under_the_project_version():
    found = images()
    assert sorted(found) == ["engine", "gateway", "operator"]
    for component, image in found.items():
        assert image.name == REGISTRY + component
        assert image.tag == project_version(), f"images/{component}.Dockerfile's build comment is {image.tag}"


@pytest.mark.skipif(shutil.which("kubectl", path=str(BIN)) is None, reason="kubectl not installed")
def test_every_image_the_install_runs_is_built_here_under_the_project_version():
    out = subprocess.run([str(BIN / "kubectl"), "kustomize", str(ROOT / "manifests")],
                         capture_output=True, text=True, check=True).stdout
    referenced = [i for doc in yaml.safe_load_all(out) if doc for i in container_images(doc)]
    assert sorted(referenced) == sorted({f"{REGISTRY}operator:{project_version()}",
                                         f"{REGISTRY}gateway:{project_version()}"})
    assert set(referenced) <= built()


@pytest.mark.parametrize("example", ["tiny-cpu.yaml", "smollm2-cpu.yaml", "code-8b-speculative.yaml"])
def test_the_specfleet_runtime_s_pods_run_the_engine_image_under_the_project_version(example):
    deployment = rendered(example, engine="specfleet")[0]
    pod_images = container_images(deployment)
    assert set(pod_images) == {f"{REGISTRY}engine:{project_version()}"} <= built()


def test_an_hf_model_s_fetch_container_runs_the_engine_image_too():
    pod = rendered("code-8b-speculative.yaml", engine="specfleet")[0]["spec"]["template"]["spec"]
    fetch = [c for c in pod.get("initContainers", []) if c["command"][0] == "hf"]
    assert fetch and {c["image"] for c in fetch} == {images()["engine"].reference}


def test_the_vllm_runtime_runs_vllm_s_own_image_not_one_built_here():
    deployment = rendered("smollm2-cpu.yaml", engine="vllm")[0]
    assert container_images(deployment) == [render.VLLM_IMAGE]
    assert render.VLLM_IMAGE.startswith("vllm/vllm-openai:") and render.VLLM_IMAGE not in built()


def test_a_runtime_image_in_the_spec_wins():
    assert container_images(rendered("tiny-cpu.yaml", image="example.com/mine:1")[0]) == ["example.com/mine:1"]


def make_dry_run(target: str) -> list[str]:
    out = subprocess.run(["make", "-s", "-n", target], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_make_images_builds_each_dockerfile_under_its_declared_name_and_the_project_version():
    expected = [f"docker build -f images/{c}.Dockerfile -t {i.reference} ." for c, i in images().items()]
    assert sorted(make_dry_run("images")) == sorted(expected)
    loads = [line for line in make_dry_run("kind-load") if line.startswith("kind load")]
    assert sorted(loads) == sorted(f"kind load docker-image {i.reference}" for i in images().values())


def readme_cluster_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Toward a real cluster")
    return text[start:text.index("\n## ", start + 1)]


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_the_readme_cluster_path_runs_make_kind_load_and_spells_out_its_commands():
    section = readme_cluster_section()
    lines = {line.strip() for line in section.splitlines()}
    assert "make kind-load" in section
    for command in make_dry_run("kind-load"):
        assert command in lines, f"README.md's cluster path lacks `{command}`"
    assert section.index("make kind-load") < section.index("kubectl apply -k manifests/")
