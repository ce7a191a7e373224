"""Parsing and validating the InferenceService spec (the CRD's rules, in Python)."""
from __future__ import annotations

import pytest

from specfleet.operator import api

MINIMAL = {"model": {"name": "m", "source": "builtin:smollm2-135m"}, "slo": {"ttftP99Ms": 500, "itlP99Ms": 50}}


def test_a_minimal_spec_gets_the_crd_defaults():
    spec = api.parse_spec(MINIMAL)
    assert spec.runtime.engine == "specfleet" and spec.accelerator.count is None
    assert spec.speculation == api.Speculation() and spec.autoscaling == api.Autoscaling()
    assert spec.slo.max_context_tokens == 4096 and spec.replicas is None
    assert spec.slo.objective == 0.99 and spec.mode == "Serving" and not spec.plan_only


@pytest.mark.parametrize("patch, message", [
    ({"slo": {"ttftP99Ms": 500}}, "spec.slo.itlP99Ms: required"),
    ({"runtime": {"engine": "tgi"}}, "spec.runtime.engine"),
    ({"accelerator": {"count": 0}}, "spec.accelerator.count"),
    ({"accelerator": {"count": "many"}}, "spec.accelerator.count"),
    ({"autoscaling": {"minReplicas": 3, "maxReplicas": 2}}, "minReplicas must not exceed maxReplicas"),
    ({"speculation": {"method": "draft"}}, "draftModel is required"),
    ({"speculation": {"minAcceptanceRate": 1.5}}, "minAcceptanceRate"),
    ({"speculation": {"promptLookupMin": 3, "promptLookupMax": 2}}, "promptLookupMin must not exceed promptLookupMax"),
    ({"speculation": {"promptLookupMin": 0}}, "spec.speculation.promptLookupMin"),
    ({"model": {"name": "m", "source": "s3://bucket/x"}}, "spec.model.source"),
    ({"slo": {"ttftP99Ms": 500, "itlP99Ms": 50, "objective": 1}}, "spec.slo.objective: 1 is outside (0, 1)"),
    ({"slo": {"ttftP99Ms": 500, "itlP99Ms": 50, "objective": 0}}, "spec.slo.objective: 0 is outside (0, 1)"),
    ({"mode": "DryRun"}, "spec.mode: 'DryRun' is not one of Serving, PlanOnly"),
    ({"model": {"name": "m", "source": "builtin:gpt-5"}}, "only builtin model"),
    ({"model": {"name": "m", "source": "builtin:smollm2-135m", "dtype": "fp8"}}, "fp8 needs runtime.engine vllm"),
    ({"slo": {"ttftP99Ms": 500, "itlP99Ms": 50, "maxContextTokens": 100, "promptTokens": 90,
              "outputTokens": 20}}, "must not exceed maxContextTokens"),
])
def test_invalid_specs_are_rejected_with_the_broken_rule(patch, message):
    with pytest.raises(api.SpecError) as err:
        api.parse_spec({**MINIMAL, **patch})
    assert any(message in e for e in err.value.errors), err.value.errors


def test_every_error_is_reported_at_once():
    with pytest.raises(api.SpecError) as err:
        api.parse_spec({"model": {"name": "m", "source": "nope"}, "slo": {"ttftP99Ms": -1, "itlP99Ms": 50},
                        "runtime": {"engine": "x"}})
    assert len(err.value.errors) >= 3


@pytest.mark.parametrize("source, parsed", [
    ("hf://meta-llama/Llama-3.1-8B@main", api.Source("hf", "meta-llama/Llama-3.1-8B", revision="main")),
    ("pvc://models/llama/8b", api.Source("pvc", "models", path="llama/8b")),
    ("hostpath:/data/m", api.Source("hostpath", "/data/m")),
    ("image:/models/x", api.Source("image", "/models/x")),
    ("builtin:smollm2-135m", api.Source("builtin", "smollm2-135m")),
])
def test_model_sources_parse_into_their_parts(source, parsed):
    assert api.SOURCE_RE.match(source) and api.parse_source(source) == parsed


def test_a_small_context_alone_scales_the_default_prompt_and_output_into_it():
    spec = api.parse_spec({"model": {"name": "m", "source": "builtin:smollm2-135m"},
                           "slo": {"ttftP99Ms": 2000, "itlP99Ms": 200, "maxContextTokens": 512}})
    assert (spec.slo.prompt_tokens, spec.slo.output_tokens) == (409, 103)
    assert spec.slo.prompt_tokens + spec.slo.output_tokens == 512


def test_a_given_prompt_leaves_the_default_output_what_fits():
    assert api.token_defaults(512, 500, None) == (500, 12)
    assert api.token_defaults(512, None, 100) == (412, 100)
    assert api.token_defaults(4096, None, None) == (1024, 256)
    assert api.token_defaults(512, 400, 200) == (400, 200)      # given: the CEL rule reports it


def test_a_given_pair_that_overflows_the_context_is_still_rejected():
    with pytest.raises(api.SpecError, match="must not exceed maxContextTokens"):
        api.parse_spec({"model": {"name": "m", "source": "builtin:smollm2-135m"},
                        "slo": {"ttftP99Ms": 2000, "itlP99Ms": 200, "maxContextTokens": 512,
                                "promptTokens": 400, "outputTokens": 200}})
