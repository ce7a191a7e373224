"""Contention in the simulator: factors per client count interpolated and clamped, applied to every
simulated step by the clients in flight, nothing changed without them, and sim_to_real's contention truth."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from specfleet.operator.catalogs import NO_PROFILES
from specfleet.engine import profile_model as P
from specfleet.operator.control.window import TTFT, Histogram, Scrape, StepStat
from specfleet.sim import contention as C, fleet as F, replay, run
from specfleet.sim.trace import Phase, Trace

from tests.control.sim_kit import CPU_SPEC, ROOT, profile

sys.path.insert(0, str(ROOT / "benchmarks"))
import contention as bench  # noqa: E402  (benchmarks/contention.py)
import closed_loop  # noqa: E402  (benchmarks/closed_loop.py)
import sim_to_real  # noqa: E402  (benchmarks/sim_to_real.py)

TRACE = Trace(phases=(Phase("few", "copy-heavy", 30.0, 2, 2), Phase("many", "copy-heavy", 30.0, 12, 12)),
              max_tokens=48)


def result(off: dict[int, float], on: dict[int, float] | None = None) -> dict:
    """benchmarks/contention.py's `factors` for these step factors."""
    states = {"off": off, **({"on": on} if on else {})}
    return {"factors": {s: {str(c): {"step_factor": f, "period_factor": f * 1.1} for c, f in v.items()}
                        for s, v in states.items()}}


def test_the_factor_is_linear_between_measured_counts_and_clamped_outside():
    c = C.Contention((1.0, 4.0, 8.0), (2.0, 1.4, 1.6), (2.2, 1.5, 1.8))
    assert np.allclose(c.factor(np.array([0, 1, 2.5, 4, 6, 8, 30])), [2.0, 2.0, 1.7, 1.4, 1.5, 1.6, 1.6])
    assert np.allclose(c.factor(np.array([1, 6, 30]), np.array([True, True, False])), [2.2, 1.65, 1.6])


def test_the_benchmarks_result_loads_by_basis_and_a_state_not_run_takes_the_others():
    c = C.from_result(result({1: 2.0, 4: 1.4}))
    assert c.clients == (1.0, 4.0) and c.off == c.on == (2.0, 1.4)
    both = C.from_result(result({1: 2.0, 4: 1.4}, {1: 3.0, 4: 1.5}), basis="period_factor")
    assert np.allclose(both.off, (2.2, 1.54)) and np.allclose(both.on, (3.3, 1.65))
    with pytest.raises(ValueError, match="basis"):
        C.from_result(result({1: 2.0}), basis="wall")


@pytest.mark.parametrize("clients, off, on, why", [
    ((), (), (), "one factor per client count"),
    ((4.0, 1.0), (1.0, 1.0), (1.0, 1.0), "must ascend"),
    ((1.0,), (0.0,), (1.0,), "> 0"),
])
def test_bad_contention_is_refused(clients, off, on, why):
    with pytest.raises(ValueError, match=why):
        C.Contention(clients, off, on)


def _fleet(contention: C.Contention | None) -> F.SimulatedFleet:
    spec, plan, model, truth = run.setup_spec(replay.service_spec(CPU_SPEC, "off"), profile(), NO_PROFILES)
    fleet = F.SimulatedFleet(model, truth, spec.slo.prompt_tokens, 0.0, 1, 10_000, np.random.default_rng(0),
                             contention=contention)
    fleet.add_pods(2, 0.0, 0, ready_now=True)
    return fleet


def test_the_factor_at_the_clients_in_flight_reaches_every_pods_step_time():
    contention = C.Contention((1.0, 10.0), (1.0, 4.0), (2.0, 8.0))
    plain, slowed = _fleet(None), _fleet(contention)
    for fleet in (plain, slowed):
        fleet.submit(np.zeros(4), np.full(4, 48.0))          # 4 in flight: factor 2 off, 4 on
    args = (np.array([3.0, 5.0]), np.array([0, 2]), np.array([False, False]))
    assert np.allclose(slowed._step_time(*args), plain._step_time(*args) * [2.0, 4.0])


def test_a_slower_truth_by_contention_shows_in_the_replays_figures():
    base = replay.replay(TRACE, CPU_SPEC, profile(), replay.ReplayConfig(mode="off"), NO_PROFILES)
    twice = replay.replay(TRACE, CPU_SPEC, profile(),
                          replay.ReplayConfig(mode="off", contention=C.Contention((1.0,), (2.0,), (2.0,), "x.json")),
                          NO_PROFILES)
    assert twice["contention"] == "x.json" and "contention" not in base
    for phase in ("few", "many"):
        ratio = twice["phases"][phase]["itl_p50_ms"] / base["phases"][phase]["itl_p50_ms"]
        assert 1.7 < ratio < 2.3
        assert twice["phases"][phase]["throughput_tok_s"] < 0.7 * base["phases"][phase]["throughput_tok_s"]


def test_no_contention_and_a_factor_of_one_give_identical_replays():
    base = replay.replay(TRACE, CPU_SPEC, profile(), replay.ReplayConfig(mode="auto"), NO_PROFILES)
    ones = replay.replay(TRACE, CPU_SPEC, profile(),
                         replay.ReplayConfig(mode="auto", contention=C.Contention((1.0, 24.0), (1.0, 1.0), (1.0, 1.0))),
                         NO_PROFILES)
    ones.pop("contention")
    assert json.dumps(ones, sort_keys=True) == json.dumps(base, sort_keys=True)


def test_sim_to_real_runs_with_the_contention_truth(tmp_path):
    calibration = tmp_path / "contention.json"
    calibration.write_text(json.dumps(result({1: 2.0, 8: 1.5, 24: 1.7}, {1: 2.1, 8: 1.6, 24: 1.9})))
    out = tmp_path / "s2r.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks/sim_to_real.py"), "--real",
                    str(ROOT / "benchmarks/results/closed_loop_zen4.json"), "--modes", "on", "--seeds", "0",
                    "--truth", "contention", "--contention", str(calibration), "--out", str(out)],
                   check=True, capture_output=True, text=True, timeout=120)
    r = json.loads(out.read_text())
    assert r["truth"] == "contention" and r["contention_factors"]["on"] == [2.1, 1.6, 1.9]
    assert set(r["within_by_phase"]) == {"ramp-up", "peak", "ramp-down", "open-ended"}
    assert 0 <= r["within_share"] <= 1 and r["simulator"]["on"]["phases"]["peak"]["requests"] > 0


def test_sim_to_real_prices_by_the_profile_the_real_loop_priced_by():
    real = {"runs": {"auto": {"calibration": {"profile": "smollm2-135m--cpu--intel-6-207"}}, "off": {}}}
    assert sim_to_real.default_profile(real).name == "smollm2-135m--cpu--intel-6-207.json"


def test_contention_measured_against_another_profile_is_refused(tmp_path):
    calibration = tmp_path / "contention.json"
    calibration.write_text(json.dumps({**result({1: 2.0}), "profile_file": "operator/catalogs/profiles/a--cpu.json"}))
    with pytest.raises(SystemExit, match="measured its factors against .*a--cpu.json"):
        sim_to_real.checked_contention(calibration, "step_factor", tmp_path / "b--cpu.json")
    same = sim_to_real.checked_contention(calibration, "step_factor", tmp_path / "a--cpu.json")
    assert same.off == (2.0,)


def test_the_calibration_sets_the_clients_ttft_beside_the_engines():
    def scrape(t: float, count: float, total: float) -> Scrape:
        return Scrape(t, histograms={TTFT: Histogram((0.5, math.inf), (count, count), total)})

    scrapes = [scrape(3.0, 10, 1.0), scrape(5.0, 12, 1.4), scrape(9.0, 14, 2.2)]
    sent = [closed_loop.Request(0, "copy-heavy", start, ttft_s=ttft) for start, ttft in
            ((2.0, 0.9), (4.0, 0.25), (6.0, 0.35), (7.0, None), (12.0, 0.5))]
    row = bench.ttft_means(scrapes, sent, 4.0, 10.0)
    # the engine: 0.8 s over the 2 first tokens between the scrapes inside the span (5 s and 9 s)
    assert row == {"ttft_client_ms": 300.0, "ttft_requests": 2, "ttft_engine_ms": 400.0}
    assert bench.ttft_means(scrapes[:1], [], 4.0, 10.0) == {"ttft_client_ms": None, "ttft_requests": 0,
                                                            "ttft_engine_ms": None}


def test_the_replay_takes_the_workloads_own_acceptance(tmp_path, monkeypatch):
    measured = tmp_path / "acceptance.json"
    measured.write_text(json.dumps({"acceptance": [
        {"workload": w, "k": k, "draft_tokens": 100, "accepted_tokens": 20, "drafts": 50, "decode_seq_steps": 400}
        for w in ("copy-heavy", "open-ended") for k in (1, 2)]}))
    accepted = sim_to_real.workload_acceptance(measured)
    assert [(a.workload, a.k, a.rate) for a in accepted][:2] == [("copy-heavy", 1, 0.2), ("copy-heavy", 2, 0.2)]
    with pytest.raises(SystemExit, match="not an acceptance measurement"):
        sim_to_real.workload_acceptance(tmp_path / "absent.json")
    monkeypatch.setattr(sim_to_real, "ACCEPTANCE", tmp_path / "absent.json")    # the default, not measured yet
    assert sim_to_real.workload_acceptance(tmp_path / "absent.json") is None
    assert sim_to_real.workload_acceptance(None) is None
    path = tmp_path / "p--cpu.json"
    P.save(profile(), path)
    trace = Trace((Phase("copy", "copy-heavy", 20.0, 2, 2),), max_tokens=32)
    own = sim_to_real.simulate(path, ("on",), (0,), trace, 5.0, 10.0, {"copy-heavy": 64}, acceptance=accepted)
    assert own["on"]["alpha"]["copy-heavy"][0] == pytest.approx(0.2)


def test_the_calibration_prices_the_engines_steps_with_the_simulators_truth_and_takes_medians():
    _, _, _, truth = run.setup_spec(replay.service_spec(CPU_SPEC, "off"), profile(), NO_PROFILES)
    decode = truth.profile.fit["decode"].seconds(4, truth.ctx, 1.5)
    verify = truth.fit("verify").seconds(2, truth.ctx, 3.0)
    steps = (StepStat(4, 2 * decode, False, 10, 6.0), StepStat(2, verify, True, 30, 6.0))
    row = bench.phase_row(truth, steps, seconds=25.0)
    predicted = 10 * decode + 30 * verify
    assert row["steps"] == 40 and row["step_factor"] == round((20 * decode + 30 * verify) / predicted, 3)
    assert row["period_factor"] == round(25.0 / predicted, 3)
    runs = [{"phases": {"a": {"clients": 4, "_sums": (m, 1.0, m)}}} for m in (1.2, 2.0, 1.4)]
    assert bench.factors({"off": runs})["off"]["4"] == {"step_factor": 1.4, "period_factor": 1.4,
                                                        "step_factor_range": [1.2, 2.0]}
