"""Control-loop benchmark: every scenario x policy in the fleet simulator, a speculation sweep over
load levels on a fixed fleet, a pod start-up sensitivity run of the bursty scenario, the trade-off of a
declared minReplicas floor (burst headroom), and every scaling policy on the other engine queue order.

    .venv/bin/python benchmarks/control.py [--seed 0] [--out benchmarks/results/control.json]

Prints rich tables and writes JSON (summaries only, no time series). Targets (issue 8): on bursty and
diurnal, specfleet >= 99% SLO attainment with >= 30% fewer GPU-hours than static-peak, and higher
attainment than each peer-style baseline at equal or lower GPU-hours; adaptive speculation within 3% of
the better of always-on / always-off at every load level.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from specfleet.operator.simulator import policies, run, scenarios

OUT = Path(__file__).parent / "results" / "control.json"
LOADS = (0.1, 0.25, 0.5, 0.75, 1.0, 1.1)     # x the steady rate (60 req/s) on a fixed 4-replica fleet (~70 req/s max)
SWEEP_REPLICAS = 4
SWEEP_SECONDS = 1200
STARTUPS = (10.0, 60.0)
FLOORS = {"bursty": (4, 5, 6, 7), "diurnal": (5, 6)}     # declared minReplicas (the scenarios declare 1)
SCALERS = ("specfleet", "static-peak", "inflight-target", "saturation")


def summary(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "series"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--scenarios", nargs="*", default=list(scenarios.SCENARIOS))
    args = ap.parse_args()
    console, started = Console(width=160), time.time()
    grid = [summary(run.simulate(scenarios.get(s), p, seed=args.seed))
            for s in args.scenarios for p in policies.POLICIES]
    sweep = [summary(run.simulate(scenarios.adjusted(scenarios.steady(), duration=SWEEP_SECONDS, load=load),
                                  p, seed=args.seed, fixed_replicas=SWEEP_REPLICAS))
             for load in LOADS for p in ("specfleet", "spec-always-on", "spec-always-off", "spec-batch-table")]
    startup = [{**summary(run.simulate(scenarios.adjusted(scenarios.bursty(), startup_s=s), p, seed=args.seed)),
                "startup_s": s} for s in STARTUPS for p in SCALERS]
    floors = [{**summary(run.simulate(scenarios.adjusted(scenarios.get(s), min_replicas=n), "specfleet",
                                      seed=args.seed)), "min_replicas": n} for s, ns in FLOORS.items() for n in ns]
    other = {"fifo": "deadline", "deadline": "fifo"}
    engines = [summary(run.simulate(scenarios.bursty(), p, seed=args.seed, queue_policy=other[run.queue_policy_of(p)]))
               for p in SCALERS]
    checks = {**targets(grid, sweep), **floor_targets(grid, floors)}
    result = {"seed": args.seed, "seconds": round(time.time() - started, 1), "grid": grid,
              "speculation_sweep": sweep, "startup_sensitivity": startup, "min_replicas_floor": floors,
              "other_queue_policy": engines, "targets": checks, "startup_s": STARTUPS}
    console.print(table("scenario x policy", grid, ("scenario", "policy")))
    console.print(table(f"speculation on a fixed {SWEEP_REPLICAS}-replica fleet", sweep, ("scenario", "policy")))
    console.print(table("bursty, pod start-up sensitivity", startup, ("startup_s", "policy")))
    console.print(table("specfleet with a declared minReplicas floor", floors, ("scenario", "min_replicas")))
    console.print(table("bursty, each scaler on the other engine queue order", engines, ("policy", "queue_policy")))
    for name, ok in checks.items():
        console.print(f"{'[green]PASS' if ok['pass'] else '[red]MISS'}[/] {name}: {ok['detail']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=float))
    console.print(f"wrote {args.out} in {result['seconds']} s")


def floor_targets(grid: list[dict], floors: list[dict]) -> dict:
    """Which declared floors meet the bursty targets (attainment and GPU-hours against static-peak)."""
    static = next((r for r in grid if r["scenario"] == "bursty" and r["policy"] == "static-peak"), None)
    out = {}
    for r in floors:
        if static is None or not r["scenario"].startswith("bursty"):
            continue
        saving = 1 - r["gpu_hours"] / static["gpu_hours"]
        out[f"bursty with minReplicas={r['min_replicas']}: >= 99% and >= 30% fewer GPU-hours"] = {
            "pass": r["slo_attainment"] >= 0.99 and saving >= 0.30,
            "detail": f"{r['slo_attainment']:.4f}, {r['gpu_hours']} GPU-h ({saving:.1%} fewer)"}
    return out


def table(title: str, rows: list[dict], keys: tuple[str, ...]) -> Table:
    t = Table(title=title)
    cols = ("slo_attainment", "gpu_hours", "goodput", "scaling_actions", "speculation_switches", "mean_tpot_ms",
            "ttft_p99_ms", "max_replicas")
    for c in keys + cols:
        t.add_column(c, justify="left" if c in keys else "right")
    for r in rows:
        t.add_row(*[str(r.get(c)) for c in keys + cols])
    return t


def targets(grid: list[dict], sweep: list[dict]) -> dict:
    by = {(r["scenario"], r["policy"]): r for r in grid}
    out = {}
    for s in ("bursty", "diurnal"):
        ours, static = by.get((s, "specfleet")), by.get((s, "static-peak"))
        if not ours or not static:
            continue
        saving = 1 - ours["gpu_hours"] / static["gpu_hours"]
        out[f"{s}: attainment >= 99%"] = {"pass": ours["slo_attainment"] >= 0.99,
                                          "detail": f"{ours['slo_attainment']:.4f}"}
        out[f"{s}: >= 30% fewer GPU-hours than static-peak"] = {
            "pass": saving >= 0.30, "detail": f"{ours['gpu_hours']} vs {static['gpu_hours']} ({saving:.1%} fewer)"}
        for peer in ("inflight-target", "saturation"):
            p = by.get((s, peer))
            if p:
                ok = ours["slo_attainment"] > p["slo_attainment"] and ours["gpu_hours"] <= p["gpu_hours"]
                out[f"{s}: beats {peer}"] = {"pass": ok, "detail": f"attainment {ours['slo_attainment']} vs "
                                             f"{p['slo_attainment']}, GPU-h {ours['gpu_hours']} vs {p['gpu_hours']}"}
    loads = {}
    for r in sweep:
        loads.setdefault(r["scenario"], {})[r["policy"]] = r
    for load, rows in loads.items():
        ours, on, off = rows["specfleet"], rows["spec-always-on"], rows["spec-always-off"]
        best_good = max(on["goodput"], off["goodput"])
        best_tpot = min(on["mean_tpot_ms"], off["mean_tpot_ms"])
        ok = ours["goodput"] >= 0.97 * best_good and ours["mean_tpot_ms"] <= 1.03 * best_tpot
        out[f"speculation {load}: within 3% of the better fixed setting"] = {
            "pass": ok, "detail": f"goodput {ours['goodput']} vs best {best_good}; mean worst-TPOT "
                                  f"{ours['mean_tpot_ms']} ms vs best {best_tpot} ms"}
    return out


if __name__ == "__main__":
    main()
