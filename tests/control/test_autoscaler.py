"""The autoscaler on crafted windows."""
from __future__ import annotations

from dataclasses import replace

from specfleet.operator.control import autoscaler as a

POLICY = a.ScalingPolicy(min_replicas=1, max_replicas=20, scale_up_stabilization_s=30,
                         scale_down_stabilization_s=300)


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
