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


# Remove once the batch can cross the threshold on this service: at these prompts' acceptance (0.93 at k = 1,
# draft share 0.45) the shipped CPU profile prices k = 1 at x1.06 or more at every batch up to 48, so there
# is no break-even under the plan's cap (54) and by the model speculation rightly stays on at the peak
# (docs/control.md, "Calibration: profile, online, roofline"). Open-ended text (0.78, 0.22) prices x1.12 at batch
# 1, x1.02 at 8 and x0.99 from 16 on: it crosses 1, but never leaves the dead band on the low side, so no batch
# switch off there either. Measured at k = 1 (docs/benchmarks.md), copy-heavy stops paying near batch 21 (10-33
# over the repeats) where the profile prices 32: the profile has no partially drafted (ragged) verify steps.
# One-token n-gram matches (promptLookupMin 1) draft at 4 sequence-steps in 5, but timed by decode steps their
# k = 1 speed-up stays within 6% of 1 from batch 8 to 32 (docs/benchmarks.md, "One-token n-gram matches"), so
# the priced threshold moves across the whole ramp with each window's acceptance. A deterministic direction
# needs a service whose speed-up leaves 1 clearly (a GPU at a large batch), not a trace on this CPU.
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
