"""An in-memory fake of the `Kube` verbs a reconcile uses, and an InferenceService body to reconcile (the
handler tests: tests/operator/test_handlers.py, test_threads.py)."""
from __future__ import annotations

import copy

from specfleet.operator.kube import is_subset

BASE = {"model": {"name": "m", "source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
        "slo": {"ttftP99Ms": 1000, "itlP99Ms": 30, "promptTokens": 1000, "outputTokens": 200}}


class FakeKube:
    def __init__(self):
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.writes = 0

    def get(self, kind, namespace, name):
        return copy.deepcopy(self.objects.get((kind, namespace, name)))

    def apply(self, manifest, live=None):      # `live` (the caller's read) saves Kube a GET; none here
        key = (manifest["kind"], manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        live = self.objects.get(key)
        if live is not None and is_subset(manifest, live):
            return "unchanged"
        self.objects[key], self.writes = copy.deepcopy(manifest), self.writes + 1
        return "created" if live is None else "updated"

    def create_if_missing(self, manifest, live=None):
        key = (manifest["kind"], manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        if key in self.objects:
            return False
        self.objects[key] = manifest
        return True


def body(spec=None, generation=1, status=None):
    return {"metadata": {"name": "svc", "namespace": "ns", "uid": "u1", "generation": generation},
            "spec": spec or BASE, "status": status or {}}
