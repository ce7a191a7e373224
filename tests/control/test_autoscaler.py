"""The autoscaler on crafted windows."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from specfleet.operator.control import autoscaler as a

POLICY = a.ScalingPolicy(min_replicas=1, max_replicas=20, scale_up_stabilization_seconds=30,
                         scale_down_stabilization_seconds=300)


def run(model, windows, current, state=None, start=15.0, every=15.0, policy=POLICY):
    """Feed windows one interval apart, applying each decision; returns the decisions."""
    state, out = state or a.AutoscalerState(), []
    for i, w in enumerate(windows):
        now = start + i * every
        d, state = a.decide(w, model, current, policy, state, now)
        out.append(d)
        current = d.desired
    return out


def per_replica(model):
    return model.replica_rps(POLICY.target_utilization)


def test_missing_metrics_hold_and_never_scale_down(model, make_window):
    quiet = make_window(rps=0.0, pods=4)
    decisions = run(model, [None, make_window(rps=0.0, pods=4, scraped=3), replace(quiet, queue_depth=None)], 4)
    assert [d.desired for d in decisions] == [4, 4, 4]
    assert {d.reason for d in decisions} == {"MetricsUnavailable"}


def test_a_burst_scales_up_within_one_interval(model, make_window):
    cap = per_replica(model)
    steady = [make_window(rps=1.5 * cap, pods=2, end=15.0 * (i + 1)) for i in range(4)]
    burst = make_window(rps=2 * cap, queue=300, growth=20, pods=2, ttft=2.5, end=75.0)
    decisions = run(model, steady + [burst], 2)
    assert [d.desired for d in decisions[:4]] == [2, 2, 2, 2]
    assert decisions[-1].desired >= 5 and decisions[-1].reason in ("SLOViolation", "QueueGrowing")


def test_oscillating_load_does_not_flap(model, make_window):
    cap = per_replica(model)
    windows = [make_window(rps=(3.5 if (i // 4) % 2 == 0 else 1.5) * cap, pods=4, end=15.0 * (i + 1))
               for i in range(40)]
    decisions = run(model, windows, 4)
    changes = [d for d in decisions if d.changed]
    assert len(changes) <= 1 and all(d.desired >= 4 for d in decisions)


def test_scale_down_waits_for_the_window_and_is_bounded(model, make_window):
    cap = per_replica(model)
    windows = [make_window(rps=1.0 * cap, pods=8, end=15.0 * (i + 1)) for i in range(30)]
    decisions = run(model, windows, 8)
    first = next(i for i, d in enumerate(decisions) if d.changed)
    assert first * 15 >= 300 and decisions[first].reason == "LoadDecrease"
    assert decisions[first].desired == 6              # at most -25% per step
    assert decisions[-1].desired == 1


def test_scale_down_needs_the_smaller_fleet_to_hold_the_slo(model, make_window):
    cap = per_replica(model)
    policy = replace(POLICY, scale_down_utilization=0.5)
    # need (at 70%) is 4, but 4 replicas would run above 50% of their SLO batch: hold
    windows = [make_window(rps=3.4 * cap, pods=5, end=15.0 * (i + 1)) for i in range(25)]
    decisions = run(model, windows, 5, policy=policy)
    assert all(d.desired == 5 for d in decisions)
    assert decisions[-1].reason == "SmallerFleetWouldMissSLO"


def test_min_and_max_bound_the_result(model, make_window):
    huge = make_window(rps=100 * per_replica(model), queue=1000, growth=50, pods=19, ttft=3)
    assert run(model, [huge], 19)[0].desired == 20
    assert run(model, [make_window(rps=5, pods=1)], 0)[0].desired == 1


def test_a_slow_rise_waits_for_the_up_stabilization(model, make_window):
    cap = per_replica(model)
    windows = [make_window(rps=(4.2 + 0.01 * i) * cap, pods=4, end=15.0 * (i + 1)) for i in range(4)]
    decisions = run(model, windows, 4)
    assert [d.desired for d in decisions[:2]] == [4, 4] and decisions[-1].desired == 5
    assert [d.reason for d in decisions if d.changed] == ["LoadIncrease"]


def test_the_service_model_uses_the_engine_limits_that_extra_args_override():
    """`runtime.extraArgs` come after the plan's args, so the engine runs with them; capacity must too."""
    import yaml

    from specfleet.operator import api, catalogs, planner
    from specfleet.operator.capacity import service_model

    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "manifests/examples/tiny-cpu.yaml").read_text())
    models = {}
    for extra in ([], ["--max-num-seqs", "4"], ["--max-num-seqs=3", "--max-num-batched-tokens", "512"]):
        doc["spec"]["runtime"]["extraArgs"] = extra
        spec = api.parse_spec(doc["spec"])
        plan = planner.plan(spec, catalogs.gpus(), catalogs.models())
        models[len(extra)] = (plan, service_model(spec, plan, catalogs.gpus(), catalogs.models()))
    plan, m = models[0]
    assert (m.max_num_seqs, m.chunk) == (plan.max_num_seqs, plan.max_num_batched_tokens)
    assert (models[2][1].max_num_seqs, models[2][1].slo_batch()) == (4, 4)
    assert (models[3][1].max_num_seqs, models[3][1].chunk) == (3, 512)
    assert models[2][1].replica_rps(0.7) < m.replica_rps(0.7) / 10


def test_a_rising_load_with_a_growing_queue_takes_a_larger_step(model, make_window):
    """Two windows of rising arrivals with the SLO missed: the step provisions for the load one start-up
    delay ahead, beyond the load-based need of the window alone; sized at the full SLO batch (the
    default) it is smaller than at the steady 70%, never below that need."""
    cap = per_replica(model)
    steady = [make_window(rps=2 * cap, pods=3, end=15.0 * (i + 1)) for i in range(4)]
    rise1 = make_window(rps=2.6 * cap, queue=0, pods=3, end=75.0)
    rise2 = make_window(rps=3.0 * cap, queue=60, growth=4, pods=3, ttft=2.5, end=90.0)
    decisions = run(model, steady + [rise1, rise2], 3, policy=replace(POLICY, surge_utilization=0.7))
    assert [d.desired for d in decisions[:4]] == [3, 3, 3, 3]
    last = decisions[-1]
    window_need = a._replicas(a._demand(rise2, POLICY, 3 * cap + 4), cap, POLICY)
    assert last.desired > window_need + 1 and last.reason in ("SLOViolation", "QueueGrowing")
    at_full = run(model, steady + [rise1, rise2], 3)[-1]
    assert window_need <= at_full.desired < last.desired


def test_a_one_interval_blip_does_not_ratchet_up(model, make_window):
    """A single window of higher load with the SLO held: at most the load-based need, no extrapolation,
    and no further step when the load is back."""
    cap = per_replica(model)
    windows = [make_window(rps=2 * cap, pods=4, end=15.0 * (i + 1)) for i in range(4)]
    windows.append(make_window(rps=2.6 * cap, pods=4, end=75.0))            # the blip
    windows += [make_window(rps=2 * cap, pods=4, end=15.0 * (i + 6)) for i in range(4)]
    decisions = run(model, windows, 4)
    assert all(d.desired == 4 for d in decisions)


def test_poisson_noise_is_not_a_trend(model, make_window):
    """Small rises two windows in a row (inside counting noise) take the normal stabilized path."""
    cap = per_replica(model)
    rates = [3.0, 3.0, 3.02, 3.05, 3.08, 3.1]
    decisions = run(model, [make_window(rps=r * cap, pods=4, end=15.0 * (i + 1)) for i, r in enumerate(rates)], 4)
    assert all(d.reason != "LoadRising" for d in decisions) and all(d.desired == 4 for d in decisions)


def test_arrivals_count_admitted_requests_still_waiting_for_prefill(model, make_window):
    """Running growing between windows is arrival the first-token rate does not see yet."""
    w1 = make_window(rps=20, pods=2, batch=40, end=15.0)
    w2 = make_window(rps=20, pods=2, batch=70, end=30.0)                  # +60 running in 15 s
    _, state = a.decide(w1, model, 2, POLICY, a.AutoscalerState(), 15.0)
    assert abs(a._arrivals(w2, state) - 24.0) < 1e-9
    assert a._arrivals(w2) == 20                                           # no previous window: as before


def test_scale_down_after_a_predictive_step_waits_the_cooldown(model, make_window):
    cap = per_replica(model)
    windows = [make_window(rps=1.0 * cap, pods=10, end=15.0 * (i + 1)) for i in range(30)]
    state = a.AutoscalerState(history=((0.0, 10),), last_up=0.0)
    decisions = run(model, windows, 10, state=state)
    first = next(i for i, d in enumerate(decisions) if d.changed)
    assert 15 + first * 15 >= max(POLICY.down_cooldown_s, 300)   # the window (300 s of history) still rules
    assert decisions[first].reason == "LoadDecrease"


def test_arrivals_come_from_conservation_when_the_end_to_end_count_is_known(model, make_window):
    """Ended + growth of running and waiting: admitted prompts still waiting for prefill count, and
    first tokens of a backlog being drained do not."""
    w = make_window(rps=50, finished=30, growth=2, running_growth=3, end=30.0)
    assert a._arrivals(w) == 35


def _settled(model, make_window, current, rps):
    """The state after four steady windows (ending at 60 s) at `rps`."""
    windows = [make_window(rps=rps, finished=rps, running_growth=0.0, pods=current, end=15.0 * (i + 1))
               for i in range(4)]
    state = a.AutoscalerState()
    for i, w in enumerate(windows):
        _, state = a.decide(w, model, current, POLICY, state, 15.0 * (i + 1))
    return state


def test_a_surge_in_a_short_window_scales_up_before_the_next_interval(model, make_window):
    rps = 2 * per_replica(model)
    state = _settled(model, make_window, 3, rps)
    surge = make_window(rps=rps, finished=rps, running_growth=40.0, pods=3, seconds=5.0, end=65.0)
    d, after = a.detect(surge, model, 3, POLICY, state, 65.0)
    assert d.reason == "LoadSurge" and d.desired > 3 and after.last_up == 65.0
    assert (after.history, after.noise, after.last_rps) == (state.history, state.noise, state.last_rps)


def test_counting_noise_in_a_short_window_is_not_a_surge(model, make_window):
    rps = 2 * per_replica(model)
    state = _settled(model, make_window, 3, rps)
    noisy = make_window(rps=rps, finished=rps + 5, running_growth=0.0, pods=3, seconds=5.0, end=65.0)
    d, after = a.detect(noisy, model, 3, POLICY, state, 65.0)
    assert not d.changed and after == state


def test_detection_never_scales_down(model, make_window):
    """A surge the fleet already covers leaves it as it is (scale-downs are the interval's)."""
    rps = 2 * per_replica(model)
    state = _settled(model, make_window, 18, rps)
    surge = make_window(rps=rps, finished=rps, running_growth=10.0, pods=18, seconds=5.0, end=65.0)
    d, _ = a.detect(surge, model, 18, POLICY, state, 65.0)
    assert d.desired == 18 and d.need < 18


def test_detection_needs_a_count_of_ended_requests(model, make_window):
    """Without requests ended there is no conservation estimate for a short window: no surge."""
    rps = 2 * per_replica(model)
    state = _settled(model, make_window, 3, rps)
    blind = make_window(rps=4 * rps, pods=3, seconds=5.0, end=65.0)
    assert a.detect(blind, model, 3, POLICY, state, 65.0)[0].desired == 3


def test_a_replica_is_sized_at_the_batch_its_load_makes(model):
    """Capacity at the self-consistent batch (Little's law): within `utilization` of the SLO batch and
    of the prefill rate at that batch, and tight against one of the two."""
    u = POLICY.target_utilization
    rps = model.replica_rps(u)
    batch = rps * model.request_seconds(rps * model.request_seconds(20))   # two fixed-point steps
    batch = rps * model.request_seconds(batch)
    assert batch <= u * model.slo_batch() + 1
    assert rps <= u * model.prefill_rps(batch) * 1.01
    assert rps >= 0.99 * min(batch / model.request_seconds(batch), u * model.prefill_rps(batch))
    # This service is prefill-bound: its batch stays well under the SLO batch, leaving budget to prompts
    # (and its TTFT target of 1 s leaves the cap as the prefill share).
    assert batch < 0.7 * model.slo_batch() and rps > u * model.prefill_rps(u * model.slo_batch())
    assert model.replica_rps(0.7) < model.replica_rps(0.8) < rps


def test_a_tight_ttft_target_lowers_the_prefill_share_a_replica_is_sized_to_use(model):
    """Prompts queue for prefill: the p99 wait must fit in the TTFT target, so a tight target leaves
    less of the prefill rate usable (here ~220 ms a prompt against 1 s, then 500 ms)."""
    u = POLICY.target_utilization
    loose, tight = model.prefill_utilization(100, 0, 1.0), replace(model, ttft_s=0.5).prefill_utilization(100, 0, 1.0)
    assert 0.5 < loose < 0.7 and tight < 0.45
    assert replace(model, ttft_s=0.5).replica_rps(u) < model.replica_rps(u)
    assert model.prefill_utilization(100, 0, 0.5) == 0.5                         # the cap
    assert replace(model, ttft_s=0.01).prefill_utilization(100) <= 0.05          # no room at all


def test_draft_tokens_to_verify_take_prompt_budget_so_speculation_lowers_a_prefill_bound_capacity(model):
    assert model.prefill_room(20, 4) == model.chunk - 100 and model.prefill_room(20) == model.chunk - 20
    assert model.prefill_room(model.chunk, 4) == 1              # the running sequences take the whole budget
    u = POLICY.target_utilization
    assert model.replica_rps(u, 0.6, 4) < model.replica_rps(u, 0.6, 2) < model.replica_rps(u)


def test_a_surge_after_a_flat_window_is_measured_from_that_window_s_end(model, make_window):
    """The last decision saw flat load, so a ramp starting after it is timed from its end (true slope),
    not from its middle (which would read a quarter of a ramp that began at its end)."""
    rps = 2 * per_replica(model)
    state = _settled(model, make_window, 3, rps)
    surge = make_window(rps=rps, finished=rps + 20, running_growth=0.0, pods=3, seconds=5.0, end=65.0)
    arrivals, slope = a._surge(surge, state, POLICY)
    assert arrivals == pytest.approx(rps + 20) and slope == pytest.approx(20 / 2.5)
    rising = replace(state, last_rising=True)
    assert a._surge(surge, rising, POLICY)[1] == pytest.approx(20 / 10.0)   # middle of the last window to this one's


def test_a_few_prompts_waiting_at_a_busy_prefill_are_not_a_backlog(model, make_window):
    """vllm:num_requests_waiting is rarely 0 on a busy prefill-bound replica (Poisson arrivals queue
    for a moment): a few waiting per pod neither fast-tracks a scale-up nor blocks a scale-down; a
    queue the pods cannot prefill within half the TTFT budget does both."""
    allowance = model.queue_allowance(40.0)
    assert allowance > 4                          # the mean M/D/1 queue at 90% prefill is ~4
    settled = a.AutoscalerState(history=((0.0, 1),), last_up=-1e9)
    few = make_window(rps=0.5 * per_replica(model), queue=3 * 2, growth=0.2, pods=2, batch=40.0)
    d, _ = a.decide(few, model, 2, POLICY, settled, 400.0)
    assert d.reason == "LoadDecrease" and d.desired == 1
    many = replace(few, queue_depth=2 * allowance)
    d, _ = a.decide(many, model, 2, POLICY, settled, 400.0)
    assert d.desired == 2 and "queue" in d.message
    rising = make_window(rps=2.2 * per_replica(model), queue=2 * allowance, growth=2.0, pods=2, batch=40.0)
    assert a.decide(rising, model, 2, POLICY, a.AutoscalerState(), 15.0)[0].reason == "QueueGrowing"
    calm = replace(rising, queue_depth=6)
    assert a.decide(calm, model, 2, POLICY, a.AutoscalerState(), 15.0)[0].reason != "QueueGrowing"


def test_a_surge_step_does_not_provision_for_a_backlog_new_pods_cannot_take(model, make_window):
    """Requests stay with the pod they were handed to, so the surge step sizes for the arrivals one
    start-up ahead whatever the queue at the old pods (they drain it while new pods take new arrivals)."""
    cap = per_replica(model)
    state = a.AutoscalerState(last_rps=cap, last_time=15.0, last_seconds=15.0, noise=1.0)
    calm = make_window(rps=3 * cap, finished=3 * cap, running_growth=0.0, pods=2, seconds=5.0, end=20.0)
    queued = replace(calm, queue_depth=2000.0)
    steps = [a.detect(w, model, 2, POLICY, state, 20.0)[0] for w in (calm, queued)]
    assert steps[0].reason == steps[1].reason == "LoadSurge" and steps[0].need == steps[1].need
