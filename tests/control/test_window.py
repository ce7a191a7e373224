"""Scrapes -> windows: rates from counters, p99 from buckets, unknown is not zero."""
from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specfleet.operator.control.window import Histogram, Scrape, build_window, quantile, share_below
from specfleet.operator.control.scrape import parse_exposition, scrape_from_series
from tests.control.exposition_kit import engine_exposition

EXPOSITION = """\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="m"}} {waiting}
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} 8
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{{model_name="m"}} {gen}
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{le="0.1",model_name="m"}} {fast}
vllm:time_to_first_token_seconds_bucket{{le="1.0",model_name="m"}} {all}
vllm:time_to_first_token_seconds_bucket{{le="+Inf",model_name="m"}} {all}
vllm:time_to_first_token_seconds_sum{{model_name="m"}} 1.0
vllm:time_to_first_token_seconds_count{{model_name="m"}} {all}
# TYPE specfleet:step_duration_seconds histogram
specfleet:step_duration_seconds_bucket{{batch_size_bucket="8",le="+Inf",model_name="m",speculating="false"}} {steps}
specfleet:step_duration_seconds_sum{{batch_size_bucket="8",model_name="m",speculating="false"}} {stepsum}
specfleet:step_duration_seconds_count{{batch_size_bucket="8",model_name="m",speculating="false"}} {steps}
# TYPE specfleet:step_seqs counter
specfleet:step_seqs_total{{batch_size_bucket="8",model_name="m",speculating="false"}} {seqs}
"""


def scrape(t, waiting=0, gen=0, fast=0, all=0, steps=0, stepsum=0.0, seqs=0):
    return parse_exposition(EXPOSITION.format(waiting=waiting, gen=gen, fast=fast, all=all, steps=steps,
                                              stepsum=stepsum, seqs=seqs), t)


def test_counters_become_rates_and_buckets_become_quantiles():
    w = build_window({"a": scrape(0, gen=100, fast=10, all=10)},
                     {"a": scrape(10, waiting=4, gen=600, fast=60, all=110, steps=100, stepsum=2.0, seqs=700)}, 1)
    assert w.complete and w.seconds == 10
    assert w.requests_per_second == pytest.approx(10.0)           # 100 first tokens in 10 s
    assert w.generation_tokens_per_second == pytest.approx(50.0)
    assert w.queue_growth_per_second == pytest.approx(0.4) and w.queue_depth == 4
    assert 0.1 < w.ttft_p99 <= 1.0 and w.ttft.count == 100
    assert w.steps[0].batch == pytest.approx(7.0) and w.steps[0].seconds == pytest.approx(0.02)


def test_a_pod_that_was_not_scraped_makes_the_window_incomplete_not_zero():
    prev = {"a": scrape(0, gen=100), "b": scrape(0, gen=100)}
    w = build_window(prev, {"a": scrape(10, gen=200)}, expected=2)
    assert not w.complete and w.pods_scraped == 1


def test_no_previous_scrape_means_no_window():
    assert build_window({}, {"a": scrape(10)}, expected=1) is None


def test_a_restarted_pod_counts_from_zero():
    w = build_window({"a": scrape(0, gen=1000)}, {"a": scrape(10, gen=300)}, 1)
    assert w.generation_tokens_per_second == pytest.approx(30.0)


def test_a_pod_that_became_ready_inside_the_window_contributes():
    w = build_window({"a": scrape(0, gen=0)}, {"a": scrape(10, gen=100), "b": scrape(10, gen=50)}, 2)
    assert w.complete and w.generation_tokens_per_second == pytest.approx(15.0)


def test_missing_series_are_unknown():
    w = build_window({"a": Scrape(0)}, {"a": Scrape(10)}, 1)
    assert w.requests_per_second is None and w.ttft_p99 is None and w.acceptance_rate is None
    assert w.queue_depth is None and w.batch_size_mean is None


def test_quantile_and_share_follow_prometheus_interpolation():
    h = Histogram((1.0, 2.0, math.inf), (50.0, 100.0, 100.0))
    assert quantile(h, 0.5) == pytest.approx(1.0)
    assert quantile(h, 0.75) == pytest.approx(1.5)
    assert share_below(h, 1.5) == pytest.approx(0.75)
    assert quantile(Histogram((1.0, math.inf), (0.0, 0.0)), 0.99) is None


def test_prometheus_series_become_the_same_scrapes():
    series = [("vllm:generation_tokens_total", {"model_name": "m"}, 42.0),
              ("vllm:num_requests_waiting", {}, 3.0),
              ("vllm:time_to_first_token_seconds_bucket", {"le": "+Inf"}, 7.0),
              ("vllm:time_to_first_token_seconds_sum", {}, 1.5),
              ("vllm:time_to_first_token_seconds_count", {}, 7.0)]
    s = scrape_from_series(series, 5.0)
    assert s.counters == {"vllm:generation_tokens": 42} and s.gauges == {"vllm:num_requests_waiting": 3}
    assert s.histograms["vllm:time_to_first_token_seconds"].count == 7 and s.time == 5.0


def _ended(t: float, stopped: int, aborted: int, running: int, success: bool = True) -> Scrape:
    text = (f'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name="m"}} {running}\n'
            f'# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{model_name="m"}} 0\n'
            '# TYPE vllm:e2e_request_latency_seconds histogram\n'
            f'vllm:e2e_request_latency_seconds_bucket{{le="+Inf",model_name="m"}} {stopped}\n'
            f'vllm:e2e_request_latency_seconds_sum{{model_name="m"}} {stopped * 4.0}\n'
            f'vllm:e2e_request_latency_seconds_count{{model_name="m"}} {stopped}\n')
    if success:
        text += ('# TYPE vllm:request_success counter\n'
                 f'vllm:request_success_total{{finished_reason="stop",model_name="m"}} {stopped}\n'
                 f'vllm:request_success_total{{finished_reason="abort",model_name="m"}} {aborted}\n')
    return parse_exposition(text, t)


def test_ended_requests_count_every_finish_reason_and_running_growth_comes_from_the_gauge():
    w = build_window({"a": _ended(0, 10, 0, 8)}, {"a": _ended(5, 50, 10, 18)}, 1)
    assert w.finished_per_second == pytest.approx(10.0) and w.running_growth_per_second == pytest.approx(2.0)
    latency_only = build_window({"a": _ended(0, 10, 0, 8, False)}, {"a": _ended(5, 50, 10, 18, False)}, 1)
    assert latency_only.finished_per_second == pytest.approx(8.0)      # aborted requests are not in it
    assert build_window({"a": scrape(0)}, {"a": scrape(5)}, 1).finished_per_second is None


SPECULATION = """\
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{{model_name="m"}} {drafts}
# TYPE specfleet:num_speculative_tokens gauge
specfleet:num_speculative_tokens{{model_name="m"}} 2
# TYPE specfleet:spec_decode_seq_steps counter
specfleet:spec_decode_seq_steps_total{{model_name="m"}} {seq_steps}
# TYPE specfleet:counterfactual_seq_steps counter
specfleet:counterfactual_seq_steps_total{{model_name="m"}} {cf_steps}
# TYPE specfleet:ngram_proposal_seq_steps counter
specfleet:ngram_proposal_seq_steps_total{{model_name="m"}} {proposals}
# TYPE specfleet:ngram_proposed_tokens counter
specfleet:ngram_proposed_tokens_total{{depth="1",model_name="m"}} {d1}
specfleet:ngram_proposed_tokens_total{{depth="2",model_name="m"}} {d2}
specfleet:ngram_proposed_tokens_total{{depth="3",model_name="m"}} {d3}
"""


FIRST_TOKEN = """\
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{{model_name="m"}} {drafts}
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="m",position="0"}} {first}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="m",position="1"}} {second}
"""


def test_the_first_draft_tokens_acceptance_is_accepted_first_positions_per_draft():
    def at(t, **counts):
        return parse_exposition(FIRST_TOKEN.format(**counts), t)
    w = build_window({"a": at(0, drafts=10, first=5, second=2)}, {"a": at(10, drafts=110, first=85, second=40)}, 1)
    assert w.first_token_acceptance == pytest.approx(0.8)
    assert build_window({"a": scrape(0)}, {"a": scrape(10)}, 1).first_token_acceptance is None


def test_the_draft_share_is_draft_tokens_per_k_sequence_steps_and_proposal_tokens_per_depth_on_or_off():
    def at(t, **counts):
        return parse_exposition(SPECULATION.format(**counts), t)
    w = build_window({"a": at(0, drafts=10, seq_steps=20, cf_steps=0, proposals=0, d1=0, d2=0, d3=0)},
                     {"a": at(10, drafts=70, seq_steps=120, cf_steps=50, proposals=100, d1=50, d2=80, d3=90)}, 1)
    assert w.draft_share == pytest.approx(0.3)
    assert w.draft_shares == pytest.approx((0.5, 0.4, 0.3))        # sum of min(L, j) / (j x proposals)
    old = build_window({"a": scrape(0)}, {"a": scrape(10)}, 1)          # an engine without the counters
    assert old.draft_share is None and old.draft_shares is None


def test_a_scrape_keeps_every_bucket_of_the_latency_histograms_and_the_count_and_sum_of_the_others():
    text = engine_exposition()
    s = parse_exposition(text, 0.0)
    ttft = s.histograms["vllm:time_to_first_token_seconds"]
    assert len(ttft.bounds) == text.count("vllm:time_to_first_token_seconds_bucket{") > 10
    step = s.histograms["specfleet:step_duration_seconds{batch_size_bucket=16,speculating=true}"]
    assert step.bounds == (math.inf,) and step.count == 1 and step.sum == pytest.approx(0.018)
    assert s.histograms["specfleet:batch_size"].count == 18 and s.histograms["specfleet:batch_size"].bounds == (math.inf,)
    # The same series as Prometheus returns them make the same scrape, unread buckets or not.
    series = [(name, labels, value) for family in text_string_to_metric_families(text)
              for name, labels, value, *_ in family.samples if not name.endswith("_created")]
    assert scrape_from_series(series, 0.0) == s
    # An older engine exported the step time as a histogram: its count and sum make the same scrape.
    assert parse_exposition(_as_histogram(text, "specfleet:step_duration_seconds"), 0.0) == s
    # The window reads the mean step of each bucket from the count and sum alone.
    steps = build_window({"p": s}, {"p": parse_exposition(engine_exposition(rounds=3), 5.0)}, 1).steps
    assert len(steps) == 18 and all(st.steps == 2 and st.seconds == pytest.approx(0.002 * st.batch) for st in steps)


def _as_histogram(text: str, summary: str) -> str:
    """`text` with summary `summary` typed a histogram, each count also written as its +Inf bucket and one
    finite bucket."""
    out = []
    for line in text.splitlines():
        if line == f"# TYPE {summary} summary":
            line = f"# TYPE {summary} histogram"
        elif line.startswith(f"{summary}_count{{"):
            labels, value = line[len(summary) + 7:].rsplit("} ", 1)
            out += [f'{summary}_bucket{{{labels},le="0.5"}} {value}', f'{summary}_bucket{{{labels},le="+Inf"}} {value}']
        out.append(line)
    return "\n".join(out) + "\n"
