"""The roofline cost, memory and speculation arithmetic against hand-computed numbers, and their monotonicity."""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specfleet.operator import cost as c
from specfleet.operator.catalogs import gpus, models

GiB = c.GiB
LLAMA70 = c.Architecture(parameters=70e9, num_layers=80, hidden_size=8192, num_attention_heads=64,
                         num_kv_heads=8, head_dim=128, intermediate_size=28672, vocab_size=128256)
H100x4 = c.Calibration(bw_eff=4 * 3.35e12, flops_eff=4 * 989e12, t_fixed=0.0)
ROOF = c.Roofline(LLAMA70, H100x4)


def test_llama70b_kv_per_token_is_320_kib_in_bf16():
    assert c.kv_bytes_per_token(LLAMA70) == 320 * 1024


def test_llama70b_weights_are_140_gb_in_bf16():
    assert c.weights_bytes(LLAMA70) == 140e9


def test_llama70b_kv_pool_and_blocks_on_4_h100():
    # 4 x 80 GiB x 0.9 = 309.24 GB; minus 140 GB weights and a 4 GiB reserve = 164.94 GB of KV,
    # which is 31460 blocks of 16 tokens x 320 KiB.
    pool = c.kv_pool_bytes(LLAMA70, 80 * GiB, 0.9, 4, reserve=4 * GiB)
    assert pool == 4 * 80 * GiB * 0.9 - 140e9 - 4 * GiB
    assert c.kv_blocks(pool, 16, 320 * 1024) == int(pool // (16 * 320 * 1024)) == 31460


def test_a_decode_step_streams_the_weights_and_computes_its_token():
    # 140 GB of weights at 13.4 TB/s: 10.448 ms; 2 x 70e9 FLOP at 3.956 PFLOP/s: 0.0354 ms, added.
    t = c.step_time(LLAMA70, H100x4, batch=1, ctx=0, q=1)
    assert t == pytest.approx(140e9 / (4 * 3.35e12) + 2 * 70e9 / (4 * 989e12), rel=1e-12)


def test_every_verified_token_costs_time_below_the_ridge_and_attention_counts():
    # 3 more tokens at batch 8 add 3 x 8 x 2 x 70e9 FLOP (0.85 ms) though the step is far below the ridge;
    # at ctx 4096 each token also attends: 4 x 80 layers x 64 heads x 128 x 4096 = 10.7 GFLOP.
    plain, verify = (c.step_time(LLAMA70, H100x4, 8, 0, q) for q in (1, 4))
    assert verify - plain == pytest.approx(3 * 8 * 2 * 70e9 / (4 * 989e12), rel=1e-9)
    attention = c.step_time(LLAMA70, H100x4, 1, 4096, 1) - c.step_time(LLAMA70, H100x4, 1, 4096, 0)
    assert attention == pytest.approx((2 * 70e9 + 4 * 80 * 64 * 128 * 4096) / (4 * 989e12), rel=1e-9)


def test_a_mixed_step_prices_its_prompt_tokens_attending_to_half_the_context():
    decodes = c.step_time(LLAMA70, H100x4, 4, 2048, 1)
    prompt = 508 * (2 * 70e9 + 4 * 80 * 64 * 128 * 1024) / (4 * 989e12)
    assert c.mixed_step_time(LLAMA70, H100x4, 4, 2048, 512) == pytest.approx(decodes + prompt, rel=1e-12)
    assert c.mixed_step_time(LLAMA70, H100x4, 4, 2048, 2) == pytest.approx(decodes, rel=1e-12)
    assert c.mixed_step_time(LLAMA70, H100x4, 0, 0, 512) > c.mixed_step_time(LLAMA70, H100x4, 0, 0, 0)


def test_a_draft_phase_pays_one_round_trip_and_each_further_forward_its_depths_share():
    cal = c.Calibration(bw_eff=3.35e12, flops_eff=989e12, t_fixed=0.003)
    head = c.Architecture(1, 8192, 64, 8, 128, 28672, 128256, 2e9)
    forward = c.step_time(head, cal, 8, 512, 1, fixed=False)
    draft = c.draft_time_fn(head, LLAMA70, cal, 512)
    assert draft(8, 0) == 0.0
    assert draft(8, 3) == pytest.approx(0.003 * (1 + 2 / 80) + 3 * forward, rel=1e-12)
    itself = c.draft_time_fn(LLAMA70, LLAMA70, cal, 512)
    assert itself(8, 3) == pytest.approx(3 * c.step_time(LLAMA70, cal, 8, 512, 1), rel=1e-12)


def test_expected_tokens_matches_the_geometric_series():
    assert c.expected_tokens(0.5, 0) == 1.0
    assert c.expected_tokens(0.5, 1) == 1.5
    assert abs(c.expected_tokens(0.5, 3) - (1 + 0.5 + 0.25 + 0.125)) < 1e-12
    assert c.expected_tokens(1.0, 4) == 5.0


def test_speculation_pays_at_batch_one_and_stops_paying_at_large_batch():
    # Short contexts: the verify pass of k+1 tokens turns compute bound as the batch grows.
    assert c.best_k(ROOF, 1, 256, alpha=0.7, max_k=8) > 0
    mbs = c.max_batch_for_speculation(ROOF, 256, alpha=0.7, max_k=8)
    assert 1 <= mbs < 4096
    assert c.best_k(ROOF, mbs, 256, 0.7, 8) > 0
    assert c.best_k(ROOF, mbs + 1, 256, 0.7, 8) == 0


def test_long_contexts_keep_speculation_paying_to_larger_batches():
    short = c.max_batch_for_speculation(ROOF, 256, alpha=0.7, max_k=8)
    long = c.max_batch_for_speculation(ROOF, 4096, alpha=0.7, max_k=8)
    assert long > short


def test_speculation_never_pays_at_zero_acceptance():
    assert c.max_batch_for_speculation(ROOF, 2048, alpha=0.0, max_k=8) == 0


def test_an_expensive_draft_model_lowers_the_speculation_crossover():
    draft = c.draft_time_fn(small_model(), LLAMA70, H100x4, 2048)
    free = c.max_batch_for_speculation(ROOF, 2048, 0.7, 8)
    costly = c.max_batch_for_speculation(ROOF, 2048, 0.7, 8, draft=draft)
    assert costly <= free


def small_model() -> c.Architecture:
    return c.Architecture(16, 2048, 32, 8, 64, 8192, 128256, 1_235_814_400).with_dtype("bfloat16")


def test_fit_calibration_recovers_the_parameters_it_was_generated_with():
    truth = c.Calibration(bw_eff=2.5e12, flops_eff=5e14, t_fixed=0.004)
    samples = [c.StepSample(b, ctx, q, c.step_time(LLAMA70, truth, b, ctx, q))
               for b in (1, 4, 16, 64, 256, 1024) for ctx in (512, 4096) for q in (1, 5)]
    fit = c.fit_calibration(samples, LLAMA70, prior=c.Calibration(1e12, 1e14, 0.0))
    assert abs(fit.bw_eff / truth.bw_eff - 1) < 0.02
    assert abs(fit.t_fixed - truth.t_fixed) < 5e-4
    assert abs(fit.flops_eff / truth.flops_eff - 1) < 0.05


def test_fit_calibration_keeps_the_prior_flops_where_bytes_and_flop_move_together():
    # Decode steps at one context: bytes and FLOP both grow with the batch and cannot be told apart.
    truth = c.Calibration(bw_eff=2.5e12, flops_eff=5e14, t_fixed=0.004)
    prior = c.Calibration(1e12, 4e14, 0.0)
    samples = [c.StepSample(b, 1024, 1, c.step_time(LLAMA70, truth, b, 1024, 1)) for b in (1, 4, 16, 64)]
    fit = c.fit_calibration(samples, LLAMA70, prior)
    assert fit.flops_eff == prior.flops_eff
    assert all(c.step_time(LLAMA70, fit, s.batch, s.ctx, 1) == pytest.approx(s.seconds, rel=0.01) for s in samples)
    one = c.fit_calibration(samples[:1], LLAMA70, prior)     # one batch: the prior scaled to its time
    assert c.step_time(LLAMA70, one, 1, 1024, 1) == pytest.approx(samples[0].seconds, rel=1e-9)
    assert one.bw_eff / prior.bw_eff == pytest.approx(one.flops_eff / prior.flops_eff, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(small=st.floats(20, 160), extra=st.floats(0, 200), tp=st.sampled_from([1, 2, 4, 8]))
def test_more_memory_never_means_fewer_blocks(small, extra, tp):
    kv = c.kv_bytes_per_token(LLAMA70)
    fewer = c.kv_blocks(c.kv_pool_bytes(LLAMA70, small * GiB, 0.9, tp), 16, kv)
    more = c.kv_blocks(c.kv_pool_bytes(LLAMA70, (small + extra) * GiB, 0.9, tp), 16, kv)
    assert more >= fewer


@settings(max_examples=60, deadline=None)
@given(itl=st.floats(5, 200), tighter=st.floats(0.1, 1.0), ctx=st.integers(64, 16384))
def test_a_tighter_itl_never_means_a_larger_batch(itl, tighter, ctx):
    pool = 150e9
    loose = c.max_num_seqs(ROOF, c.kv_bytes_per_token(LLAMA70), ctx, itl / 1000, pool)
    tight = c.max_num_seqs(ROOF, c.kv_bytes_per_token(LLAMA70), ctx, itl * tighter / 1000, pool)
    assert tight <= loose


@settings(max_examples=40, deadline=None)
@given(itl=st.floats(12, 200), ttft=st.floats(50, 5000), prompt=st.integers(16, 8000), batch=st.integers(1, 64))
def test_the_token_budget_keeps_mixed_steps_within_the_itl_target(itl, ttft, prompt, batch):
    chunk = c.token_budget(ROOF, batch, 2048, prompt, itl / 1000, ttft / 1000)
    if chunk:
        assert c.mixed_step_time(LLAMA70, H100x4, batch, 2048, chunk) <= itl / 1000
        assert c.prefill_time(ROOF, prompt, chunk, batch, 2048) <= ttft / 1000


def test_one_architecture_type_serves_the_crd_and_the_cost_model():
    from specfleet.operator import api

    assert api.Architecture is c.Architecture
    bf16 = small_model()
    fp8 = bf16.with_dtype("fp8")
    assert (fp8.dtype_bytes, fp8.kv_dtype_bytes) == (1, 1)
    assert c.kv_bytes_per_token(fp8) * 2 == c.kv_bytes_per_token(bf16)
    assert c.weights_bytes(fp8) * 2 == c.weights_bytes(bf16)


def test_the_cpu_prior_is_no_faster_than_the_roofline_fitted_to_each_shipped_cpu_profile():
    """The catalog's `cpu` entry prices CPUs without a profile: at or below what the roofline fitted to each
    shipped SmolLM2 CPU profile's points gives (docs/speculation-gpu.md, "It changed more than speculation")."""
    shape = models().by_name["smollm2-135m"].with_dtype("float32")
    prior = gpus()["cpu"].calibration(1)
    folder = Path(resources.files("specfleet.operator.catalogs") / "profiles")
    fits = {}
    for path in sorted(folder.glob("smollm2-135m--cpu*.json")):
        points = json.loads(path.read_text())["points"]
        samples = [c.StepSample(p["batch"], p["context"], p["q"], p["median_s"]) for p in points]
        fits[path.name] = fit = c.fit_calibration(samples, shape, prior)
        assert prior.flops_eff <= fit.flops_eff and prior.bw_eff <= fit.bw_eff, (path.name, fit)
    print({name: (round(f.bw_eff / 1e9, 1), round(f.flops_eff / 1e12, 3)) for name, f in fits.items()})
    assert len(fits) >= 2
