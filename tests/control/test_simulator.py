"""The fleet simulator drives the operator's policies; `specfleet simulate` writes its JSON."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specfleet.sim import fleet as F, run, scenarios

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


def test_surge_detection_scales_up_before_the_first_interval_of_a_flash_crowd():
    r = run.simulate(scenarios.adjusted(scenarios.bursty(), duration=930), "specfleet")
    before = next(p for p in r["series"] if p["t"] == 900.0)["replicas"]
    first = next(p for p in r["series"] if p["t"] > 900 and p["replicas"] > before)
    assert first["t"] < 915 and first["scale_reason"] == "LoadSurge"


def test_deadline_order_keeps_a_share_of_an_overload_in_time_where_fifo_keeps_almost_none():
    sc = scenarios.adjusted(scenarios.steady(), duration=120, load=0.8)      # ~1.8x what 2 replicas carry
    fifo, deadline = (run.simulate(sc, "spec-always-off", fixed_replicas=2, queue_policy=q)
                      for q in ("fifo", "deadline"))
    assert (fifo["queue_policy"], deadline["queue_policy"]) == ("fifo", "deadline")
    assert fifo["slo_attainment"] < 0.1 and deadline["slo_attainment"] > 0.35


def test_ours_run_on_deadline_engines_and_the_peers_on_fifo_ones():
    assert run.queue_policy_of("specfleet") == run.queue_policy_of("spec-always-on") == "deadline"
    assert {run.queue_policy_of(p) for p in ("static-peak", "inflight-target", "saturation")} == {"fifo"}


def test_a_lower_inflight_target_fraction_buys_more_replicas():
    sc = scenarios.adjusted(scenarios.steady(), duration=300)
    default = run.simulate(sc, "inflight-target")
    runs = {f: run.simulate(sc, "inflight-target", knobs={"target_fraction": f}) for f in (0.1, 0.3, 0.7)}
    assert "knobs" not in default and runs[0.7]["knobs"] == {"target_fraction": 0.7}
    assert {k: v for k, v in runs[0.7].items() if k != "knobs"} == default          # 0.7 is the default
    # 0.3 and 0.7 under-provision on the profiled H100 and oscillate (down to a few replicas, then up past
    # what 0.1 holds), so GPU-hours do not order by the fraction; the fleet each drops to does.
    floor = {f: min(x["replicas"] for x in r["series"][1:]) for f, r in runs.items()}
    assert floor[0.1] > floor[0.3] >= floor[0.7]
    assert runs[0.1]["series"][-1]["replicas"] > runs[0.3]["series"][-1]["replicas"] > default["series"][-1]["replicas"]


def test_a_peer_can_run_without_speculation():
    sc = scenarios.adjusted(scenarios.steady(), duration=60)
    r = run.simulate(sc, "inflight-target", knobs={"speculate": 0, "target_fraction": 0.5})
    assert r["knobs"] == {"speculate": 0, "target_fraction": 0.5}
    assert not any(p["speculation"] for p in r["series"]) and r["speculation_switches"] == 0


def test_a_knob_the_policy_lacks_is_an_error():
    sc = scenarios.adjusted(scenarios.steady(), duration=30)
    with pytest.raises(ValueError, match="no knob"):
        run.simulate(sc, "inflight-target", knobs={"kv_target": 1.0})
    with pytest.raises(ValueError, match="no knob"):
        run.simulate(sc, "specfleet", knobs={"target_fraction": 0.2})


def _fleet(pods: int, queue_policy: str = "fifo") -> F.SimulatedFleet:
    spec, plan, model, truth = run.setup(scenarios.steady())
    fleet = F.SimulatedFleet(model, truth, spec.slo.prompt_tokens, 30.0, plan.gpus_per_replica,
                    plan.kv_cache_blocks * plan.block_size, np.random.default_rng(0), queue_policy)
    fleet.add_pods(pods, 0.0, 0, ready_now=True)
    return fleet


def _hold(fleet: F.SimulatedFleet, decoding: int, waiting: int) -> None:
    """Pod 0 holds `decoding` sequences past prefill and `waiting` prompts not started."""
    n = decoding + waiting
    prompt = float(fleet.prompt)
    fleet.req = {"rep": np.zeros(n), "start": np.zeros(n), "arrival": np.zeros(n),
                 "pleft": np.r_[np.zeros(decoding), np.full(waiting, prompt)], "oleft": np.full(n, 300.0),
                 "first": np.r_[np.zeros(decoding), np.full(waiting, np.nan)], "worst": np.zeros(n),
                 "olen": np.full(n, 300.0), "aligned": np.zeros(n)}


def test_prompts_waiting_for_prefill_do_not_slow_the_running_sequences():
    few, many = _fleet(1), _fleet(1)
    _hold(few, 10, 1)
    _hold(many, 10, 200)
    for fleet in (few, many):
        fleet._advance(0.0, 0.5, 0.6)
    assert np.allclose(few.req["oleft"][:10], many.req["oleft"][:10])
    assert many.req["oleft"][0] < 300


def test_the_gateway_deals_requests_round_robin():
    fleet = _fleet(2)
    fleet.queue_arrival, fleet.queue_out = np.array([0.1, 0.2, 0.3, 0.4]), np.full(4, 300.0)
    fleet._admit(0.5)
    assert fleet.req["rep"].tolist() == [0, 1, 0, 1] and fleet.req["arrival"].tolist() == [0.1, 0.2, 0.3, 0.4]


def test_a_pod_that_just_became_ready_is_not_handed_every_arrival():
    """The gateway deals by prompts waiting for prefill first: a new, empty pod takes its share as it
    starts prefills instead of all arrivals until it holds as many as the busy pod."""
    fleet = _fleet(2)
    _hold(fleet, 70, 0)
    fleet.queue_arrival, fleet.queue_out = np.linspace(0.01, 0.49, 40), np.full(40, 300.0)
    fleet._admit(0.5)
    dealt = np.bincount(fleet.req["rep"][70:].astype(int), minlength=2)
    assert dealt.tolist() == [20, 20]
    assert F._deal(np.array([0, 0]), np.array([70, 0]), 40).tolist()[:3] == [1, 0, 1]


def test_a_full_pod_starts_no_prompt_and_its_backlog_stays_with_it():
    """Requests are dealt on arrival and stay where they were dealt (as behind cluster/gateway.py): a
    pod running max_num_seqs sequences starts none of its waiting prompts, one slot short it starts
    one, and a pod that becomes ready later takes only what arrives after."""
    full, short = _fleet(1), _fleet(1)
    slots = full.m.max_num_seqs
    _hold(full, slots, 5)
    _hold(short, slots - 1, 5)
    for fleet in (full, short):
        fleet._advance(0.0, 0.1, 0.6)
    assert (full.req["pleft"][slots:] == full.prompt).all()
    assert int((short.req["pleft"][slots - 1:] < short.prompt).sum()) == 1
    full.add_pods(1, 0.1, 0, ready_now=True)
    full.queue_arrival, full.queue_out = np.array([0.15, 0.16]), np.full(2, 300.0)
    full._admit(0.2)
    assert full.req["rep"][-2:].tolist() == [1, 1] and (full.req["rep"][:slots + 5] == 0).all()
    assert full.queue_depth() == 7 and len(full.queue_arrival) == 0


def test_late_prompts_step_aside_for_those_that_can_still_make_their_deadline():
    # 10 prompts/s: by 0.05 s none fits, by 0.15 one, by 0.25 two, by 0.3 three, by 0.31 still three
    late = F._late(np.array([0.05, 0.15, 0.25, 0.3, 0.31]), 0.0, 0.0, 10_000.0, 1000.0)
    assert late.tolist() == [True, False, False, False, True]
    assert F._late(np.array([0.15, 0.25]), 0.0, 1000.0, 10_000.0, 1000.0).tolist() == [True, False]


def test_requests_left_waiting_at_the_end_count_as_misses():
    fleet = _fleet(1, "deadline")
    _hold(fleet, 0, 3)
    fleet.queue_arrival, fleet.queue_out = np.array([0.5, 9.5]), np.full(2, 300.0)
    assert fleet.unfinished_late(10.0) == 4          # 3 at the pod and 1 queued waited > 1 s; 1 is fresh


def test_acceptance_drift_turns_speculation_off():
    r = run.simulate(scenarios.acceptance_drift(), "specfleet")
    assert r["speculation_switches"] >= 1 and r["slo_attainment"] >= 0.99
    late = r["series"][-1]
    assert late["speculation"] is False and late["speculation_reason"] in ("NotPaying", "LowAcceptance")


def test_the_cli_writes_json_and_a_plot(tmp_path):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    args = [str(BIN / "specfleet"), "simulate", "--scenario", "diurnal", "--policy", "static-peak",
            "--duration", "120", "--min-replicas", "2", "--scale-down-stabilization", "30", "--json", str(out)]
    if _has_matplotlib():
        args += ["--plot", str(png)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert KEYS <= set(result) and result["policy"] == "static-peak" and result["series"]
    assert result["scenario"] == "diurnal+minReplicas=2+scaleDown=30s"
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
    code = ("import sys; import specfleet.operator.handlers, specfleet.sim.run, specfleet.operator.control.scrape, "
            "specfleet.operator.control.speculation_switch; assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
