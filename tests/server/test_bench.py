"""`specfleet bench serve` against the live server, and its pure parts."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner


def test_bench_serve_reports_latency_throughput_and_goodput(live_server, tmp_path):
    from specfleet.cli.main import app

    out = tmp_path / "bench.json"
    result = CliRunner().invoke(app, ["bench", "serve", "--base-url", live_server.base_url, "--model", "tiny",
                                      "--num-prompts", "6", "--request-rate", "inf", "--max-concurrency", "3",
                                      "--input-len", "8", "--output-len", "5", "--goodput", "ttft:60000 tpot:60000",
                                      "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["completed"] == 6 and report["failed"] == 0
    assert report["total_output_tokens"] == 30 and report["total_input_tokens"] > 0
    assert report["goodput"]["good_requests"] == 6
    assert 0 < report["ttft_ms"]["p50"] <= report["ttft_ms"]["p99"] <= report["e2el_ms"]["p99"]
    assert len(report["requests"]) == 6 and all(len(r["itl_s"]) >= 1 for r in report["requests"])
    assert "TTFT" in result.output


def test_goodput_parsing_and_slo_check():
    from specfleet.cluster.loadgen import RequestResult, meets, parse_goodput

    slos = parse_goodput(["ttft:500", "itl:50 tpot:20"])
    assert slos == {"ttft": 0.5, "itl": 0.05, "tpot": 0.02}
    fast = RequestResult(ok=True, ttft_s=0.1, e2e_s=0.3, itl_s=[0.02] * 10, output_tokens=11)
    slow_gap = RequestResult(ok=True, ttft_s=0.1, e2e_s=0.3, itl_s=[0.01] * 9 + [0.11], output_tokens=11)
    assert meets(fast, slos) and not meets(slow_gap, slos)
    with pytest.raises(ValueError, match="--goodput takes KEY:MS"):
        parse_goodput(["latency:5"])


def test_summary_percentiles():
    from specfleet.cluster.loadgen import RequestResult, summarize

    results = [RequestResult(ok=True, ttft_s=t / 1000, e2e_s=1.0, output_tokens=2) for t in range(1, 101)]
    summary = summarize(results + [RequestResult(ok=False, error="boom")], duration_s=10.0, slos={})
    assert summary["completed"] == 100 and summary["failed"] == 1 and summary["errors"] == ["boom"]
    assert summary["ttft_ms"]["p50"] == pytest.approx(50.5) and summary["ttft_ms"]["p99"] == pytest.approx(99.01)
    assert summary["request_throughput"] == pytest.approx(10.0)


def test_bench_serve_takes_vllm_workload_knobs_on_both_endpoints(live_server, tiny_llama, tmp_path):
    from specfleet.cli.main import app

    for endpoint in ("/v1/completions", "/v1/chat/completions"):
        out = tmp_path / "bench.json"
        result = CliRunner().invoke(app, [
            "bench", "serve", "--base-url", live_server.base_url, "--model", "tiny", "--tokenizer", tiny_llama,
            "--dataset-name", "random", "--random-input-len", "12", "--random-output-len", "4",
            "--num-prompts", "4", "--max-concurrency", "2", "--request-rate", "inf", "--ignore-eos",
            "--endpoint", endpoint, "--json", str(out)])
        assert result.exit_code == 0, result.output
        report = json.loads(out.read_text())
        assert report["completed"] == 4 and report["failed"] == 0 and report["total_output_tokens"] == 16
        assert report["config"]["endpoint"] == endpoint
        assert all(r["ttft_s"] > 0 and r["text"] for r in report["requests"])
    live_server.wait_idle()


def test_random_dataset_prompts_are_random_token_ids_of_the_requested_length(tiny_llama):
    from transformers import AutoTokenizer

    from specfleet.cluster.loadgen import random_requests

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    requests = random_requests(tokenizer, 8, 20, 7, range_ratio=0.0, seed=1)
    assert [r.prompt_len for r in requests] == [20] * 8 and {r.max_tokens for r in requests} == {7}
    assert len({r.prompt for r in requests}) == 8
    assert all(abs(len(tokenizer.encode(r.prompt, add_special_tokens=False)) - 20) <= 2 for r in requests)
    varied = random_requests(tokenizer, 16, 20, 10, range_ratio=0.5, seed=1)
    assert all(10 <= r.prompt_len <= 30 and 5 <= r.max_tokens <= 15 for r in varied)
    assert random_requests(tokenizer, 8, 20, 7, 0.0, seed=1) == requests


def test_vllm_endpoint_paths_and_backend_select_the_endpoint():
    from specfleet.cluster.loadgen import endpoint_path

    assert endpoint_path("/v1/completions", "vllm") == "/v1/completions"
    assert endpoint_path("/v1/completions", "openai-chat") == "/v1/chat/completions"
    assert endpoint_path("chat", None) == "/v1/chat/completions"
    with pytest.raises(ValueError):
        endpoint_path("/v1/embeddings", None)


@pytest.mark.parametrize("option", [["--goodput", "latency:5"], ["--endpoint", "/v1/embeddings"],
                                    ["--request-rate", "0"], ["--dataset-name", "sharegpt"]])
def test_bench_serve_turns_a_bad_workload_option_into_a_usage_error_before_sending(option):
    from specfleet.cli.main import app

    result = CliRunner().invoke(app, ["bench", "serve", "--base-url", "http://127.0.0.1:9", "--model", "m",
                                      "--num-prompts", "1", *option])
    assert result.exit_code == 2, result.output
    assert "Invalid value" in result.output
