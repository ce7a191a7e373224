"""A restarted operator, or a new leader, goes on with the speculation state the last one left on the
pods (`loop.restored_speculation`), instead of switching them back to the plan."""
from __future__ import annotations

import datetime as dt

import pytest

from specfleet.operator.control.loop import restored_speculation
from specfleet.operator.control.speculation import SpeculationState

PLANNED = SpeculationState(True, 4)
WALL = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc).timestamp()


def status(state: str, message: str, generation: int = 3, switched: str = "2026-01-01T11:59:00Z") -> dict:
    return {"conditions": [{"type": "SpeculationActive", "status": state, "reason": "BatchAboveThreshold",
                            "message": message, "lastTransitionTime": switched, "observedGeneration": generation}]}


def test_off_stays_off_and_the_dwell_goes_on_from_the_switch():
    got = restored_speculation(status("False", "batch 40 above 12"), PLANNED, 3, WALL, now_t=1000.0)
    assert got.enabled is False and got.k == 4
    assert got.since == pytest.approx(1000.0 - 60.0)          # switched a minute ago, on this process's clock


def test_the_depth_comes_back_too():
    got = restored_speculation(status("True", "k=2; acceptance 0.5"), PLANNED, 3, WALL, now_t=50.0)
    assert (got.enabled, got.k) == (True, 2)


def test_a_newer_spec_or_no_condition_starts_from_the_plan():
    assert restored_speculation(status("False", "x", generation=2), PLANNED, 3, WALL, 0.0) == PLANNED
    assert restored_speculation({}, PLANNED, 3, WALL, 0.0) == PLANNED
    assert restored_speculation(status("Unknown", "x"), PLANNED, 3, WALL, 0.0) == PLANNED


def test_an_unreadable_time_keeps_the_planned_dwell():
    got = restored_speculation(status("False", "x", switched="yesterday"), PLANNED, 3, WALL, 0.0)
    assert got.enabled is False and got.since == PLANNED.since
