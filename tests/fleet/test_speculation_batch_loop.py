"""Speculation follows the batch on real engines: a short copy-heavy trace (benchmarks/closed_loop.py's
harness) on `specfleet up` with the real SmolLM2-135M and one fixed replica, speculation `auto`.

As the clients rise the batch crosses the break-even the operator reports and speculation goes off for
`BatchAboveThreshold`; as they fall it comes back on (`SpeculationPays`). Copy-heavy prompts keep the
acceptance high, so no decision may be `LowAcceptance`. Control interval 2 s, dwell 4 s.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from testkit import free_port

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import closed_loop  # noqa: E402  (benchmarks/closed_loop.py)

from specfleet.sim.trace import Phase, Trace  # noqa: E402

pytestmark = pytest.mark.slow

# Short answers so that a client leaving the ramp-down frees its slot within seconds; a low tail so the
# batch sits under the threshold for several intervals with counterfactual acceptance to go on from.
SHORT = Trace(phases=(Phase("ramp-up", "copy-heavy", 20.0, 1, 24), Phase("peak", "copy-heavy", 15.0, 24, 24),
                      Phase("ramp-down", "copy-heavy", 10.0, 24, 2), Phase("low", "copy-heavy", 30.0, 2, 2)),
              max_tokens=48)


@pytest.fixture(scope="module")
def auto_run():
    settings = closed_loop.Settings(SHORT, modes=("auto",), interval_s=2.0, dwell_s=4.0, port=free_port(),
                                    ready_timeout_s=300.0)
    run = closed_loop.run_mode("auto", settings)
    print("switches:", run["switches"], "thresholds:", run["thresholds_reported"])
    print("phases:", run["phases"])
    return run


# Remove once the batch can cross the threshold on this service (docs/control.md, "Slow test"): with two-token
# matches the shipped CPU profile prices k = 1 within the dead band at every batch up to the plan's cap (54), so
# by the model speculation rightly stays on at the peak (and on an Intel host of the full-length closed loop
# always on beat always off there by 17%). One-token matches leave the band at both ends, but while speculating
# the plan's token budget (80) runs about 44 sequences a step, near or under the off edge the loop prices at the
# acceptance it sees, and a queue that builds first can turn speculation off for CostsReplicas instead.
# tests/operator/test_cost_profile.py holds the prices.
@pytest.mark.xfail(strict=False, reason="no break-even batch under the cap at these prompts' acceptance")
def test_speculation_goes_off_when_the_batch_rises_and_on_when_it_falls(auto_run):
    switched = auto_run["switches"]
    bounds = {name: (start, end) for name, start, end in SHORT.bounds()}
    off = [s for s in switched if not s["enabled"]]
    assert off and off[0]["reason"] == "BatchAboveThreshold", switched
    first_off = off[0]
    assert first_off["t"] < bounds["peak"][1], switched                  # while the clients rise or peak
    assert first_off["batch"] > first_off["threshold"] * (1 + closed_loop.HYSTERESIS), first_off
    # back on once the batch is under the threshold it crossed, with the clients falling
    back_on = [s for s in switched if s["enabled"] and s["t"] > first_off["t"] and s["reason"] == "SpeculationPays"
               and s["batch"] < first_off["threshold"] * (1 - closed_loop.HYSTERESIS)]
    assert back_on and back_on[0]["t"] >= bounds["ramp-down"][0], switched


def test_the_loop_decides_and_no_decision_is_for_low_acceptance_on_copy_heavy_prompts(auto_run):
    # The loop may rightly hold speculation on all run long (no switch at all): what it decided shows as the
    # SpeculationActive reason it reported while the batch moved ("Planned" is the plan's, before the loop's first
    # decision; "MetricsUnavailable" a hold for want of evidence).
    decided = {why for *_, why in auto_run["batch_series"] if why not in (None, "Planned", "MetricsUnavailable")}
    assert decided, auto_run["batch_series"]
    assert "LowAcceptance" not in decided | {s["reason"] for s in auto_run["switches"]}, auto_run["switches"]


def test_every_request_of_the_trace_is_answered(auto_run):
    assert auto_run["requests"]["failed"] == 0 and auto_run["requests"]["sent"] >= 24, auto_run["requests"]
