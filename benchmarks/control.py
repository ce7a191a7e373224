"""Control-loop benchmark: every scenario x policy in the fleet simulator, a speculation sweep over
load levels on a fixed fleet, a pod start-up sensitivity run of the bursty scenario, the trade-off of a
declared minReplicas floor (burst headroom), and every scaling policy on the other engine queue order.

    .venv/bin/python benchmarks/control.py [--seed 0] [--out benchmarks/results/control.json]
    .venv/bin/python benchmarks/control.py --only matched-cost   # just the matched-cost sweep (~7 min),
                                                                # merged into the existing JSON
    .venv/bin/python benchmarks/control.py --only speculation    # just the speculation sweep (~3 min), merged

The fleet's truth is the engine profile of the scenarios' Llama-3.1-8B on H100
(sim/profiles/, derived from published figures and labelled so: no H100 here to measure);
the controller starts from the catalog's roofline and calibrates online.

Prints rich tables and writes JSON (summaries only, no time series). Targets (issue 8): on bursty and
diurnal, specfleet >= 99% SLO attainment with >= 30% fewer GPU-hours than static-peak, and higher
attainment than each peer-style baseline at equal or lower GPU-hours; adaptive speculation's goodput
within 3% of the better of always-on / always-off at every load level of the sweep (median over seeds),
on a fixed fleet pushed past the load where speculation stops paying, so that the policies differ.

Matched cost: the peer baselines' GPU-hours depend on their target setting, so each is also swept along
its knob (inflight-target's targetRequests as a fraction of maxNumSeqs; saturation's queue target with
the KV target at 1.0) and its attainment is interpolated at specfleet's GPU-hours.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from specfleet.sim import policies, run, scenarios

from provenance import stamp                     # benchmarks/provenance.py: command, commit, machine, date

OUT = Path(__file__).parent / "results" / "control.json"
# x the steady rate (60 req/s) on a fixed 4-replica fleet: from well inside its capacity (~0.9x) to past it,
# where the draft tokens to verify cost the fleet capacity it needs, so that the policies differ.
LOADS = (0.25, 0.5, 0.75, 0.9, 1.1, 1.5)
SWEEP_REPLICAS = 4
SWEEP_SECONDS = 600
SWEEP_SEEDS = (0, 1, 2)
SWEEP_POLICIES = ("specfleet", "spec-always-on", "spec-always-off", "spec-batch-table")
SWEEP_KEYS = ("slo_attainment", "goodput", "speculation_switches", "mean_tpot_ms", "ttft_p99_ms")
STARTUPS = (10.0, 60.0)
# Declared minReplicas (the scenarios declare 1), with the declared 300 s scale-down window or a 30 s one.
FLOORS = [("bursty", n, None) for n in (4, 5, 6, 7)] + [("bursty", n, 30) for n in (5, 6, 7)] + [("diurnal", 5, None)]
SCALERS = ("specfleet", "static-peak", "inflight-target", "saturation")
# Matched cost: each peer's knob path, ordered from the most to the fewest replicas (roughly); the
# defaults (0.7 x maxNumSeqs; KV 0.8 / 5 waiting per pod) are on the paths.
MATCHED_SCENARIOS = ("bursty", "diurnal")
MATCHED_KNOBS = {
    "inflight-target": ("inflight-target", [{"target_fraction": f} for f in (0.05, 0.1, 0.15, 0.2, 0.22, 0.25, 0.3,
                                                                           0.32, 0.35, 0.4, 0.5, 0.7)]),
    # vLLM's default is no speculative decoding: the peer without it, where its in-flight count does not
    # change with the speculation state (request times do).
    "inflight-target, no speculation": ("inflight-target", [{"target_fraction": f, "speculate": 0}
                                                            for f in (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6,
                                                                      0.65, 0.7, 0.8)]),
    "saturation": ("saturation", [{"kv_target": 0.8, "queue_target": 5.0}] +
                   [{"kv_target": 1.0, "queue_target": q} for q in (100.0, 200.0, 400.0, 1000.0)]),
}
SECTIONS = ("all", "matched-cost", "speculation")


def summary(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "series"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--scenarios", nargs="*", default=list(scenarios.SCENARIOS))
    ap.add_argument("--only", choices=SECTIONS, default="all",
                    help="matched-cost: run only that sweep and merge it into the existing --out JSON")
    args = ap.parse_args()
    console, started = Console(width=160), time.time()
    if args.only == "matched-cost":
        return matched_cost_only(args, console, started)
    if args.only == "speculation":
        return speculation_only(args, console, started)
    grid = [summary(run.simulate(scenarios.get(s), p, seed=args.seed))
            for s in args.scenarios for p in policies.POLICIES]
    sweep = speculation_sweep()
    startup = [{**summary(run.simulate(scenarios.adjusted(scenarios.bursty(), startup_s=s), p, seed=args.seed)),
                "startup_s": s} for s in STARTUPS for p in SCALERS]
    floors = [{**summary(run.simulate(scenarios.adjusted(scenarios.get(s), min_replicas=n, scale_down_s=down),
                                      "specfleet", seed=args.seed)), "min_replicas": n, "scale_down_s": down or 300}
              for s, n, down in FLOORS]
    other = {"fifo": "deadline", "deadline": "fifo"}
    engines = [summary(run.simulate(scenarios.bursty(), p, seed=args.seed, queue_policy=other[run.queue_policy_of(p)]))
               for p in SCALERS]
    bound = onset_bound("bursty")
    matched = matched_cost(grid, args.seed)
    checks = {**targets(grid, sweep), **floor_targets(grid, floors), **matched_targets(matched)}
    result = {**stamp("benchmarks/control.py", sys.argv[1:]),
              "seed": args.seed, "seconds": round(time.time() - started, 1), "grid": grid,
              "speculation_sweep": sweep, "startup_sensitivity": startup, "min_replicas_floor": floors,
              "other_queue_policy": engines, "onset_bound": bound, "matched_cost": matched, "targets": checks, "startup_s": STARTUPS}
    console.print(table("scenario x policy", grid, ("scenario", "policy")))
    print_sweep(console, sweep)
    console.print(table("bursty, pod start-up sensitivity", startup, ("startup_s", "policy")))
    console.print(table("specfleet with a declared minReplicas floor", floors,
                        ("scenario", "min_replicas", "scale_down_s")))
    console.print(table("bursty, each scaler on the other engine queue order", engines, ("policy", "queue_policy")))
    console.print(table("bursty, the onset bound (a fluid fleet that learns of each crowd at its first instant)",
                        bound, ("scenario", "min_replicas")))
    print_matched(console, matched)
    for name, ok in checks.items():
        console.print(f"{'[green]PASS' if ok['pass'] else '[red]MISS'}[/] {name}: {ok['detail']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=float))
    console.print(f"wrote {args.out} in {result['seconds']} s")


def speculation_sweep(seeds: tuple[int, ...] = SWEEP_SEEDS) -> list[dict]:
    """Each speculation policy on a fixed fleet at each load, per seed; one row per (load, policy) with the
    median over seeds of each figure and its spread (max - min)."""
    rows = []
    for load in LOADS:
        sc = scenarios.adjusted(scenarios.steady(), duration=SWEEP_SECONDS, load=load)
        for p in SWEEP_POLICIES:
            runs = [run.simulate(sc, p, seed=s, fixed_replicas=SWEEP_REPLICAS) for s in seeds]
            row = {"scenario": sc.name, "load": load, "policy": p, "replicas": SWEEP_REPLICAS, "seeds": list(seeds),
                   "truth": runs[0]["truth"], "batch_p50": _median([_late_batch(r["series"]) for r in runs])}
            for key in SWEEP_KEYS:
                values = [r[key] for r in runs]
                row[key], row[f"{key}_spread"] = _median(values), round(max(values) - min(values), 5)
            row["speculation_reasons"] = sorted({r["series"][-1]["speculation_reason"] for r in runs if r["series"]})
            rows.append(row)
    return rows


def _late_batch(series: list[dict]) -> float:
    """Median batch per replica over the second half of a run (the load's steady state)."""
    batches = [p["batch"] for p in series[len(series) // 2:] if p["batch"] is not None]
    return round(float(statistics.median(batches)), 1) if batches else 0.0


def _median(values: list[float]) -> float:
    return round(float(statistics.median(values)), 5)


def print_sweep(console: Console, sweep: list[dict]) -> None:
    t = Table(title=f"speculation on a fixed {SWEEP_REPLICAS}-replica fleet (median over seeds {SWEEP_SEEDS}; "
                    f"spread in brackets)")
    for c in ("load", "policy", "batch/replica", *SWEEP_KEYS, "last reason"):
        t.add_column(c, justify="left" if c in ("policy", "last reason") else "right")
    for r in sweep:
        t.add_row(f"{r['load']:g}", r["policy"], f"{r['batch_p50']:g}",
                  *[f"{r[k]:g} [{r[k + '_spread']:g}]" for k in SWEEP_KEYS], ", ".join(r["speculation_reasons"]))
    console.print(t)


def speculation_only(args, console: Console, started: float) -> None:
    """The speculation sweep alone, merged into the JSON at --out (its other keys are kept)."""
    result = json.loads(args.out.read_text()) if args.out.exists() else {}
    sweep = speculation_sweep()
    result["speculation_sweep"] = sweep
    result["speculation_sweep_seconds"] = round(time.time() - started, 1)
    checks = {k: v for k, v in result.get("targets", {}).items() if not k.startswith("speculation ")}
    result["targets"] = {**checks, **sweep_targets(sweep)}
    print_sweep(console, sweep)
    for name, ok in sweep_targets(sweep).items():
        console.print(f"{'[green]PASS' if ok['pass'] else '[red]MISS'}[/] {name}: {ok['detail']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=float))
    console.print(f"wrote speculation_sweep into {args.out} in {result['speculation_sweep_seconds']} s")


def matched_cost_only(args, console: Console, started: float) -> None:
    """The matched-cost sweep alone, merged into the JSON at --out (its other keys are kept; specfleet's
    rows come from its grid, or are simulated when it has none)."""
    result = json.loads(args.out.read_text()) if args.out.exists() else {"seed": args.seed}
    if result.get("seed", args.seed) != args.seed:
        raise SystemExit(f"{args.out} holds seed {result['seed']}, not {args.seed}; give another --out")
    matched = matched_cost(result.get("grid", []), args.seed)
    matched["seconds"] = round(time.time() - started, 1)
    result["matched_cost"] = matched
    result["targets"] = {**result.get("targets", {}), **matched_targets(matched)}
    print_matched(console, matched)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=float))
    console.print(f"wrote matched_cost into {args.out} in {matched['seconds']} s")


def matched_cost(grid: list[dict], seed: int) -> dict:
    """Each peer along its knob path on bursty and diurnal; its attainment at specfleet's GPU-hours, with
    the service's declared scale-down window (300 s) and, against the KubeAI-style peers, also with
    their scale-down delay declared (30 s), so that only the policies differ."""
    ours = {r["scenario"]: r for r in grid if r["policy"] == "specfleet" and r.get("seed", seed) == seed}
    delay = int(policies.INFLIGHT_SCALE_DOWN_DELAY_S)
    runs, comparison, equal_delay = [], [], []
    for s in MATCHED_SCENARIOS:
        ref = ours.get(s) or summary(run.simulate(scenarios.get(s), "specfleet", seed=seed))
        same = summary(run.simulate(scenarios.adjusted(scenarios.get(s), scale_down_s=delay), "specfleet", seed=seed))
        equal_delay.append(same)
        for label, (peer, path) in MATCHED_KNOBS.items():
            rows = [summary(run.simulate(scenarios.get(s), peer, seed=seed, knobs=k)) for k in path]
            runs += rows
            comparison.append(compare_at_cost(ref, rows, label))
            if peer == "inflight-target":
                comparison.append(compare_at_cost({**same, "scenario": s}, rows,
                                                  f"{label} (both with a {delay} s scale-down delay)"))
    return {"seed": seed, "knob_paths": MATCHED_KNOBS, "runs": runs, "ours_at_peer_scale_down_delay": equal_delay,
            "comparison": comparison}


def compare_at_cost(ours: dict, rows: list[dict], label: str | None = None) -> dict:
    """The peer's attainment at our GPU-hours: linear in GPU-hours between consecutive settings of its
    knob path whose GPU-hours straddle ours (the best such crossing when there are several), and the best
    attainment of any setting at equal or lower GPU-hours."""
    cost, crossings = ours["gpu_hours"], []
    for a, b in zip(rows, rows[1:]):
        lo, hi = sorted((a, b), key=lambda r: r["gpu_hours"])
        if lo["gpu_hours"] <= cost <= hi["gpu_hours"]:
            span = hi["gpu_hours"] - lo["gpu_hours"]
            w = (cost - lo["gpu_hours"]) / span if span else 0.0
            att = lo["slo_attainment"] + w * (hi["slo_attainment"] - lo["slo_attainment"])
            crossings.append({"between": [a["knobs"], b["knobs"]], "attainment": round(att, 5)})
    cheaper = [r for r in rows if r["gpu_hours"] <= cost]
    best = max(cheaper, key=lambda r: r["slo_attainment"], default=None)
    at_cost = max(crossings, key=lambda c: c["attainment"], default=None)
    # The peer's cheapest setting that reaches our attainment (where attainment saturates at 100%, "higher
    # at equal cost" cannot hold for anyone; then the question is who pays less for it).
    matching = [r for r in rows if r["slo_attainment"] >= ours["slo_attainment"]]
    cheapest = min(matching, key=lambda r: r["gpu_hours"], default=None)
    return {"scenario": ours["scenario"], "peer": label or rows[0]["policy"], "ours_attainment": ours["slo_attainment"],
            "ours_gpu_hours": cost, "ours_requests": ours["requests"],
            "peer_at_our_gpu_hours": at_cost,
            "peer_best_at_or_below": None if best is None else
            {"knobs": best["knobs"], "attainment": best["slo_attainment"], "gpu_hours": best["gpu_hours"]},
            "peer_cheapest_at_our_attainment": None if cheapest is None else
            {"knobs": cheapest["knobs"], "attainment": cheapest["slo_attainment"], "gpu_hours": cheapest["gpu_hours"]}}


def matched_targets(matched: dict) -> dict:
    """Higher attainment than the peer interpolated at our GPU-hours and than any of its settings at equal
    or lower GPU-hours."""
    out = {}
    for c in matched["comparison"]:
        rivals = [x["attainment"] for x in (c["peer_at_our_gpu_hours"], c["peer_best_at_or_below"]) if x]
        if not rivals:
            continue
        out[f"{c['scenario']}: beats a tuned {c['peer']} at matched GPU-hours"] = {
            "pass": c["ours_attainment"] > max(rivals),
            "detail": f"attainment {c['ours_attainment']} at {c['ours_gpu_hours']} GPU-h vs "
                      f"{c['peer_at_our_gpu_hours'] and c['peer_at_our_gpu_hours']['attainment']} interpolated, "
                      f"best at <= our GPU-h {c['peer_best_at_or_below']}"}
        cheapest = c.get("peer_cheapest_at_our_attainment")
        out[f"{c['scenario']}: no {c['peer']} setting reaches our attainment for fewer GPU-hours"] = {
            "pass": cheapest is None or cheapest["gpu_hours"] > c["ours_gpu_hours"],
            "detail": f"ours {c['ours_attainment']} at {c['ours_gpu_hours']} GPU-h; the peer's cheapest at "
                      f">= that: {cheapest}"}
    return out


def print_matched(console: Console, matched: dict) -> None:
    console.print(table("matched cost: the peers along their knob paths", matched["runs"], ("scenario", "policy",
                                                                                           "knobs")))
    if matched.get("ours_at_peer_scale_down_delay"):
        console.print(table("specfleet with the KubeAI-style peers' scale-down delay declared",
                            matched["ours_at_peer_scale_down_delay"], ("scenario", "policy")))
    for c in matched["comparison"]:
        console.print(f"{c['scenario']} {c['peer']}: ours {c['ours_attainment']} at {c['ours_gpu_hours']} GPU-h; "
                      f"peer at our GPU-h {c['peer_at_our_gpu_hours']}; best at <= {c['peer_best_at_or_below']}",
                      markup=False)
    for name, ok in matched_targets(matched).items():
        console.print(f"{'[green]PASS' if ok['pass'] else '[red]MISS'}[/] {name}: ", end="")
        console.print(ok["detail"], markup=False)


def floor_targets(grid: list[dict], floors: list[dict]) -> dict:
    """Which declared floors meet the bursty targets (attainment and GPU-hours against static-peak)."""
    static = next((r for r in grid if r["scenario"] == "bursty" and r["policy"] == "static-peak"), None)
    out = {}
    for r in floors:
        if static is None or not r["scenario"].startswith("bursty"):
            continue
        saving = 1 - r["gpu_hours"] / static["gpu_hours"]
        out[f"bursty with minReplicas={r['min_replicas']}, scale-down {r['scale_down_s']} s: >= 99% and "
            f">= 30% fewer GPU-hours"] = {
            "pass": r["slo_attainment"] >= 0.99 and saving >= 0.30,
            "detail": f"{r['slo_attainment']:.4f}, {r['gpu_hours']} GPU-h ({saving:.1%} fewer)"}
    return out


def onset_bound(name: str, floors=range(1, 9), dt: float = 0.25) -> list[dict]:
    """What no policy without foresight can beat: a fluid fleet whose controller learns of each rise at
    its first instant and knows its whole course, orders every pod it needs then (ready `startup_s`
    later), scales down at once, and runs every replica at the full capacity our model gives it; the
    queue beyond what the fleet prefills within the TTFT target is late. Per declared floor:
    attainment and GPU-hours."""
    sc = scenarios.get(name)
    _, _, model, truth = run.setup(sc)
    true_cal = truth.calibration(model.shape, model.prior)
    per = replace(model, cal=true_cal, prior=true_cal).replica_rps(1.0)
    steps = int(sc.duration_s / dt)
    rates = [sc.rate(i * dt) for i in range(steps + 1)]
    onsets = [i * dt for i in range(1, steps) if rates[i + 1] > rates[i] + 1e-9 and rates[i] <= rates[i - 1] + 1e-9]
    out = []
    for floor in floors:
        queue = late = total = gpu_s = 0.0
        for i in range(steps):
            t = i * dt
            blind = next((o for o in onsets if o <= t < o + sc.startup_s), None)
            replicas = max(floor, math.ceil((sc.rate(blind) if blind is not None else rates[i]) / per - 1e-9))
            capacity = replicas * per
            total += rates[i] * dt
            queue = max(0.0, queue + (rates[i] - capacity) * dt)
            excess = max(0.0, queue - capacity * model.ttft_s)
            late, queue, gpu_s = late + excess, queue - excess, gpu_s + replicas * dt
        out.append({"scenario": name, "policy": "onset-bound", "min_replicas": floor, "per_replica_rps": round(per, 2),
                    "slo_attainment": round(1 - late / total, 5), "gpu_hours": round(gpu_s / 3600, 3)})
    return out


def table(title: str, rows: list[dict], keys: tuple[str, ...]) -> Table:
    t = Table(title=title)
    cols = ("slo_attainment", "gpu_hours", "goodput", "scaling_actions", "speculation_switches", "mean_tpot_ms",
            "ttft_p99_ms", "max_replicas")
    for c in keys + cols:
        t.add_column(c, justify="left" if c in keys else "right")
    for r in rows:
        t.add_row(*[cell(r.get(c)) for c in keys + cols])
    return t


def cell(value) -> str:
    return " ".join(f"{k}={v:g}" for k, v in value.items()) if isinstance(value, dict) else str(value)


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
    return {**out, **sweep_targets(sweep)}


def sweep_targets(sweep: list[dict]) -> dict:
    """Adaptive speculation's median goodput within 3% of the better fixed setting at every load."""
    loads, out = {}, {}
    for r in sweep:
        loads.setdefault(r["scenario"], {})[r["policy"]] = r
    for load, rows in loads.items():
        ours, on, off = rows["specfleet"], rows["spec-always-on"], rows["spec-always-off"]
        best_good = max(on["goodput"], off["goodput"])
        out[f"speculation {load}: goodput within 3% of the better fixed setting"] = {
            "pass": ours["goodput"] >= 0.97 * best_good,
            "detail": f"goodput {ours['goodput']} vs on {on['goodput']} / off {off['goodput']}; attainment "
                      f"{ours['slo_attainment']} vs {on['slo_attainment']} / {off['slo_attainment']}"}
    return out


if __name__ == "__main__":
    main()
