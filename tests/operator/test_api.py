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


@pytest.mark.parametrize("patch, message", [
    ({"slo": {"ttftP99Ms": 500}}, "spec.slo.itlP99Ms: required"),
    ({"runtime": {"engine": "tgi"}}, "spec.runtime.engine"),
    ({"accelerator": {"count": 0}}, "spec.accelerator.count"),
    ({"accelerator": {"count": "many"}}, "spec.accelerator.count"),
    ({"autoscaling": {"minReplicas": 3, "maxReplicas": 2}}, "minReplicas must not exceed maxReplicas"),
    ({"speculation": {"method": "draft"}}, "draftModel is required"),
    ({"speculation": {"minAcceptanceRate": 1.5}}, "minAcceptanceRate"),
    ({"model": {"name": "m", "source": "s3://bucket/x"}}, "spec.model.source"),
    ({"model": {"name": "m", "source": "builtin:gpt-5"}}, "only builtin model"),
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
