"""Step costs: the planner sizes from a measured profile when one exists, from the roofline otherwise."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from cost_profiles import CPU_FITS, cpu_catalog, cpu_cost, cpu_profile, write_profile, write_text

from specfleet.engine.profile_model import StepFit, save
from specfleet.operator import api, capacity, catalogs, planner
from specfleet.operator import cost as c
from specfleet.operator.catalogs.profile_catalog import NO_PROFILES, read_catalog
from specfleet.operator.cost import ObservedStep, fit_error, profile_cost, refine, verifying_share

CPU = {"model": {"name": "smollm2-135m", "source": "builtin:smollm2-135m", "dtype": "float32"}, "accelerator": {"type": "cpu", "count": 1},
       "runtime": {"engine": "specfleet"},
       "slo": {"ttftP99Ms": 2000, "itlP99Ms": 200, "maxContextTokens": 2048, "promptTokens": 256,
               "outputTokens": 128, "requestsPerSecond": 0.3},
       "speculation": {"mode": "auto", "method": "ngram", "maxSpeculativeTokens": 4},
       "autoscaling": {"minReplicas": 1, "maxReplicas": 2}}


def test_profile_cost_prices_decode_verify_and_mixed_steps_from_its_fits():
    cost = cpu_cost()
    d, v, p = CPU_FITS["decode"], CPU_FITS["verify"], CPU_FITS["prefill"]
    assert cost.step(8, 300) == pytest.approx(d.a + d.s * 8 + d.b * 8 + d.c * 8 * 300)
    assert cost.step(8, 300, q=5) == pytest.approx(v.a + v.s * 8 + v.b * 40 + v.c * 40 * 300)
    # 8 decodes plus 56 prompt tokens attending to half the context on average
    assert cost.mixed(8, 300, 64) == pytest.approx(cost.step(8, 300) + p.b * 56 + p.c * 56 * 150)


def test_planner_sizes_from_the_profile_of_the_model_and_accelerator(make_spec, gpus, models):
    spec = make_spec(**CPU)
    roofline = planner.plan(spec, gpus, models)
    measured = planner.plan(spec, gpus, models, cpu_catalog())
    assert measured.calibration.source == "profile" and measured.calibration.profile == "smollm2-135m--cpu"
    assert measured.calibration.fit_error == pytest.approx(cpu_cost().fit_error)
    assert roofline.calibration.source == "roofline" and roofline.profile is None
    # The hand-made profile's steps are slower than the cpu catalog entry's roofline: fewer sequences fit the ITL.
    assert measured.max_num_seqs < roofline.max_num_seqs
    assert measured.predicted.tokens_per_second_per_replica < roofline.predicted.tokens_per_second_per_replica
    model = capacity.service_model(spec, measured, gpus, models)
    assert model.cost is measured.profile and model.calibration == measured.calibration


def test_a_gpu_entry_without_a_profile_plans_exactly_as_before(make_spec, gpus, models):
    spec = make_spec()
    assert planner.plan(spec, gpus, models, cpu_catalog()) == planner.plan(spec, gpus, models, NO_PROFILES)
    model = capacity.service_model(spec, planner.plan(spec, gpus, models, cpu_catalog()), gpus, models)
    assert model.cost == c.Roofline(model.shape, model.cal)


def test_a_profile_is_found_by_the_model_source_when_the_name_differs(make_spec, gpus, models):
    spec = make_spec(**{**CPU, "model": {**CPU["model"], "name": "chat"}})
    assert planner.plan(spec, gpus, models, cpu_catalog()).calibration.source == "profile"


def test_the_packaged_catalogue_reads_a_profile_file(tmp_path, make_spec, gpus, models):
    write_profile(tmp_path)
    catalog = read_catalog(tmp_path)
    result = planner.plan(make_spec(**CPU), gpus, models, catalog)
    assert result.profile == cpu_cost()


def test_a_profile_measured_in_another_dtype_is_not_the_cost_of_the_declared_one(make_spec, gpus, models):
    bf16 = make_spec(**{**CPU, "model": {**CPU["model"], "dtype": "bfloat16"}})
    result = planner.plan(bf16, gpus, models, cpu_catalog())
    assert result.profile is None and result.calibration.source == "roofline"
    assert result.calibration.reason == "profile smollm2-135m--cpu was measured in float32; spec.model.dtype is bfloat16"
    assert result == replace(planner.plan(bf16, gpus, models), calibration=result.calibration)


@pytest.mark.parametrize("text, says", [("{not json", "unusable"), ('{"version": 9}', "version 9"),
                                        ('{"version": 1, "model": "m"}', "malformed")])
def test_a_bad_profile_file_plans_on_the_roofline_and_says_why(tmp_path, make_spec, gpus, models, text, says):
    write_text(tmp_path, text)
    result = planner.plan(make_spec(**CPU), gpus, models, read_catalog(tmp_path))
    assert isinstance(result, planner.Plan) and result.profile is None
    assert result.calibration.source == "roofline"
    assert "smollm2-135m--cpu.json" in result.calibration.reason and says in result.calibration.reason
    assert result == replace(planner.plan(make_spec(**CPU), gpus, models), calibration=result.calibration)


def test_a_profile_without_a_decode_fit_is_refused(tmp_path, make_spec, gpus, models):
    profile = cpu_profile()
    profile.fit.pop("decode")
    save(profile, tmp_path / "smollm2-135m--cpu.json")
    result = planner.plan(make_spec(**CPU), gpus, models, read_catalog(tmp_path))
    assert result.calibration.source == "roofline" and "no decode fit" in result.calibration.reason


def test_the_speculation_threshold_comes_from_the_profile(make_spec, gpus, models):
    spec = make_spec(**CPU)
    roofline = planner.plan(spec, gpus, models).predicted.max_batch_for_speculation
    measured = planner.plan(spec, gpus, models, cpu_catalog()).predicted.max_batch_for_speculation
    assert measured != roofline
    # A verify pass whose tokens cost more makes speculation stop paying at a smaller batch.
    v = CPU_FITS["verify"]
    dearer = planner.plan(spec, gpus, models, cpu_catalog(verify=replace(v, b=1.5 * v.b)))
    assert 1 <= dearer.predicted.max_batch_for_speculation < measured
    cheaper = planner.plan(spec, gpus, models, cpu_catalog(verify=replace(v, b=0.6 * v.b)))
    assert cheaper.predicted.max_batch_for_speculation > measured


def test_the_threshold_is_the_largest_batch_where_the_profile_says_speculation_pays():
    cost = cpu_cost()
    alpha = 0.6
    mbs = c.max_batch_for_speculation(cost, 300, alpha, 4)
    assert c.best_k(cost, mbs, 300, alpha, 4) > 0 and c.best_k(cost, mbs + 1, 300, alpha, 4) == 0


def test_refinement_moves_each_step_kind_toward_what_was_observed():
    cost = cpu_cost()
    plain = ObservedStep(16, 1, 0, 1.2 * cost.step(16, 300), 100)
    verify = ObservedStep(8, 5, 0, 1.5 * cost.step(8, 300, 5), 100)
    refined = refine(cost, [plain, verify], 300, blend=0.5)
    assert refined.decode_scale == pytest.approx(1.2 ** 0.5)
    assert refined.verify_scale == pytest.approx(1.5 ** 0.5)
    assert fit_error(refined, [plain, verify], 300) < fit_error(cost, [plain, verify], 300)


def test_the_verify_scale_tracks_verify_steps_while_the_decode_floor_prices_them():
    # A verify fit cheaper than the decode fit at the same tokens (the shipped SmolLM2 profile's, by its
    # intercept): `step` prices verification at the decode floor. Refined against that floor, the scale
    # fell toward 1/5 while the steps took 1.1x the verify fit; it must settle at 1.1.
    d = CPU_FITS["decode"]
    cost = replace(cpu_cost(), verify=replace(d, a=0.8 * d.a, b=0.8 * d.b, c=0.8 * d.c))
    assert cost.verified(8, 300, 3) < cost.step(8, 300, 3)
    seen = [ObservedStep(8, 3, 0, 1.1 * cost.verified(8, 300, 3), 100)]
    for _ in range(30):
        cost = refine(cost, seen, 300, blend=0.5)
    assert cost.verify_scale == pytest.approx(1.1, rel=1e-3) and cost.decode_scale == pytest.approx(1.1, rel=1e-3)


def test_a_window_of_one_kind_moves_both_scales_alike_and_keeps_their_ratio():
    """Speculation on throughout a window shows only verify steps, off only decodes. Engines uniformly
    slower than the profile: moving only the kind seen priced the state in force dearer than the other
    one, on as well as off, which is how the controller went off and on again at one batch."""
    cost = replace(cpu_cost(), decode_scale=1.0, verify_scale=1.25)      # the ratio last seen together
    on = [ObservedStep(16, 2.5, 0, 1.4 * cost.verified(16, 300, 2.5), 100)]
    off = [ObservedStep(16, 1, 0, 1.4 * cost.step(16, 300), 100)]
    after_on, after_off = refine(cost, on, 300, blend=1.0), refine(cost, off, 300, blend=1.0)
    assert after_on.decode_scale == pytest.approx(1.4) and after_on.verify_scale == pytest.approx(1.4 * 1.25)
    assert after_off.decode_scale == pytest.approx(1.4) and after_off.verify_scale == pytest.approx(1.4 * 1.25)
    speedup = lambda c: 2.0 * c.step(16, 300) / c.step(16, 300, 2.5)       # noqa: E731
    assert speedup(after_on) == pytest.approx(speedup(after_off)) == pytest.approx(speedup(cost))
    both = refine(cost, on + [ObservedStep(16, 1, 0, 1.1 * cost.step(16, 300), 100)], 300, blend=1.0)
    assert both.decode_scale == pytest.approx(1.1) and both.verify_scale == pytest.approx(1.4 * 1.25)


def test_without_a_verify_fit_a_verify_step_is_priced_by_the_decode_fit():
    cost = replace(cpu_cost(), verify=None)
    d = CPU_FITS["decode"]
    assert cost.step(4, 100, q=3) == pytest.approx(d.a + d.s * 4 + d.b * 12 + d.c * 12 * 100)


def test_a_negative_intercept_never_prices_a_step_at_zero_or_less():
    cost = replace(cpu_cost(), decode=StepFit(a=-1.0, b=0.001, c=0.0, rel_rms_error=0.1, num_points=3))
    assert cost.step(1, 10) > 0


def test_the_shipped_catalogue_loads_without_errors():
    catalog = catalogs.profiles()
    assert all(entry.cost is not None for entry in catalog.entries.values()), catalog.entries


def test_the_break_even_batch_is_where_speculating_at_k_stops_beating_plain_decoding():
    cost, alpha, k = cpu_cost(), 0.7, 4
    b = c.break_even_batch(cost, 200, alpha, k)
    assert 1 < b < 4096
    assert c.goodput(cost, b * 0.99, 200, alpha, k) > c.goodput(cost, b * 0.99, 200, alpha, 0)
    assert c.goodput(cost, b * 1.01, 200, alpha, k) < c.goodput(cost, b * 1.01, 200, alpha, 0)
    assert c.break_even_batch(cost, 200, 0.0, k) == 0.0


def test_a_noisy_verify_fit_is_left_out_and_the_decode_fit_prices_verification(make_spec, gpus, models):
    noisy = replace(CPU_FITS["verify"], b=1.0, rel_rms_error=1.3)
    cost = cpu_cost(verify=noisy)
    d = CPU_FITS["decode"]
    assert cost.verify is None and cost.step(4, 100, q=5) == pytest.approx(d.a + d.s * 4 + d.b * 20 + d.c * 20 * 100)
    result = planner.plan(make_spec(**CPU), gpus, models, cpu_catalog(verify=noisy))
    assert result.calibration.source == "profile" and "verify (130%)" in result.calibration.reason


def test_a_profile_whose_decode_fit_is_noisy_is_refused(tmp_path, make_spec, gpus, models):
    profile = cpu_profile(decode=replace(CPU_FITS["decode"], rel_rms_error=0.6))
    with pytest.raises(ValueError, match="decode fit is off by 60%"):
        profile_cost(profile, "p")
    save(profile, tmp_path / "smollm2-135m--cpu.json")
    result = planner.plan(make_spec(**CPU), gpus, models, read_catalog(tmp_path))
    assert result.calibration.source == "roofline" and "off by 60%" in result.calibration.reason


def test_specfleet_plan_prints_the_calibration_source_and_fit_error(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from specfleet.cli.main import app

    example = Path(__file__).parents[2] / "manifests/examples/smollm2-cpu.yaml"
    out = CliRunner().invoke(app, ["plan", "-f", str(example), "-o", "yaml"])
    assert out.exit_code == 0, out.output
    shipped = yaml.safe_load(out.output)["calibration"]
    assert shipped["source"] == "profile" and shipped["profile"] == "smollm2-135m--cpu" and shipped["fitError"] < 0.25
    table = CliRunner().invoke(app, ["plan", "-f", str(example)], env={"COLUMNS": "200"})
    assert f"profile smollm2-135m--cpu, fit error {shipped['fitError']:.1%}" in table.output
    gpu = Path(__file__).parents[2] / "manifests/examples/llama-70b-chat.yaml"
    assert "roofline (no profile for this model and accelerator)" in CliRunner().invoke(
        app, ["plan", "-f", str(gpu)], env={"COLUMNS": "200"}).output


def test_a_verification_step_is_never_priced_below_the_decode_fit_over_its_tokens():
    """The online scales move apart (decode learned while off, verify while on); a stale verify scale
    must not make speculation look cheap: the floor is the decode fit, at its scale, over the same tokens."""
    cost = replace(cpu_cost(), decode_scale=3.0, verify_scale=0.5)
    for batch in (1, 8, 64):
        assert cost.step(batch, 256, 3) == pytest.approx(3.0 * cost.decode.seconds(batch, 256, 3))
    by_decode = replace(cost, verify=None, verify_scale=3.0)
    assert c.max_batch_for_speculation(cost, 256, 0.7, 4) == c.max_batch_for_speculation(by_decode, 256, 0.7, 4)
    assert c.max_batch_for_speculation(cost, 256, 0.7, 4) < 4096


def test_a_draft_share_below_one_lowers_both_the_gain_and_the_cost_of_speculating(make_spec, gpus, models):
    cost = cpu_cost()
    assert c.expected_tokens(0.8, 4, share=0.5) == pytest.approx(1 + 0.5 * (c.expected_tokens(0.8, 4) - 1))
    assert c.spec_step_time(cost, 8, 256, 4, share=0.5) < c.spec_step_time(cost, 8, 256, 4)
    assert c.spec_step_time(cost, 8, 256, 4, share=0.5) == pytest.approx(cost.step(8, 256, 3.0, 0.5))
    tokens = 1 + 0.5 * (c.expected_tokens(0.8, 4) - 1)
    assert c.goodput(cost, 8, 256, 0.8, 4, share=0.5) == pytest.approx(8 * tokens / cost.step(8, 256, 3.0, 0.5))
    spec = make_spec(**CPU)
    plan = planner.plan(spec, gpus, models, cpu_catalog())
    model = capacity.service_model(spec, plan, gpus, models).with_draft_share(0.5)
    assert model.step(8, 4) == pytest.approx(model.cost.step(8, model.ctx, 3.0, 0.5))
    assert model.prefill_room(8, 4) == model.chunk - 24


def test_a_share_per_token_off_is_fewer_steps_once_drafts_are_accepted():
    """Off, the engine proposes after every token; on, an accepted draft passes the positions that have
    one in fewer steps. 0.6 of the tokens at a = 0.73, k = 1 (1.73 tokens a drafting step) is 0.46 of
    the steps, the two readings the closed loop saw (0.59-0.61 off, 0.39-0.45 on)."""
    assert c.share_per_step(0.6, 0.73, 1) == pytest.approx(0.6 / 1.73 / (0.6 / 1.73 + 0.4))
    assert 0.45 < c.share_per_step(0.6, 0.73, 1) < 0.47
    for share, alpha, k in ((0.6, 0.73, 1), (0.3, 0.5, 4), (0.9, 0.99, 2)):
        assert c.share_per_token(c.share_per_step(share, alpha, k), alpha, k) == pytest.approx(share)
    assert c.share_per_step(0.6, 0.0, 3) == pytest.approx(0.6) and c.share_per_step(0.6, 0.8, 0) == 0.6


def test_a_step_without_drafts_is_a_decode_step_and_pays_no_verify_fixed_cost():
    """The verify fit's fixed cost is paid by the steps that verify: with few drafting sequences most
    steps have none and run as decode steps (the engine verifies only where a sequence has a draft)."""
    cost = cpu_cost()
    decode, verify = cost.step(8, 256), cost.step(8, 256, 5.0)
    assert verify - cost.step(8, 256, 5.0, 1.0) == pytest.approx(0.0)       # everyone drafts: as measured
    assert cost.step(8, 256, 1.0, 0.0) == pytest.approx(decode)
    assert verifying_share(0.1, 8) == pytest.approx(1 - 0.9 ** 8)
    assert verifying_share(0.5, 1) == pytest.approx(0.5)
    # one sequence in 20 drafts 4 tokens: the expected step mixes verify steps (carrying all the drafts) and
    # decode steps, and lies well below a verify step over the same mean tokens
    p = verifying_share(0.05, 8)
    q_verify = 1 + 0.05 * 4 / p
    mixed = cost.step(8, 256, 1.2, 0.05)
    verifying = max(cost.verified(8, 256, q_verify), cost.decode.seconds(8, 256, q_verify))
    assert mixed == pytest.approx(p * verifying + (1 - p) * decode)
    assert decode < mixed < cost.step(8, 256, 1.2)


def test_shares_by_depth_price_each_depth_at_its_own_share(make_spec, gpus, models):
    cost, shares = cpu_cost(), (0.45, 0.33, 0.27, 0.23)
    assert [c.share_at(shares, k) for k in (1, 2, 4)] == [0.45, 0.33, 0.23]
    assert c.share_at(shares, 8) == pytest.approx(0.23 * 4 / 8)      # proposals stop at the deepest measured
    assert c.share_at(0.4, 3) == 0.4
    for k in (1, 2, 4):     # tokens at depth k's share; verifying steps from the share that drafts at all
        assert c.goodput(cost, 8, 256, 0.8, k, share=shares) == pytest.approx(
            8 * c.expected_tokens(0.8, k, shares[k - 1]) / cost.step(8, 256, 1 + shares[k - 1] * k, shares[0]))
    spec = make_spec(**CPU)
    plan = planner.plan(spec, gpus, models, cpu_catalog())
    model = capacity.service_model(spec, plan, gpus, models).with_draft_share(shares)
    assert model.prefill_room(8, 2) == model.chunk - round(8 * (1 + 0.33 * 2))
    assert model.tokens_per_step(0.8, 4) == pytest.approx(c.expected_tokens(0.8, 4, 0.23))


def test_the_speculation_threshold_is_the_last_batch_that_pays_past_a_gap_below_the_knee(make_spec):
    """A cost that bends at 16 tokens, as SmolLM2's CPU profile did at `80b2c23` (its fits, by hand): just
    below the knee a verify step's extra rows cost the few-row price, so at a = 0.5 speculation stops
    paying for some batches and pays again past them. The threshold is where it stops for good, not the
    first gap."""
    bent = dict(b=0.003557, c=1.722e-6, s=-5.85e-5, knee=16.0, b2=-0.001353, sc=2.017e-7)
    catalog = cpu_catalog(decode=StepFit(a=0.02724, rel_rms_error=0.06, num_points=14, **bent),
                          verify=StepFit(a=0.02673, rel_rms_error=0.05, num_points=56, **bent),
                          prefill=StepFit(a=0.0655, b=0.002205, c=6.44e-7, rel_rms_error=0.02, num_points=6))
    spec = make_spec(**CPU)
    plan = planner.plan(spec, catalogs.gpus(), catalogs.models(), catalog)
    model = capacity.service_model(spec, plan, catalogs.gpus(), catalogs.models()).with_draft_share(0.3)
    pays = [c.best_k(model.cost, b, model.ctx, 0.5, 4, model.draft, model.draft_share) > 0 for b in range(1, 200)]
    threshold = model.max_batch_for_speculation(0.5)
    assert pays[0] and not all(pays[:threshold]), "no gap: the test lost its case"
    assert pays[threshold - 1] and not any(pays[threshold:])



RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
EXAMPLE = Path(__file__).resolve().parents[2] / "manifests" / "examples" / "smollm2-cpu.yaml"


def _example_service() -> capacity.ServiceModel:
    """The service the slow batch-loop test runs: the example CR, planned on the shipped profile catalogue."""
    spec = api.parse_spec(yaml.safe_load(EXAMPLE.read_text())["spec"])
    plan = planner.plan(spec, catalogs.gpus(), catalogs.models(), catalogs.profiles())
    return capacity.service_model(spec, plan, catalogs.gpus(), catalogs.models())


def _measured(name: str) -> tuple[float, float]:
    """(acceptance, draft share) of copy-heavy prompts: with two-token matches at the full-length closed
    loop's peak (auto), with one-token matches in the steady k = 1 run."""
    data = json.loads((RESULTS / name).read_text())
    if "runs" in data:
        peak = data["runs"]["auto"]["phases"]["peak"]
        return peak["acceptance"], peak["draft_tokens_per_seq_step"]
    row = next(r for r in data["break_even"] if r["workload"] == "copy-heavy")
    return row["acceptance_rate"], row["draft_share"]


def test_the_shipped_profile_prices_two_token_matches_inside_the_band_and_one_token_matches_out_of_it():
    """What docs/control.md says of the slow batch-loop test (tests/fleet/test_speculation_batch_loop.py), priced
    as its controller prices it: with two-token matches the best depth never falls below the dead band up to
    the plan's cap; with one-token matches k = 1 leaves the band at batch 1 and at 48, and the off edge moves
    from tens to hundreds of sequences between the measured acceptance and 0.65."""
    model = _example_service()
    band = model.calibration.fit_error
    alpha, share = _measured("closed_loop_full.json")
    two_token = model.with_draft_share(share)
    assert all(two_token.speedup(b, alpha)[0] > 1 - band for b in range(1, model.max_num_seqs + 1))
    alpha, share = _measured("speculation_steady_k1_ngram1.json")
    one_token = replace(model, max_k=1).with_draft_share(share)
    assert one_token.speedup(1, alpha)[0] == pytest.approx(1.25, abs=0.01)
    assert one_token.speedup(48, alpha)[0] == pytest.approx(0.92, abs=0.01)
    assert one_token.speedup(1, alpha)[0] > 1 + band and one_token.speedup(48, alpha)[0] < 1 - band
    off_edge = [one_token.max_batch_for_speculation(a, -band) for a in (alpha, 0.65)]
    assert off_edge == [34, 194], off_edge


def test_the_batch_loop_service_lets_a_speculating_batch_pass_the_off_edge():
    """The slow batch-loop test's service (the example CR at an ITL target of 500 ms, one-token matches, k <= 1)
    plans 119 sequences and 256 tokens a step, room for a speculating batch past the off edge the shipped
    profile prices at the acceptance the steady run measured (the example's 80 tokens held it near 44)."""
    doc = yaml.safe_load(EXAMPLE.read_text())["spec"]
    spec = api.parse_spec({**doc, "slo": {**doc["slo"], "itlP99Ms": 500},
                           "speculation": {**doc["speculation"], "maxSpeculativeTokens": 1, "minAcceptanceRate": 0.3}})
    plan = planner.plan(spec, catalogs.gpus(), catalogs.models(), catalogs.profiles())
    assert (plan.max_num_seqs, plan.max_num_batched_tokens) == (119, 256)
    model = capacity.service_model(spec, plan, catalogs.gpus(), catalogs.models())
    alpha, share = _measured("speculation_steady_k1_ngram1.json")
    off_edge = model.with_draft_share(share).max_batch_for_speculation(alpha, -model.calibration.fit_error)
    assert off_edge * 1.15 < min(plan.max_num_seqs, plan.max_num_batched_tokens / (1 + share)), off_edge
