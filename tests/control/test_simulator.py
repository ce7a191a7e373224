"""The fleet simulator drives the operator's policies; `specfleet simulate` writes its JSON."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specfleet.operator.simulator import run, scenarios

BIN = Path(sys.executable).parent
KEYS = {"slo_attainment", "goodput", "gpu_hours", "scaling_actions", "speculation_switches"}


def test_a_short_steady_run_meets_the_slo_without_scaling():
    r = run.simulate(scenarios.adjusted(scenarios.steady(), duration=300), "specfleet")
    assert KEYS <= set(r) and r["slo_attainment"] >= 0.99 and r["scaling_actions"] == 0
    assert r["gpu_hours"] == pytest.approx(r["max_replicas"] * 300 / 3600, rel=0.01)


def test_a_flash_crowd_is_met_with_a_scale_up_within_one_interval():
    sc = scenarios.adjusted(scenarios.bursty(), duration=990)
    r = run.simulate(sc, "specfleet")
    burst = [p for p in r["series"] if 900 < p["t"] <= 930]
    assert burst[0]["replicas"] > r["series"][55]["replicas"]          # first interval after the crowd


def test_acceptance_drift_turns_speculation_off():
    r = run.simulate(scenarios.acceptance_drift(), "specfleet")
    assert r["speculation_switches"] >= 1 and r["slo_attainment"] >= 0.99
    late = r["series"][-1]
    assert late["speculation"] is False and late["speculation_reason"] in ("NotPaying", "LowAcceptance")


def test_the_cli_writes_json_and_a_plot(tmp_path):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    args = [str(BIN / "specfleet"), "simulate", "--scenario", "diurnal", "--policy", "static-peak",
            "--duration", "120", "--json", str(out)]
    if _has_matplotlib():
        args += ["--plot", str(png)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert KEYS <= set(result) and result["policy"] == "static-peak" and result["series"]
    assert not _has_matplotlib() or png.stat().st_size > 1000


def test_an_unknown_policy_is_a_usage_error():
    proc = subprocess.run([str(BIN / "specfleet"), "simulate", "--scenario", "steady", "--policy", "nope"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown policy" in proc.stderr


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_the_operator_side_never_imports_torch():
    code = ("import sys; import specfleet.operator.handlers, specfleet.operator.simulator.run, "
            "specfleet.operator.metrics_source; assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
