"""A profile from another model or machine, or fitted on too few points, is refused: the roofline plans,
`status.calibration.reason` says why, `Degraded=True/ProfileRefused` and a Warning Event once a generation."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from cost_profiles import CPU_FITS, cpu_profile
from typer.testing import CliRunner

from specfleet.cli.main import app
from specfleet.engine.profile_model import StepFit, save
from specfleet.operator import catalogs, planner
from specfleet.operator.api import ModelRef
from specfleet.operator.catalogs.profile_catalog import read_catalog
from specfleet.operator.catalogs.profile_match import same_device, same_model
from specfleet.operator.reconcile import reconcile

NOW = "2026-01-01T00:00:00Z"
CPU = {"model": {"name": "smollm2-135m", "source": "builtin:smollm2-135m", "dtype": "float32"},
       "accelerator": {"type": "cpu", "count": 1}, "runtime": {"engine": "specfleet"},
       "slo": {"ttftP99Ms": 2000, "itlP99Ms": 200, "maxContextTokens": 2048, "promptTokens": 256,
               "outputTokens": 128, "requestsPerSecond": 0.3},
       "speculation": {"mode": "auto", "method": "ngram", "maxSpeculativeTokens": 4},
       "autoscaling": {"minReplicas": 1, "maxReplicas": 2}}
LAX = {**CPU, "slo": {**CPU["slo"], "itlP99Ms": 400}}      # room for prefill priced by the decode fit
SHIPPED_MODEL = "/root/.cache/specfleet/models/smollm2-135m"     # as the shipped profile records it
H100 = {**CPU, "model": {**CPU["model"], "dtype": "bfloat16"}, "accelerator": {"type": "nvidia-h100-80gb"},
        "runtime": {"engine": "vllm"}}


def catalog_of(tmp_path: Path, name: str = "smollm2-135m--cpu", **fields):
    save(replace(cpu_profile(), **fields), tmp_path / f"{name}.json")
    return read_catalog(tmp_path)


def test_a_profile_of_another_model_is_refused_and_says_which_models(tmp_path, make_spec, gpus, models):
    spec = make_spec(**CPU)
    result = planner.plan(spec, gpus, models, catalog_of(tmp_path, model="/models/Qwen2-0.5B-Instruct"))
    assert result.profile is None and result.calibration.source == "roofline" and result.calibration.refused
    assert result.calibration.reason == ("profile smollm2-135m--cpu refused: it was measured on model "
                                         "'/models/Qwen2-0.5B-Instruct', and this service serves 'smollm2-135m' "
                                         "(builtin:smollm2-135m)")
    assert result == replace(planner.plan(spec, gpus, models), calibration=result.calibration)


@pytest.mark.parametrize("measured", [SHIPPED_MODEL, "smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct",
                                      "/hub/models--HuggingFaceTB--SmolLM2-135M/snapshots/0a1b2c"])
def test_the_names_a_profile_records_for_the_served_model_are_accepted(tmp_path, make_spec, gpus, models, measured):
    result = planner.plan(make_spec(**CPU), gpus, models, catalog_of(tmp_path, model=measured))
    assert result.calibration.source == "profile" and not result.calibration.refused


def test_a_model_catalogue_alias_matches_and_a_sibling_model_does_not(models):
    served = ModelRef(name="chat", source="hf://HuggingFaceTB/SmolLM2-135M-Instruct")
    assert same_model("builtin:smollm2-135m", served, models)
    assert not same_model("/models/smollm2-360m", served, models)


@pytest.mark.parametrize("device, accelerator, same", [
    ("NVIDIA H100 80GB HBM3", "nvidia-h100-80gb", True), ("NVIDIA H100 PCIe", "nvidia-h100-80gb", True),
    ("NVIDIA A100-SXM4-80GB", "nvidia-a100-80gb", True), ("NVIDIA A100-SXM4-40GB", "nvidia-a100-80gb", False),
    ("NVIDIA L4", "nvidia-l40s-48gb", False), ("NVIDIA GeForce RTX 3090", "nvidia-rtx-3090-24gb", True),
    ("NVIDIA H200", "nvidia-h100-80gb", False), ("nvidia-h100-80gb", "nvidia-h100-80gb", True)])
def test_a_gpu_name_is_matched_to_the_catalogue_entry_by_its_words(device, accelerator, same):
    assert same_device(device, accelerator) is same


@pytest.mark.parametrize("device, says", [
    ("cpu", "it was measured on a CPU, and accelerator nvidia-h100-80gb is a GPU"),
    ("NVIDIA A100-SXM4-40GB", "it was measured on 'NVIDIA A100-SXM4-40GB', not on accelerator nvidia-h100-80gb")])
def test_a_profile_from_another_machine_is_refused(tmp_path, make_spec, gpus, models, device, says):
    catalog = catalog_of(tmp_path, "smollm2-135m--nvidia-h100-80gb", device=device, dtype="bfloat16")
    result = planner.plan(make_spec(**H100), gpus, models, catalog)
    assert result.calibration.source == "roofline" and result.calibration.refused
    assert result.calibration.reason == f"profile smollm2-135m--nvidia-h100-80gb refused: {says}"


def test_a_gpu_profile_of_the_accelerator_prices_it(tmp_path, make_spec, gpus, models):
    catalog = catalog_of(tmp_path, "smollm2-135m--nvidia-h100-80gb", device="NVIDIA H100 80GB HBM3", dtype="bfloat16")
    assert planner.plan(make_spec(**H100), gpus, models, catalog).calibration.source == "profile"


def test_a_gpu_profile_is_refused_for_a_cpu_accelerator(tmp_path, make_spec, gpus, models):
    result = planner.plan(make_spec(**CPU), gpus, models, catalog_of(tmp_path, device="NVIDIA H100 80GB HBM3"))
    assert result.calibration.reason == ("profile smollm2-135m--cpu refused: it was measured on 'NVIDIA H100 80GB "
                                         "HBM3', and accelerator cpu runs the engine on a CPU")


def test_another_dtype_is_not_a_refusal_only_not_this_services_cost(make_spec, gpus, models, tmp_path):
    bf16 = make_spec(**{**CPU, "model": {**CPU["model"], "dtype": "bfloat16"}})
    result = planner.plan(bf16, gpus, models, catalog_of(tmp_path))
    assert result.calibration.source == "roofline" and not result.calibration.refused


def test_another_engine_commit_is_not_refused(tmp_path, make_spec, gpus, models):
    result = planner.plan(make_spec(**CPU), gpus, models, catalog_of(tmp_path, engine_commit="0" * 40))
    assert result.calibration.source == "profile"


def test_a_decode_fit_on_no_more_points_than_parameters_is_refused_with_the_counts(tmp_path, make_spec, gpus, models):
    """A decode fit alone (a, b, c) on 3 points passes through all three: error 0, priced as perfect."""
    alone = StepFit(a=0.030, b=0.0050, c=2.0e-6, rel_rms_error=0.0, num_points=3)
    result = planner.plan(make_spec(**CPU), gpus, models, catalog_of(
        tmp_path, fit={"decode": alone, "prefill": CPU_FITS["prefill"]}))
    assert result.calibration.source == "roofline" and result.calibration.refused
    assert ("too few points for its decode fit: decode (3 parameters fitted on 3 points); a fit needs more points "
            "than parameters") in result.calibration.reason


def test_a_prefill_fit_on_too_few_points_is_left_out_and_noted(tmp_path, make_spec, gpus, models):
    thin = replace(CPU_FITS["prefill"], num_points=3)
    result = planner.plan(make_spec(**LAX), gpus, models, catalog_of(tmp_path, fit={**CPU_FITS, "prefill": thin}))
    assert result.calibration.source == "profile" and result.profile.prefill is None
    assert result.calibration.reason == ("fits with no more points than parameters not used, their steps priced by "
                                         "the decode fit: prefill (3 parameters fitted on 3 points)")


def test_decode_and_verify_fitted_together_count_their_points_together(tmp_path, make_spec, gpus, models):
    """The shared fit (a per kind, s, b, c) has 5 parameters: 3 decode points and 3 verify points determine it."""
    fits = {"decode": replace(CPU_FITS["decode"], num_points=3), "verify": replace(CPU_FITS["verify"], num_points=3)}
    result = planner.plan(make_spec(**LAX), gpus, models, catalog_of(tmp_path, fit=fits))
    assert result.calibration.source == "profile" and result.profile.verify is not None


class FakeKube:
    """The Kube verbs `reconcile` uses, over a dict."""

    def __init__(self):
        self.objects: dict[tuple[str, str, str], dict] = {}

    def get(self, kind, namespace, name):
        return self.objects.get((kind, namespace, name))

    def apply(self, manifest, live=None):      # `live` (the caller's read) saves Kube a GET; none here
        key = (manifest["kind"], manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        verb = "updated" if key in self.objects else "created"
        self.objects[key] = manifest
        return verb

    def create_if_missing(self, manifest, live=None):
        return self.apply(manifest) == "created"


def body(spec: dict, generation: int = 1, status: dict | None = None) -> dict:
    return {"metadata": {"name": "svc", "namespace": "ns", "uid": "u1", "generation": generation},
            "spec": spec, "status": status or {}}


@pytest.fixture
def refused_catalogue(tmp_path, monkeypatch):
    catalog = catalog_of(tmp_path, model="qwen2-0.5b")
    monkeypatch.setattr(catalogs, "profiles", lambda path=None: catalog)
    return tmp_path


def test_the_degraded_condition_and_one_event_per_generation_say_the_profile_was_refused(refused_catalogue):
    kube = FakeKube()
    first = reconcile(body(CPU), kube, NOW)
    degraded = next(c for c in first.status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ProfileRefused")
    assert degraded["message"] == (
        "profile smollm2-135m--cpu refused: it was measured on model 'qwen2-0.5b', and this service serves "
        "'smollm2-135m' (builtin:smollm2-135m); the roofline prices the steps instead")
    assert first.status["calibration"]["source"] == "roofline"
    assert [e for e in first.events if e[1] == "ProfileRefused"] == [("Warning", "ProfileRefused", degraded["message"])]
    again = reconcile(body(CPU, status=first.status), kube, NOW)
    assert not [e for e in again.events if e[1] == "ProfileRefused"]
    edited = reconcile(body(CPU, generation=2, status=again.status), kube, NOW)
    assert [e[1] for e in edited.events].count("ProfileRefused") == 1


def test_a_missing_profile_is_not_a_refusal(make_spec, gpus, models):
    result = planner.plan(make_spec(), gpus, models, catalogs.profiles())
    assert result.calibration.source == "roofline" and not result.calibration.refused
    gpu = {**CPU, "model": {"name": "m", "source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
           "accelerator": {"type": "nvidia-h100-80gb"}, "runtime": {"engine": "vllm"}}
    outcome = reconcile(body(gpu), FakeKube(), NOW)
    degraded = next(c for c in outcome.status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] != "ProfileRefused"


def test_specfleet_plan_prints_why_a_profile_was_refused(tmp_path):
    catalog_of(tmp_path, model="qwen2-0.5b")
    example = Path(__file__).parents[2] / "manifests/examples/smollm2-cpu.yaml"
    out = CliRunner().invoke(app, ["plan", "-f", str(example), "--profiles", str(tmp_path)], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert ("warning: profile smollm2-135m--cpu refused: it was measured on model 'qwen2-0.5b', and this service "
            "serves 'smollm2-135m' (builtin:smollm2-135m); the roofline prices the steps instead") in out.output
    shipped = CliRunner().invoke(app, ["plan", "-f", str(example)], env={"COLUMNS": "200"})
    assert "refused" not in shipped.output and "profile smollm2-135m--cpu, fit error" in shipped.output
