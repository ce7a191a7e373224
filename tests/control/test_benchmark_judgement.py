"""How the benchmarks judge their runs: the closed loop says which fixed policy auto held per phase and
which threshold crossings were due a switch, and the speculation benchmark prices each measured row's
speed-up with a cost (no engine, no server)."""
from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import closed_loop  # noqa: E402  (benchmarks/closed_loop.py)
import speculation  # noqa: E402  (benchmarks/speculation.py)


def mode(goodputs: dict[str, float], on_shares: dict[str, list[float]]) -> dict:
    return {"phases": {p: {"goodput_tok_s": g} for p, g in goodputs.items()},
            "spread": {p: {"speculation_on_share": s} for p, s in on_shares.items()},
            "overall": {"goodput_tok_s": sum(goodputs.values()) / len(goodputs)}}


def test_a_phase_where_auto_held_on_is_judged_against_on_as_two_runs_of_one_policy():
    runs = {"auto": mode({"ramp": 90.0, "open": 100.0}, {"ramp": [1.0, 1.0], "open": [0.4, 0.7]}),
            "on": mode({"ramp": 100.0, "open": 110.0}, {"ramp": [1.0, 1.0], "open": [1.0, 1.0]}),
            "off": mode({"ramp": 80.0, "open": 105.0}, {"ramp": [0.0, 0.0], "open": [0.0, 0.0]})}
    phases = closed_loop.goodput_checks(runs)["per_phase"]
    ramp, open_ended = phases["ramp"], phases["open"]
    assert not ramp["ok"] and ramp["auto_policy"] == "on" and ramp["chose_best_fixed"]
    assert ramp["gap_to_same_policy"] == pytest.approx(-0.1)
    assert open_ended["auto_policy"] == "switched" and open_ended["gap_to_same_policy"] is None
    assert not open_ended["chose_best_fixed"] and open_ended["best_mode"] == "on"


def crossing(t: float, enabled: bool, threshold: int = 16) -> dict:
    return {"t": t, "enabled": enabled, "batch": threshold * (0.9 if enabled else 1.1), "threshold": threshold}


def switch(t: float, enabled: bool, reason: str, k: int | None = 2) -> dict:
    return {"t": t, "enabled": enabled, "k": k if enabled else None, "reason": reason}


INTERVAL = 5.0


def test_crossings_answered_once_within_two_intervals_pass_and_a_second_switch_is_flapping():
    crossed = [crossing(20.0, False), crossing(60.0, True)]
    answered = [switch(24.0, False, "BatchAboveThreshold"), switch(63.0, True, "SpeculationPays")]
    check = closed_loop.switch_checks(crossed, answered, INTERVAL)
    assert check["verdict"] == "ok" and check["due_crossings"] == 2
    flapped = answered[:1] + [switch(40.0, True, "SpeculationPays")] + answered[1:]
    check = closed_loop.switch_checks(crossed, flapped, INTERVAL)
    assert check["verdict"] == "failed" and [c["ok"] for c in check["crossings"]] == [False, True]
    late = [switch(35.0, False, "BatchAboveThreshold"), answered[1]]
    assert closed_loop.switch_checks(crossed, late, INTERVAL)["crossings"][0]["lag_s"] == 15.0
    assert closed_loop.switch_checks(crossed, late, INTERVAL)["verdict"] == "failed"


def test_a_switch_that_answers_the_next_crossing_early_is_the_next_crossings():
    # the controller turned on at 75.9 s, half a second before this script's window showed the batch under
    # the threshold (76.3 s): that switch answers the second crossing, not a flap after the first
    crossed = [crossing(61.8, False, threshold=9), crossing(76.3, True, threshold=17)]
    answered = [switch(60.9, False, "BatchAboveThreshold"), switch(75.9, True, "SpeculationPays")]
    check = closed_loop.switch_checks(crossed, answered, INTERVAL)
    assert [(c["switches"], c["lag_s"], c["ok"]) for c in check["crossings"]] == [(1, -0.9, True), (1, -0.4, True)]
    assert check["verdict"] == "ok"


def test_a_batch_switch_before_any_crossing_fails_and_a_run_without_crossings_is_not_exercised():
    assert closed_loop.switch_checks([], [switch(10.0, False, "BatchAboveThreshold")], INTERVAL)["verdict"] == "failed"
    retunes_only = [switch(10.0, True, "DepthRetuned", 3), switch(30.0, True, "DepthRetuned", 1)]
    check = closed_loop.switch_checks([], retunes_only, INTERVAL)
    assert check["verdict"] == "not exercised" and not check["ok"] and check["depth_retunes"] == 2


def test_crossings_into_a_state_held_for_low_acceptance_are_due_nothing():
    # off for low acceptance, the threshold falls to 0 (speculation never pays): the batch is now "above"
    # it, but speculation is already off; later the threshold rises above the batch while still off for
    # low acceptance, which the batch does not govern
    switched = [switch(10.0, True, "DepthRetuned", 1), switch(85.0, False, "LowAcceptance")]
    crossed = [crossing(91.0, False, threshold=0), crossing(106.0, True, threshold=17)]
    check = closed_loop.switch_checks(crossed, switched, INTERVAL)
    assert [(c["due"], c["held"], c["held_for"]) for c in check["crossings"]] == [
        (False, "off", "LowAcceptance"), (False, "off", "LowAcceptance")]
    assert check["verdict"] == "not exercised" and check["low_acceptance_switches"] == 1
    turned_on = switched + [switch(95.0, True, "SpeculationPays")]     # on while the batch is above: wrong
    assert closed_loop.switch_checks(crossed, turned_on, INTERVAL)["crossings"][0]["ok"] is False


def test_the_state_before_the_first_switch_is_read_from_it():
    assert closed_loop.held_states([switch(5.0, True, "SpeculationPays")])[0][1] is False
    assert closed_loop.held_states([switch(5.0, False, "BatchAboveThreshold")])[0][1] is True
    assert closed_loop.held_states([], initially_on=False)[0][1] is False


class LinearCost:
    """T = 10 ms + 1 ms per token per sequence (batch-independent, so the price is easy to check)."""

    def step(self, batch: float, ctx: int, q: float, drafting: float | None = None) -> float:
        return 0.010 + 0.001 * q


def test_each_steady_row_is_priced_from_what_speculation_did_in_it():
    row = {"method": "ngram", "workload": "copy-heavy", "batch": 8, "context": 100, "seq_steps": 100, "k": 1,
           "accepted": 50, "drafted": 100, "mean_accepted_length": 1.5, "speedups": [1.20, 1.30, 1.40]}
    entry, = speculation.speedup_by_batch([row], {"linear": LinearCost()})
    # 1.5 tokens per sequence-step for verifying 2 tokens per sequence: 1.5 x 11 ms / 12 ms
    assert entry["predicted_linear"] == pytest.approx(1.5 * 0.011 / 0.012)
    assert entry["measured"] == 1.30 and entry["measured_range"] == [1.20, 1.40]
    assert entry["drafting_share"] == 1.0                # 100 drafts (50 accepted at 0.5 each) in 100 seq-steps
    summary = speculation.by_batch_summary([entry], ["linear"])["linear/copy-heavy"]
    assert summary["in_range"] == 1.0 and summary["chance_in_range"] == 0.75
    assert summary["median_abs_error"] == pytest.approx(1.5 * 0.011 / 0.012 / 1.30 - 1)


def test_a_flawless_price_lands_in_the_range_of_n_repeats_unless_all_fall_on_one_side():
    assert [speculation.chance_in_range(n) for n in (0, 1, 3, 5)] == [0.0, 0.0, 0.75, 0.9375]
    rng = random.Random(0)
    inside = sum(min(s) <= 0.0 <= max(s) for s in ([rng.gauss(0, 1) for _ in range(3)] for _ in range(20000)))
    assert inside / 20000 == pytest.approx(0.75, abs=0.01)


def test_a_row_timed_by_its_decode_steps_is_priced_against_those_and_keeps_the_served_figure():
    row = {"method": "ngram", "workload": "copy-heavy", "batch": 1, "context": 100, "seq_steps": 100, "k": 1,
           "accepted": 50, "drafted": 100, "speedups": [1.00, 1.05, 1.10], "decode_speedups": [1.30, 1.35, 1.40]}
    entry, = speculation.speedup_by_batch([row], {"linear": LinearCost()})
    assert entry["measured"] == 1.35 and entry["measured_range"] == [1.30, 1.40] and entry["served"] == 1.05
    # a row whose decode steps were not timed in every repeat falls back to its windows
    assert speculation.step_speedups({**row, "decode_speedups": [1.3]}) == [1.00, 1.05, 1.10]


class FakeEngine:
    """Steps as the engine reports them: a listener gets each step's record; stats count generated tokens."""

    def __init__(self, steps: list[tuple[float, int, int]]):       # (seconds, prompt tokens, tokens generated)
        self.plan, self.step_listeners = list(steps), []
        self.stats = type("Stats", (), {"generation_tokens": 0})()

    def step(self) -> list:
        seconds, prompt, generated = self.plan.pop(0)
        self.stats.generation_tokens += generated
        record = type("Record", (), {"duration_s": seconds, "num_prefill_tokens": prompt})()
        for listener in self.step_listeners:
            listener(record)
        return []


def test_the_decode_clock_counts_the_steps_without_prompt_tokens_only():
    engine = FakeEngine([(0.020, 0, 1), (0.250, 130, 1), (0.030, 0, 2), (0.020, 0, 1)])
    batch = speculation.SteadyBatch.__new__(speculation.SteadyBatch)
    batch.engine = engine
    with speculation.DecodeClock(engine) as clock:
        batch.run(4, clock)
    assert (clock.tokens, clock.timed, clock.steps) == (4, 3, 4)
    assert clock.rate == pytest.approx(4 / 0.070)
    assert engine.step_listeners == []                    # the listener leaves with the window


def test_the_fit_check_sets_each_verify_point_against_what_the_fit_prices_there():
    from specfleet.engine.profile_format import Profile, StepFit, StepPoint

    fit = StepFit(a=0.010, b=0.001, c=0.0, rel_rms_error=0.0, num_points=3)     # 10 ms + 1 ms per token
    points = [StepPoint("decode", 4, 128, 1, 0.014, 0.0014, 5), StepPoint("verify", 4, 128, 2, 0.021, 0.0042, 5),
              StepPoint("decode", 8, 128, 1, 0.018, 0.0, 5)]                  # no verify point at batch 8
    profile = Profile("m", "cpu", "float32", {}, "", "", points, {"decode": fit, "verify": fit})
    row, = speculation.fit_check(profile)
    assert (row["batch"], row["context"]) == (4, 128)
    assert row["points"] == pytest.approx(0.021 / 0.014) and row["fit"] == pytest.approx(0.018 / 0.014)
    assert row["range"] == pytest.approx(0.2 + 0.1)          # the repeats' spread of both points, relative


def condition_status(reason: str, message: str, planned: int = 17) -> dict:
    return {"status": {"conditions": [{"type": "SpeculationActive", "reason": reason, "message": message}],
                       "plan": {"predicted": {"maxBatchForSpeculation": planned}}}}


def test_the_threshold_is_the_controllers_and_the_plans_only_while_the_condition_is_the_plans():
    paying = condition_status("Paying", "speculation pays up to batch 65 at the dead band's edge x0.95 (x1.04 here at k=1)")
    assert closed_loop.reported_threshold(paying) == (65, "Paying")
    assert closed_loop.reported_threshold(condition_status("Planned", "ngram k=4; pays up to batch 17")) == (17, "Planned")
    # a depth retune for cost names no threshold: the plan's 17 is not what the controller decides by
    retuned = condition_status("DepthRetuned", "k 4 -> 2: 3.1 req/s on 1 replicas: with k=4 a replica carries ...")
    assert closed_loop.reported_threshold(retuned) == (None, "DepthRetuned")
    assert closed_loop.reported_threshold({"status": {"plan": {"predicted": {"maxBatchForSpeculation": 9}}}}) == (9, None)


def test_the_closed_loop_cr_takes_extra_speculation_fields_and_keeps_the_forced_mode():
    doc = closed_loop.manifest("off", (("promptLookupMin", 1), ("minAcceptanceRate", 0.3), ("mode", "on")))
    speculation_spec = doc["spec"]["speculation"]
    assert speculation_spec["mode"] == "off" and speculation_spec["promptLookupMin"] == 1
    assert speculation_spec["minAcceptanceRate"] == 0.3 and doc["spec"]["replicas"] == 1
