"""Scale to zero and back, the pure half: the idle rule, held requests from the gateways' annotations,
when a service at 0 is woken, and the cold start's status."""
from __future__ import annotations

from dataclasses import replace

from specfleet.operator import api
from specfleet.operator.control import autoscaler, loop, scale_from_zero

MIN = {"model": {"name": "m", "source": "builtin:smollm2-135m"}, "slo": {"ttftP99Ms": 3000, "itlP99Ms": 200}}


def spec_with(**autoscaling) -> api.InferenceServiceSpec:
    return api.parse_spec({**MIN, "autoscaling": autoscaling})


def test_held_requests_are_summed_over_the_gateways_and_junk_counts_zero():
    annotations = {"held.gateway.specfleet.io/gw-a": "3", "held.gateway.specfleet.io/gw-b": "2",
                   "held.gateway.specfleet.io/gw-c": "-4", "held.gateway.specfleet.io/gw-d": "many",
                   "other.io/held": "9"}
    assert scale_from_zero.held_requests(annotations) == 5
    assert scale_from_zero.held_requests(None) == 0


def test_only_a_service_that_may_go_to_zero_and_is_at_zero_with_held_requests_is_woken():
    zero = spec_with(minReplicas=0)
    assert scale_from_zero.should_wake(zero, 1, (0, 0))
    assert not scale_from_zero.should_wake(zero, 0, (0, 0))
    assert not scale_from_zero.should_wake(zero, 3, (1, 0))                 # already on its way up
    assert not scale_from_zero.should_wake(zero, 3, None)                   # no Deployment seen yet
    assert not scale_from_zero.should_wake(spec_with(minReplicas=1), 3, (0, 0))
    assert not scale_from_zero.should_wake(replace(zero, mode="PlanOnly"), 3, (0, 0))
    assert not scale_from_zero.should_wake(replace(zero, replicas=0), 3, (0, 0))


def test_idle_seconds_need_min_replicas_zero():
    try:
        spec_with(minReplicas=1, idleSeconds=60)
    except api.SpecError as exc:
        assert "idleSeconds applies only with minReplicas 0" in str(exc)
    else:
        raise AssertionError("accepted")
    assert scale_from_zero.idle_seconds(spec_with(minReplicas=0)) == scale_from_zero.DEFAULT_IDLE_S


def quiet(make_window):
    return make_window(rps=0.0, batch=0.0, queue=0.0)


def test_a_service_goes_to_zero_only_after_idle_seconds_of_quiet_windows(make_window, model):
    spec, st = spec_with(minReplicas=0, idleSeconds=60), loop.ServiceLoop(1, model)
    keep = autoscaler.ScaleDecision(1, 1, "Stable", "")
    assert loop.idle_scale(keep, quiet(make_window), spec, st, 1, now=100.0) is keep
    assert loop.idle_scale(keep, quiet(make_window), spec, st, 1, now=150.0) is keep
    down = loop.idle_scale(keep, quiet(make_window), spec, st, 1, now=160.0)
    assert (down.current, down.desired, down.reason) == (1, 0, "Idle") and "no requests for 60 s" in down.message


def test_one_request_restarts_the_idle_clock_and_missing_evidence_is_not_idle(make_window, model):
    spec, st = spec_with(minReplicas=0, idleSeconds=60), loop.ServiceLoop(1, model)
    keep = autoscaler.ScaleDecision(1, 1, "Stable", "")
    loop.idle_scale(keep, quiet(make_window), spec, st, 1, now=100.0)
    loop.idle_scale(keep, make_window(rps=0.1, batch=0.0), spec, st, 1, now=130.0)
    assert loop.idle_scale(keep, quiet(make_window), spec, st, 1, now=170.0) is keep        # clock began at 170
    assert loop.idle_scale(keep, make_window(rps=0.0, batch=0.0, scraped=1), spec, st, 1, now=400.0) is keep
    assert loop.idle_scale(keep, None, spec, st, 1, now=500.0) is keep


def test_with_a_minimum_above_zero_quiet_windows_never_scale_to_zero(make_window, model):
    spec, st = spec_with(minReplicas=1), loop.ServiceLoop(1, model)
    keep = autoscaler.ScaleDecision(1, 1, "Stable", "")
    for t in (0.0, 1000.0, 5000.0):
        assert loop.idle_scale(keep, quiet(make_window), spec, st, 1, now=t) is keep


def test_the_load_based_autoscaler_keeps_at_least_one_replica_when_the_minimum_is_zero():
    policy = loop._scaling(spec_with(minReplicas=0), loop.LoopConfig())
    assert policy.min_replicas == 1


def test_the_cold_start_is_reported_in_status():
    assert scale_from_zero.cold_start_status(12.34567, 3, "2026-01-01T00:00:00Z") == {
        "coldStart": {"lastSeconds": 12.346, "heldRequests": 3, "at": "2026-01-01T00:00:00Z"}}


def test_at_zero_the_load_autoscaler_does_not_bring_a_replica_back(make_window, model):
    spec, st = spec_with(minReplicas=0, idleSeconds=60), loop.ServiceLoop(1, model)
    wants_one = autoscaler.ScaleDecision(0, 1, "LoadIncrease", "floor of 1")
    held = loop.idle_scale(wants_one, quiet(make_window), spec, st, 0, now=100.0)
    assert (held.current, held.desired, held.reason, held.changed) == (0, 0, "ScaledToZero", False)
    assert loop.detect_step(make_window(rps=50.0), spec, st, 0, 0, 100.0, "t") is None
