"""Prometheus metrics (names, labels, movement) and the admin API with its bearer token."""
from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specfleet.engine.host import host_info
from specfleet.engine.profile_format import host_key

REQUIRED = {
    "counter": ["vllm:prompt_tokens", "vllm:generation_tokens", "vllm:num_preemptions", "vllm:prefix_cache_queries",
                "vllm:prefix_cache_hits", "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                "vllm:spec_decode_num_accepted_tokens", "specfleet:counterfactual_draft_tokens",
                "specfleet:counterfactual_accepted_tokens", "vllm:request_success"],
    "gauge": ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
              "specfleet:speculation_enabled", "specfleet:num_speculative_tokens"],
    "histogram": ["vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                  "vllm:e2e_request_latency_seconds", "vllm:iteration_tokens_total", "specfleet:batch_size",
                  "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds"],
    "summary": ["specfleet:step_duration_seconds"],      # count and sum, no quantiles: the mean step per bucket
}


def scrape(base_url: str) -> dict[str, float]:
    """sample name + sorted labels -> value, e.g. 'vllm:generation_tokens_total{model_name=tiny}'."""
    resp = httpx.get(f"{base_url}/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}"] = s.value
    return samples


def families(base_url: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(httpx.get(f"{base_url}/metrics").text)}


def test_metrics_have_the_contract_names_and_types(live_server):
    found = families(live_server.base_url)
    for kind, names in REQUIRED.items():
        for name in names:
            assert found.get(name) == kind, (name, found.get(name))
    text = httpx.get(f"{live_server.base_url}/metrics").text
    assert 'vllm:prompt_tokens_total{model_name="tiny"}' in text
    assert "_created" not in text and 'quantile="' not in text


def test_the_engine_reports_the_cpu_it_runs_on_as_a_profile_records_it(live_server):
    samples = scrape(live_server.base_url)
    hosts = [key for key in samples if key.startswith("specfleet:host_info{")]
    assert hosts == [f"specfleet:host_info{{host={host_key(host_info())},model_name=tiny}}"], hosts
    assert samples[hosts[0]] == 1.0


def test_counters_and_histograms_move_with_a_request(live_server, http):
    label = "{model_name=tiny}"
    before = scrape(live_server.base_url)
    usage = http.post("/v1/completions", json={"prompt": "count me", "max_tokens": 7, "ignore_eos": True,
                                               "temperature": 0}).json()["usage"]
    live_server.wait_idle()
    after = scrape(live_server.base_url)

    def delta(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    assert delta(f"vllm:generation_tokens_total{label}") == usage["completion_tokens"] == 7
    assert delta(f"vllm:prompt_tokens_total{label}") == usage["prompt_tokens"]
    assert delta(f"vllm:time_to_first_token_seconds_count{label}") == 1
    # the first token's time in two: waiting for a step, then the step(s) up to the token
    assert delta(f"vllm:request_queue_time_seconds_count{label}") == delta(
        f"vllm:request_prefill_time_seconds_count{label}") == 1
    parts = delta(f"vllm:request_queue_time_seconds_sum{label}") + delta(f"vllm:request_prefill_time_seconds_sum{label}")
    assert parts == pytest.approx(delta(f"vllm:time_to_first_token_seconds_sum{label}"), abs=1e-6)
    assert delta(f"vllm:inter_token_latency_seconds_count{label}") == 6
    assert delta(f"vllm:e2e_request_latency_seconds_count{label}") == 1
    assert delta("vllm:request_success_total{finished_reason=length,model_name=tiny}") == 1
    steps = delta(f"specfleet:engine_steps_total{label}")
    assert steps >= 7 and delta(f"vllm:iteration_tokens_total_count{label}") == steps
    step_hist = sum(v - before.get(k, 0.0) for k, v in after.items()
                    if k.startswith("specfleet:step_duration_seconds_count{batch_size_bucket=1,"))
    assert step_hist == steps                                     # alone on the server: every step has B=1
    assert after[f"vllm:num_requests_running{label}"] == 0


def test_batch_bucket_labels():
    from specfleet.engine.server.metrics import batch_bucket

    assert [batch_bucket(b) for b in (1, 2, 3, 4, 5, 64, 65, 256, 257)] == \
        ["1", "2", "4", "4", "8", "64", "128", "256", "256+"]


@pytest.fixture(scope="module")
def spec_server(server_factory):
    # ngram_min 1: a random-weight model rarely repeats a 2-gram of its own output
    return server_factory(admin_token="s3cret", speculative_method="ngram", num_speculative_tokens=4, ngram_min=1)


def test_admin_needs_the_bearer_token(spec_server):
    url = f"{spec_server.base_url}/admin/speculation"
    assert httpx.get(url).status_code == 401
    wrong = httpx.post(url, json={"enabled": False}, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    assert wrong.headers["www-authenticate"] == "Bearer"
    ok = httpx.get(url, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200 and ok.json()["configured"] is True and ok.json()["method"] == "ngram"


def test_admin_toggles_speculation_and_metrics_follow(spec_server):
    url, auth = f"{spec_server.base_url}/admin/speculation", {"Authorization": "Bearer s3cret"}
    state = httpx.post(url, json={"enabled": False, "num_speculative_tokens": 2}, headers=auth).json()
    assert state["enabled"] is False and state["num_speculative_tokens"] == 2
    assert spec_server.engine.get_speculation()["num_speculative_tokens"] == 2
    samples = scrape(spec_server.base_url)
    assert samples["specfleet:speculation_enabled{model_name=tiny}"] == 0
    assert samples["specfleet:num_speculative_tokens{model_name=tiny}"] == 2
    too_deep = httpx.post(url, json={"num_speculative_tokens": 99}, headers=auth)
    assert too_deep.status_code == 400 and too_deep.json()["error"]["param"] == "num_speculative_tokens"
    assert httpx.post(url, json={"enabled": "maybe"}, headers=auth).status_code == 400
    assert httpx.post(url, json={"enabled": True}, headers=auth).json()["enabled"] is True


def test_admin_answers_409_while_speculation_is_not_configured(server_factory):
    plain = server_factory(admin_token="s3cret")
    url, auth = f"{plain.base_url}/admin/speculation", {"Authorization": "Bearer s3cret"}
    assert httpx.get(url, headers=auth).json()["configured"] is False
    resp = httpx.post(url, json={"enabled": True}, headers=auth)
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "speculation_not_configured"
    assert "--speculative-method" in resp.json()["error"]["message"]


def test_the_proposal_counters_give_the_operator_a_share_per_depth_while_off(spec_server):
    from specfleet.operator.control.window import build_window
    from specfleet.operator.control.scrape import parse_exposition

    url, auth = f"{spec_server.base_url}/admin/speculation", {"Authorization": "Bearer s3cret"}
    httpx.post(url, json={"enabled": False, "num_speculative_tokens": 4}, headers=auth)
    before = parse_exposition(httpx.get(f"{spec_server.base_url}/metrics").text, 0.0)
    httpx.post(f"{spec_server.base_url}/v1/completions", timeout=60,
               json={"prompt": "a b c d " * 16, "max_tokens": 24, "ignore_eos": True, "temperature": 0})
    spec_server.wait_idle()
    after = parse_exposition(httpx.get(f"{spec_server.base_url}/metrics").text, 10.0)
    httpx.post(url, json={"enabled": True}, headers=auth)
    shares = build_window({"pod": before}, {"pod": after}, 1).draft_shares
    assert shares is not None and len(shares) == 4 and 0 < shares[0] <= 1
    assert all(deeper <= shallower for shallower, deeper in zip(shares, shares[1:]))   # E[min(L, k)] / k
