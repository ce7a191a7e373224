"""The SLO counters the operator's error budget reads: requests served, and those that met both targets."""
from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def counts(base_url: str) -> tuple[float, float]:
    samples = {s.name: s.value for f in text_string_to_metric_families(httpx.get(f"{base_url}/metrics").text)
               for s in f.samples if s.labels.get("model_name") == "tiny"}
    return samples.get("specfleet:requests_slo_met_total", 0.0), samples.get("specfleet:requests_slo_served_total", 0.0)


def run(server, n: int = 3) -> tuple[float, float]:
    before = counts(server.base_url)
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        for i in range(n):
            resp = http.post("/v1/completions", json={"prompt": f"slo {i}", "max_tokens": 5, "ignore_eos": True,
                                                      "temperature": 0})
            assert resp.status_code == 200
    server.wait_idle()
    after = counts(server.base_url)
    return after[0] - before[0], after[1] - before[1]


def test_generous_targets_count_every_served_request_as_met(server_factory):
    server = server_factory(ttft_deadline_ms=60_000, itl_target_ms=60_000)
    assert run(server) == (3, 3)


def test_an_impossible_itl_target_counts_requests_as_served_but_not_met(server_factory):
    server = server_factory(ttft_deadline_ms=60_000, itl_target_ms=1e-6)
    assert run(server) == (0, 3)


def test_an_impossible_ttft_target_counts_requests_as_served_but_not_met(server_factory):
    server = server_factory(ttft_deadline_ms=1e-6, itl_target_ms=60_000)
    assert run(server) == (0, 3)
