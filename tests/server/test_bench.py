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
    import typer

    from specfleet.cli.bench_cmds import RequestResult, meets, parse_goodput

    slos = parse_goodput(["ttft:500", "itl:50 tpot:20"])
    assert slos == {"ttft": 0.5, "itl": 0.05, "tpot": 0.02}
    fast = RequestResult(ok=True, ttft_s=0.1, e2e_s=0.3, itl_s=[0.02] * 10, output_tokens=11)
    slow_gap = RequestResult(ok=True, ttft_s=0.1, e2e_s=0.3, itl_s=[0.01] * 9 + [0.11], output_tokens=11)
    assert meets(fast, slos) and not meets(slow_gap, slos)
    with pytest.raises(typer.BadParameter):
        parse_goodput(["latency:5"])


def test_summary_percentiles():
    from specfleet.cli.bench_cmds import RequestResult, summarize

    results = [RequestResult(ok=True, ttft_s=t / 1000, e2e_s=1.0, output_tokens=2) for t in range(1, 101)]
    summary = summarize(results + [RequestResult(ok=False, error="boom")], duration_s=10.0, slos={})
    assert summary["completed"] == 100 and summary["failed"] == 1 and summary["errors"] == ["boom"]
    assert summary["ttft_ms"]["p50"] == pytest.approx(50.5) and summary["ttft_ms"]["p99"] == pytest.approx(99.01)
    assert summary["request_throughput"] == pytest.approx(10.0)
