"""How the benchmarks judge their runs: the closed loop says which fixed policy auto held per phase, and the
speculation benchmark prices each measured row's speed-up with a cost (no engine, no server)."""
from __future__ import annotations

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


class LinearCost:
    """T = 10 ms + 1 ms per token per sequence (batch-independent, so the price is easy to check)."""

    def step(self, batch: float, ctx: int, q: float) -> float:
        return 0.010 + 0.001 * q


def test_each_steady_row_is_priced_from_what_speculation_did_in_it():
    row = {"method": "ngram", "workload": "copy-heavy", "batch": 8, "context": 100, "seq_steps": 100,
           "accepted": 50, "drafted": 100, "speedups": [1.20, 1.30, 1.40]}
    entry, = speculation.speedup_by_batch([row], {"linear": LinearCost()})
    # 1.5 tokens per sequence-step for verifying 2 tokens per sequence: 1.5 x 11 ms / 12 ms
    assert entry["predicted_linear"] == pytest.approx(1.5 * 0.011 / 0.012)
    assert entry["measured"] == 1.30 and entry["measured_range"] == [1.20, 1.40]
    summary = speculation.by_batch_summary([entry], ["linear"])["linear/copy-heavy"]
    assert summary["in_range"] == 1.0
    assert summary["median_abs_error"] == pytest.approx(1.5 * 0.011 / 0.012 / 1.30 - 1)
