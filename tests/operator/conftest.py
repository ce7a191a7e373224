"""Fixtures for the operator's tests: catalogs and a spec builder."""
from __future__ import annotations

import copy

import pytest

from specfleet.operator import api, catalogs

BASE = {"model": {"name": "m", "source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
        "accelerator": {"type": "nvidia-h100-80gb"},
        "slo": {"ttftP99Ms": 1000, "itlP99Ms": 30, "maxContextTokens": 4096, "promptTokens": 1000,
                "outputTokens": 200, "requestsPerSecond": 2}}


def deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@pytest.fixture
def gpus():
    return catalogs.gpus()


@pytest.fixture
def models():
    return catalogs.models()


@pytest.fixture
def make_spec():
    def make(**over) -> api.InferenceServiceSpec:
        return api.parse_spec(deep_merge(BASE, over))
    return make
