"""The simulator's truth is an engine profile, never the controller's roofline; the closed-loop trace
replay reports per phase; the speculation policies differ on a fixed fleet."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from specfleet.engine import profile_model as P
from specfleet.operator import cost
from specfleet.operator.catalogs import NO_PROFILES
from specfleet.operator.catalogs.profile_catalog import ProfileCatalog, ProfileEntry
from specfleet.sim import fleet as F, replay, run, scenarios, truth as T
from specfleet.sim.trace import Phase, Trace

from tests.control.sim_kit import CPU_SPEC, profile


def _decoded(prof: P.Profile, cal: cost.Calibration | None = None) -> float:
    """Tokens one pod's 10 running sequences decode in 1 s with `prof` as the truth."""
    spec, plan, model, truth = run.setup_spec(replay.service_spec(CPU_SPEC, "off"), prof, NO_PROFILES)
    if cal is not None:
        model = replace(model, cal=cal, prior=cal)
    fleet = F.SimulatedFleet(model, truth, spec.slo.prompt_tokens, 0.0, 1, 10_000, np.random.default_rng(0))
    fleet.add_pods(1, 0.0, 0, ready_now=True)
    n = 10
    fleet.req = {"rep": np.zeros(n), "start": np.zeros(n), "arrival": np.zeros(n), "pleft": np.zeros(n),
                 "oleft": np.full(n, 1000.0), "first": np.zeros(n), "worst": np.zeros(n), "olen": np.full(n, 1000.0),
                 "aligned": np.zeros(n)}
    fleet._advance(0.0, 1.0, 0.0)
    return float(1000.0 - fleet.req["oleft"][0])


def test_the_simulated_step_time_comes_from_the_profile():
    base = _decoded(profile())
    assert base == pytest.approx(1.0 / (0.08 + 0.004 * 10), rel=1e-6)      # 1 s / T(10) of the decode fit
    assert _decoded(profile(per_token=0.008)) == pytest.approx(1.0 / (0.08 + 0.008 * 10), rel=1e-6)


def test_the_controllers_roofline_calibration_does_not_change_the_truth():
    slow = cost.Calibration(bw_eff=1e8, flops_eff=1e9, t_fixed=1.0)
    assert _decoded(profile(), slow) == _decoded(profile())


def test_a_speculative_step_costs_the_verify_fit_at_k_plus_one_tokens_per_sequence():
    truth = T.ProfileTruth(profile(), ctx=300, chunk=64)
    steps = truth.step(np.array([4, 4, 4]), np.array([0, 3, 0]), np.array([False, False, True]))
    assert steps[0] == pytest.approx(0.08 + 0.004 * 4)
    assert steps[1] == pytest.approx(0.16 + 0.004 * 16)
    assert steps[2] == pytest.approx(max(0.08 + 0.016, 0.05 + 0.0025 * 64))   # a mixed step prefills a chunk


def test_the_shipped_gpu_profile_says_it_is_derived_not_measured():
    path = T.find_profile("llama-3.1-8b", "nvidia-h100-80gb")
    assert path is not None
    assert json.loads(path.read_text())["derived"].startswith("from published figures")
    _spec, _plan, _model, truth = run.setup(scenarios.steady())
    assert truth.source.startswith("from published figures")


def test_a_cpus_own_profile_comes_first_given_its_host_key(tmp_path):
    def write(name: str, host: dict):
        (tmp_path / name).write_text(json.dumps({"host": host}))
    write("tiny--cpu.json", {"cpu": "AMD EPYC", "family_model": "25/17", "isa": "AVX512"})
    write("tiny--cpu--intel.json", {"cpu": "Intel(R) Xeon(R)", "family_model": "6/207", "isa": "AVX512"})
    assert T.find_profile("tiny", "cpu", (tmp_path,)).name == "tiny--cpu.json"
    assert T.find_profile("tiny", "cpu", (tmp_path,), host="Intel 6/207 AVX512").name == "tiny--cpu--intel.json"
    assert T.find_profile("tiny", "cpu", (tmp_path,), host="Intel 6/143 AVX512").name == "tiny--cpu.json"


def test_a_service_without_a_profile_is_a_clear_error():
    with pytest.raises(FileNotFoundError, match="no engine profile for llama-8b on no-such-gpu"):
        T.truth_for("llama-8b", "no-such-gpu", 1000, 512, None)


def test_acceptance_comes_from_the_profiles_workload():
    p = profile(copy_rate=0.55, open_rate=0.3)
    assert T.acceptance_alpha(p, "copy-heavy") > T.acceptance_alpha(p, "open-ended") > 0
    with pytest.raises(KeyError, match="no acceptance for workload 'chat'"):
        T.acceptance_alpha(p, "chat")


def test_the_acceptance_is_read_at_each_depth_measured_from_one():
    shallow = P.Acceptance("copy-heavy", 1, 100, 80, 100, 200)           # 0.8 of one-token drafts accepted
    deep = P.Acceptance("copy-heavy", 2, 200, 90, 100, 200)              # 0.45 of two-token drafts
    p = replace(profile(), acceptance=[shallow, deep])
    alphas = T.acceptance_alphas(p, "copy-heavy", 4)
    assert alphas == (pytest.approx(0.8), pytest.approx(cost.alpha_from_acceptance(0.45, 2)))
    assert F.alpha_at(alphas, 1) == alphas[0] and F.alpha_at(alphas, 4) == alphas[1]     # past the deepest: it
    no_first = replace(profile(), acceptance=[deep])
    assert T.acceptance_alphas(no_first, "copy-heavy", 4) == T.acceptance_alpha(no_first, "copy-heavy", 4)


def test_a_pod_gains_by_the_acceptance_at_its_own_depth():
    k = np.array([1, 2])
    per_pod = F._alpha_by_pod((0.9, 0.2), k)
    assert per_pod.tolist() == [0.9, 0.2]
    assert F._expected(per_pod, k).tolist() == pytest.approx([1 + 0.9, 1 + 0.2 + 0.04])
    together, weights = F._token_classes(per_pod, k, np.ones(2))
    assert weights[0].tolist() == pytest.approx([0.1 / 1.9, 1.8 / 1.9, 0.0])     # two at a time: 0.9 of steps


TRACE = Trace(phases=(Phase("few", "copy-heavy", 40.0, 2, 2), Phase("many", "copy-heavy", 40.0, 14, 14),
                      Phase("open", "open-ended", 30.0, 4, 4)), max_tokens=48)


def test_the_trace_replay_reports_every_phase_and_its_batch_follows_the_clients():
    r = replay.replay(TRACE, CPU_SPEC, profile(), replay.ReplayConfig(mode="off"), NO_PROFILES)
    assert list(r["phases"]) == ["few", "many", "open"]
    few, many = r["phases"]["few"], r["phases"]["many"]
    for ph in r["phases"].values():
        assert {"throughput_tok_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "batch_mean",
                "speculation_on_share"} <= set(ph) and ph["requests"] > 0
    assert 1.5 <= few["batch_mean"] <= 2.0 and 8 <= many["batch_mean"] <= 14     # some wait for prefill
    assert many["throughput_tok_s"] > 2 * few["throughput_tok_s"]
    assert many["itl_p50_ms"] > few["itl_p50_ms"] and r["phases"]["open"]["speculation_on_share"] == 0


def test_the_replay_controller_switches_speculation_off_as_the_batch_grows_and_records_why():
    """Priced by the truth's own profile: what is under test is the switching, not the prior. Speculation is on
    for a larger share of the few-client phase than of the many-client one, and each switch says why."""
    priced = ProfileCatalog({("smollm2-135m", "cpu"): ProfileEntry("smollm2-135m--cpu",
                                                                  cost.profile_cost(profile(), "smollm2-135m--cpu"))})
    r = replay.replay(TRACE, CPU_SPEC, profile(), replay.ReplayConfig(mode="auto"), priced)
    assert r["phases"]["few"]["speculation_on_share"] > r["phases"]["many"]["speculation_on_share"]
    offs = [s for s in r["switches"] if s["direction"] == "off"]
    assert offs and all(s["reason"] and s["t"] > 0 for s in r["switches"])
    on = replay.replay(TRACE, CPU_SPEC, profile(), replay.ReplayConfig(mode="on"), NO_PROFILES)
    assert on["phases"]["many"]["speculation_on_share"] == 1 and not on["switches"]


def test_a_bad_replay_mode_is_an_error():
    with pytest.raises(ValueError, match="mode must be one of"):
        replay.ReplayConfig(mode="sometimes")


def test_on_a_fixed_fleet_past_its_capacity_the_speculation_policies_differ():
    sc = scenarios.adjusted(scenarios.steady(), duration=480, load=2.0)   # auto's first 90 s speculate at a cost
    on, off, auto = (run.simulate(sc, p, fixed_replicas=4) for p in ("spec-always-on", "spec-always-off", "specfleet"))
    assert on["goodput"] < 0.9 * off["goodput"]
    assert auto["goodput"] >= 0.97 * off["goodput"] and auto["speculation_switches"] >= 1
    assert auto["series"][-1]["speculation"] is False


def test_the_replay_controller_starts_from_the_roofline_and_learns_online():
    _spec, _plan, model, _truth = run.setup_spec(replay.service_spec(CPU_SPEC, "off"), profile(), NO_PROFILES)
    ramp = Trace(phases=(Phase("ramp", "copy-heavy", 120.0, 1, 16),), max_tokens=48)
    # 15 s windows: a refit needs MIN_STEPS steps in each of two batch buckets, more than 5 s of ~0.2 s steps hold
    r = replay.replay(ramp, CPU_SPEC, profile(), replay.ReplayConfig(mode="off", interval_s=15.0, dwell_s=30.0),
                      NO_PROFILES)
    prior = {"bw_eff": model.prior.bw_eff, "flops_eff": model.prior.flops_eff, "t_fixed": model.prior.t_fixed}
    assert r["calibration"] != prior


def test_a_fit_that_misses_its_points_is_replaced_by_the_decode_fit_and_says_so():
    p = profile()
    p.fit["prefill"] = replace(p.fit["prefill"], rel_rms_error=0.98)
    truth = T.ProfileTruth(p, ctx=300, chunk=64)
    mixed = truth.step(np.array([4]), np.array([0]), np.array([True]))[0]
    assert mixed == pytest.approx(0.08 + 0.004 * 64)                  # the decode fit over the chunk's tokens
    assert truth.notes == ["prefill fit error 98% > 50%: prefill steps priced by the decode fit over the same tokens"]
    assert T.ProfileTruth(profile(), ctx=300, chunk=64).notes == []


def _pod(prof: P.Profile, k: int, n: int = 10, seed: int = 0) -> F.SimulatedFleet:
    """One ready pod of `prof`'s truth at depth `k` holding `n` decoding sequences, recording its ticks."""
    spec, _plan, model, truth = run.setup_spec(replay.service_spec(CPU_SPEC, "on"), prof, NO_PROFILES)
    fleet = F.SimulatedFleet(model, truth, spec.slo.prompt_tokens, 0.0, 1, 10_000, np.random.default_rng(seed))
    fleet.add_pods(1, 0.0, k, ready_now=True)
    fleet.req = {"rep": np.zeros(n), "start": np.zeros(n), "arrival": np.zeros(n), "pleft": np.zeros(n),
                 "oleft": np.full(n, 1e6), "first": np.zeros(n), "worst": np.zeros(n), "olen": np.full(n, 1e6),
                 "aligned": np.zeros(n)}
    fleet.record = F.Record()
    return fleet


def test_a_speculating_pod_reports_each_tokens_interval_not_the_mean():
    # k = 2 at acceptance 0.5: a sequence-step yields 1, 2 or 3 tokens with probability 0.5, 0.25, 0.25,
    # so 0.5, 0.5 and 0.75 of every 1.75 tokens come 1, 2 and 3 at a time, at step / 1, / 2 and / 3
    fleet = _pod(profile(), k=2)
    fleet._advance(0.0, 1.0, 0.5, np.array([1.0]))
    step = 0.16 + 0.004 * 10 * 3
    _, itl, tokens = fleet.record.intervals[0]
    assert itl == pytest.approx([step, step / 2, step / 3])
    assert tokens / tokens.sum() == pytest.approx(np.array([0.5, 0.5, 0.75]) / 1.75)
    assert fleet.itl_sum[0] / tokens.sum() == pytest.approx(step / 1.75)     # the mean is unchanged
    assert fleet.itl_h[0].sum() == pytest.approx(tokens.sum())
    plain = _pod(profile(), k=0)
    plain._advance(0.0, 1.0, 0.5, np.array([1.0]))
    assert plain.record.intervals[0][1] == pytest.approx([0.08 + 0.004 * 10])


def test_step_times_vary_by_the_profiles_measured_spread_with_their_mean_and_arrivals_kept():
    points = [P.StepPoint("decode", b, 128, 1, 0.1, 0.0347, 15) for b in (1, 2, 4)]
    spread = replace(profile(), points=points)
    assert T.ProfileTruth(spread, 300, 64).step_sigma == pytest.approx(0.0347 / 0.1 / T.expected_range(15))
    assert T.ProfileTruth(profile(), 300, 64).step_sigma == 0.0             # no repeats, no spread
    assert T.expected_range(15) == pytest.approx(3.472, abs=0.01)          # the tabulated d2(15)
    fleet = _pod(spread, k=0)
    for tick in range(400):
        fleet._advance(tick * 0.1, 0.1, 0.0, np.array([1.0]))
    steps = np.array([itl[0] for _, itl, _ in fleet.record.intervals])
    mean = 0.08 + 0.004 * 10
    assert steps.mean() == pytest.approx(mean, rel=0.02)
    assert np.std(steps) / mean == pytest.approx(0.1, rel=0.2)
    same = _pod(profile(), k=0, seed=0)
    assert fleet.rng.uniform() == same.rng.uniform()                        # the arrivals' stream is untouched
