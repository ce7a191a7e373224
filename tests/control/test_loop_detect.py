"""Surge detection between control intervals in the operator's loop (control/loop.py), without I/O."""
from __future__ import annotations

from dataclasses import replace

import pytest

from specfleet.operator.control import loop, speculation


def _settled(service, make_window, current: int, rps: float) -> loop.ServiceLoop:
    """A service loop after four steady intervals (ending at 60 s) with `current` replicas."""
    spec, plan, model = service
    st = loop.ServiceLoop(1, model, speculation=speculation.SpeculationState(True, 4))
    for i in range(4):
        w = make_window(rps=rps, finished=rps, running_growth=0.0, pods=current, end=15.0 * (i + 1))
        loop.decide_step(w, spec, plan, st, current, current, 15.0 * (i + 1), "t")
    return st


def test_a_surge_scales_up_between_intervals_and_says_why(service, make_window):
    spec, _, model = service
    rps = 2 * model.replica_rps(0.7)
    st = _settled(service, make_window, 3, rps)
    st.speculation = speculation.SpeculationState(False, 4)     # off already: only the scale-up is new
    surge = make_window(rps=rps, finished=rps, running_growth=40.0, pods=3, seconds=5.0, end=65.0)
    step = loop.detect_step(surge, spec, st, 3, 3, 65.0, "t65")
    assert step is not None and step.scale.reason == "LoadSurge" and step.scale.desired > 3
    assert step.decisions == [{"time": "t65", "kind": "scale", "from": "3", "to": str(step.scale.desired),
                               "reason": "LoadSurge"}]
    assert step.events[0][1] == "ScaleUp" and st.autoscaler.last_up == 65.0
    assert step.conditions == [] and step.spec is None          # status and speculation stay with the interval


def test_a_surge_that_makes_speculation_cost_replicas_turns_it_off_in_the_same_step(service, make_window):
    spec, _, model = service
    st = _settled(service, make_window, 3, 5.0)                 # light load: speculation is free, on
    assert st.speculation.enabled
    rps = 3 * model.replica_rps(0.8)
    surge = make_window(rps=rps, finished=rps, running_growth=0.0, pods=3, seconds=5.0, end=65.0, acceptance=0.6)
    step = loop.detect_step(surge, spec, st, 3, 3, 65.0, "t65")
    assert step.scale.reason == "LoadSurge" and not st.speculation.enabled
    assert step.spec.reason == "SurgeCostsReplicas" and step.decisions[-1]["kind"] == "speculation"
    assert [e[1] for e in step.events] == ["ScaleUp", "SpeculationOff"]
    assert [(c.type, c.status, c.reason) for c in step.conditions] == [("SpeculationActive", "False",
                                                                         "SurgeCostsReplicas")]


def test_no_surge_no_step(service, make_window):
    spec, _, model = service
    rps = 2 * model.replica_rps(0.7)
    st = _settled(service, make_window, 3, rps)
    calm = make_window(rps=rps, finished=rps, running_growth=0.0, pods=3, seconds=5.0, end=65.0)
    assert loop.detect_step(calm, spec, st, 3, 3, 65.0, "t") is None


def test_a_fixed_replica_count_turns_detection_off(service, make_window):
    spec, _, model = service
    rps = 2 * model.replica_rps(0.7)
    st = _settled(service, make_window, 3, rps)
    surge = make_window(rps=rps, finished=rps, running_growth=40.0, pods=3, seconds=5.0, end=65.0)
    assert loop.detect_step(surge, replace(spec, replicas=3), st, 3, 3, 65.0, "t") is None


def test_detection_runs_only_more_often_than_the_interval():
    assert loop.LoopConfig.from_environment({}).detect_interval_s == 5.0
    assert loop.LoopConfig.from_environment({"SPECFLEET_CONTROL_INTERVAL": "1"}).detect_interval_s == 0.0
    assert loop.LoopConfig.from_environment({"SPECFLEET_CONTROL_INTERVAL": "15",
                                             "SPECFLEET_DETECT_INTERVAL": "0"}).detect_interval_s == 0.0


def test_a_loop_config_rejects_a_non_positive_interval():
    with pytest.raises(ValueError, match="interval must be positive"):
        loop.LoopConfig(interval_s=0)
