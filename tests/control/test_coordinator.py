"""Both controllers together (control/coordinator.py): speculation judged on the load the autoscaler sizes for."""
from __future__ import annotations

import math

from specfleet.operator.control import autoscaler, coordinator, speculation
from specfleet.operator.cost import alpha_from_acceptance

SCALING = autoscaler.ScalingPolicy(min_replicas=1, max_replicas=10)
SPEC = speculation.SpeculationPolicy(mode="auto", max_k=4, min_acceptance=0.2, dwell_s=60)
ACCEPTANCE = 0.3     # above SPEC's floor; k=1 carries less than no speculation on the fixture's service


def _edge(model, replicas: int = 2):
    """Arrivals two replicas carry with k=1 (just), and the noise headroom that takes them past that
    while two replicas still carry them without speculation."""
    alpha = alpha_from_acceptance(ACCEPTANCE, 1)
    on, off = model.replica_rps(SCALING.target_utilization, alpha, 1), model.replica_rps(SCALING.target_utilization)
    rps = replicas * on * 0.98
    headroom = replicas * off * 0.99 - rps
    assert 0 < headroom < SCALING.headroom_cap * rps
    return rps, headroom


def test_noise_headroom_that_would_cost_a_replica_turns_speculation_off_and_the_fleet_stays(model, make_window):
    rps, headroom = _edge(model)
    w = make_window(rps=rps, finished=rps, running_growth=0.0, pods=2, batch=8, acceptance=ACCEPTANCE, k=1)
    calm = coordinator.Controllers(autoscaler.AutoscalerState(), speculation.SpeculationState(True, 1))
    noisy = coordinator.Controllers(autoscaler.AutoscalerState(noise=headroom ** 2),
                                    speculation.SpeculationState(True, 1))
    d, st = coordinator.interval(w, model, 2, 2, SCALING, SPEC, calm, 1000.0, ACCEPTANCE)
    assert d.speculation.enabled and st.speculation.enabled and d.scale.desired == 2
    d, st = coordinator.interval(w, model, 2, 2, SCALING, SPEC, noisy, 1000.0, ACCEPTANCE)
    assert not st.speculation.enabled and d.speculation.reason == "CostsReplicas"
    assert d.scale.desired == 2                       # sized without speculation: no third replica
    # the controller alone, blind to the headroom, keeps it on, and the autoscaler then wants 3
    alone, _ = speculation.decide(w, model, SPEC, speculation.SpeculationState(True, 1), 1000.0)
    scale, _ = autoscaler.decide(w, model, 2, SCALING, noisy.scaling, 1000.0, alpha_from_acceptance(ACCEPTANCE, 1),
                                 1, 2)
    assert alone.enabled and scale.desired == 3


def test_the_headroom_is_what_the_autoscaler_adds(model, make_window):
    w = make_window(rps=40.0, finished=40.0, running_growth=0.0)
    assert autoscaler.headroom(w, autoscaler.AutoscalerState(noise=4.0), SCALING) == 2.0
    assert autoscaler.headroom(w, autoscaler.AutoscalerState(noise=1e6), SCALING) == SCALING.headroom_cap * 40.0
    assert autoscaler.headroom(None, autoscaler.AutoscalerState(noise=4.0), SCALING) == 0.0


def test_a_fixed_replica_count_runs_speculation_only(model, make_window):
    w = make_window(rps=5.0, finished=5.0, running_growth=0.0, batch=8, acceptance=0.6)
    d, st = coordinator.interval(w, model, 2, 2, None, SPEC, coordinator.Controllers(autoscaler.AutoscalerState(),
                                                                          speculation.SpeculationState(True, 4)),
                           1000.0, 0.6)
    assert d.scale is None and d.speculation is not None and st.scaling == autoscaler.AutoscalerState()


def test_alpha_in_effect_falls_back_without_a_measurement(make_window):
    assert coordinator.alpha_in_effect(make_window(acceptance=None), 4, 0.55) == 0.55
    measured = coordinator.alpha_in_effect(make_window(acceptance=0.6, k=4), 4, 0.55)
    assert math.isclose(measured, alpha_from_acceptance(0.6, 4))
