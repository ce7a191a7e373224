"""`runtime: vllm` on CPU as vLLM 0.32 takes it: the flags its CPU backend accepts, and its metrics (every
series labelled with its engine core) read into the control loop's window. The real run is
tests/fleet/test_vllm_runtime_e2e.py."""
from __future__ import annotations

import pytest

from specfleet.operator import planner, render
from specfleet.operator.control.window import build_window
from specfleet.operator.control.scrape import parse_exposition

CPU = {"runtime": {"engine": "vllm"}, "model": {"name": "smollm2-135m", "source": "builtin:smollm2-135m",
                                                "dtype": "float32"},
       "accelerator": {"type": "cpu"}, "slo": {"itlP99Ms": 200, "ttftP99Ms": 3000}}

# vLLM 0.32's exposition, cut down: one engine core (`engine="0"`), one request in the second scrape.
EXPOSITION = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="smollm2-135m"}} 0.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",model_name="smollm2-135m"}} {gen}
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="1.0",model_name="smollm2-135m"}} 0.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="2.5",model_name="smollm2-135m"}} {n}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="smollm2-135m"}} {n}
vllm:time_to_first_token_seconds_count{{engine="0",model_name="smollm2-135m"}} {n}
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="smollm2-135m"}} {ttft_sum}
vllm:time_to_first_token_seconds_created{{engine="0",model_name="smollm2-135m"}} 1.7964580881767647e+09
"""


def test_vllm_on_cpu_gets_its_kv_pool_in_bytes_in_blocks_its_cpu_attention_takes(make_spec, gpus, models):
    spec = make_spec(**CPU)
    plan = planner.plan(spec, gpus, models)
    container = render.render("svc", "ns", spec, plan)[0]["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    flags = dict(zip(args[1::2], args[2::2]))
    assert args[0] == "HuggingFaceTB/SmolLM2-135M-Instruct"       # the built-in's own weights, not the base model
    assert "--gpu-memory-utilization" not in args                  # on CPU: that share of the host's RAM
    assert int(flags["--kv-cache-memory-bytes"]) == plan.kv_cache_blocks * plan.block_size * plan.kv_bytes_per_token
    assert plan.block_size % 32 != 0 and int(flags["--block-size"]) % 32 == 0


def test_vllm_series_labelled_by_engine_core_fill_the_window():
    def scrape(t: float, n: int, gen: int, ttft_sum: float):
        return parse_exposition(EXPOSITION.format(n=n, gen=gen, ttft_sum=ttft_sum), t)

    window = build_window({"pod": scrape(0.0, 0, 0, 0.0)}, {"pod": scrape(15.0, 1, 8, 2.1)}, expected=1)
    assert window.complete and window.ttft.count == 1 and 1.0 < window.ttft_p99 <= 2.5
    assert window.generation_tokens_per_second == pytest.approx(8 / 15) and window.running == 0
