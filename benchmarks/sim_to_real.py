"""Sim-to-real: the closed-loop trace in the simulator (measured SmolLM2-135M CPU profile as the truth)
next to the same trace on real engines (`benchmarks/closed_loop.py`).

    .venv/bin/python benchmarks/sim_to_real.py                                   # simulator side only
    .venv/bin/python benchmarks/sim_to_real.py --real benchmarks/results/closed_loop.json
    .venv/bin/python benchmarks/sim_to_real.py --scale 0.1 --seeds 0 --out /tmp/s2r.json   # a quick check

The simulator replays `SIM_TO_REAL` (sim/trace.py; with `--real`, the trace that run
recorded, so a shortened real run is compared with the same shortened trace) on one replica of
manifests/examples/smollm2-cpu.yaml with the real speculation controller and online calibration
(sim/replay.py), in each speculation mode, with the control interval and dwell the real
benchmark uses (5 s / 10 s by default). Per phase it reports the median and spread (max - min) over
seeds; with `--real`, the real run's figures and the sim / real ratio, and whether each lies within
+-25% (the target), overall, per phase and per metric. Writes benchmarks/results/sim_to_real.json.

Each workload's n-gram acceptance and draft share are those benchmarks/acceptance.py measured on the closed
loop's own prompts (`--acceptance FILE`, by default benchmarks/results/acceptance_closed_loop.json where it
exists), else the profile's, measured on the profiler's prompts.

`--truth contention` slows each simulated step by the factor a calibration run measured at the clients in
flight (benchmarks/contention.py's result, `--contention FILE`; sim/contention.py): an input measured at
fixed client counts, never the compared run's answers (as `--truth real-scales` uses).

    .venv/bin/python benchmarks/sim_to_real.py --real benchmarks/results/closed_loop_full.json --scale 1.0 \
        --truth contention --contention benchmarks/results/contention_xeon.json \
        --out benchmarks/results/sim_to_real_full_contention.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from specfleet.engine import profile_model
from specfleet.engine.host import this_host
from specfleet.engine.profile_format import acceptance_from_json
from specfleet.sim import contention as cont
from specfleet.sim import replay
from specfleet.sim.trace import SIM_TO_REAL, Phase, Trace
from specfleet.sim import truth
from specfleet.sim.truth import find_profile

from provenance import repo_path, stamp          # benchmarks/provenance.py: command, commit, machine, date

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "manifests/examples/smollm2-cpu.yaml"
OUT = Path(__file__).parent / "results" / "sim_to_real.json"
CONTENTION = Path(__file__).parent / "results" / "contention_xeon.json"     # benchmarks/contention.py
ACCEPTANCE = Path(__file__).parent / "results" / "acceptance_closed_loop.json"   # benchmarks/acceptance.py
METRICS = ("throughput_tok_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "batch_mean",
           "speculation_on_share")
TOLERANCE = 0.25
# Prompt tokens of closed_loop.py's requests: benchmarks/speculation.py's tasks in SmolLM2's chat template
# (default system prompt), counted with its tokenizer: copy-heavy 73-156 (mean 131.5), open-ended 41-46 (44).
PROMPT_TOKENS = {"copy-heavy": 132, "open-ended": 44}
# Each workload has 4 prompts, reused by every request: after a prompt's first use the engine's prefix
# cache holds its full 16-token blocks, and only the rest (at least its last token) is prefilled.
BLOCK = 16


def cached_share(prompt: int, block: int = BLOCK) -> float:
    """Share of a repeated `prompt` the prefix cache serves: its full blocks before the last token."""
    return (prompt - 1) // block * block / prompt


def prefix_hits(real: dict | None, prompts: dict[str, int]) -> dict[str, float]:
    """Per workload: the real run's measured prefix-cache hit share (median over its phases and modes)
    where it recorded one, else `cached_share` of the workload's prompt."""
    hits = {w: cached_share(p) for w, p in prompts.items()}
    phases = {p["name"]: p["workload"] for p in (real or {}).get("config", {}).get("trace", {}).get("phases", [])}
    for workload in prompts:
        seen = [f.get("prefix_hit_share") for run in (real or {}).get("runs", {}).values()
                for name, f in run.get("phases", {}).items() if phases.get(name) == workload]
        seen = [x for x in seen if x is not None]
        if seen:
            hits[workload] = statistics.median(seen)
    return hits
FIT_WARNING = 0.25          # a profile fit worse than this is flagged before its numbers are trusted


def real_trace(real: dict) -> Trace | None:
    """The trace the real run used (`config.trace` in closed_loop.json), so both sides replay the same one."""
    raw = real.get("config", {}).get("trace")
    if not raw:
        return None
    return Trace(phases=tuple(Phase(p["name"], p["workload"], p["seconds"], p["clients_from"], p["clients_to"])
                              for p in raw["phases"]), max_tokens=raw.get("max_tokens", SIM_TO_REAL.max_tokens))


def scaled(profile: profile_model.Profile, decode: float, verify: float) -> profile_model.Profile:
    """The profile with its decode and prefill fits times `decode` and its verify fit times `verify`: the
    step costs the real engines ran at, as the operator's online calibration measured them."""
    def times(fit: profile_model.StepFit, by: float) -> profile_model.StepFit:
        return replace(fit, a=fit.a * by, b=fit.b * by, c=fit.c * by, s=fit.s * by, b2=fit.b2 * by, sc=fit.sc * by)
    fits = {kind: times(fit, verify if kind == "verify" else decode) for kind, fit in profile.fit.items()}
    return replace(profile, fit=fits)


def real_scales(real: dict) -> tuple[float, float] | None:
    """Median decode and verify scales the real run's auto mode recorded over its phases."""
    phases = real.get("runs", {}).get("auto", {}).get("phases", {}).values()
    decode = [p["decode_scale"] for p in phases if p.get("decode_scale")]
    verify = [p["verify_scale"] for p in phases if p.get("verify_scale")]
    if not decode:
        return None
    return statistics.median(decode), statistics.median(verify) if verify else statistics.median(decode)


def simulate(profile_path: Path, modes: tuple[str, ...], seeds: tuple[int, ...], trace: Trace, interval: float,
             dwell: float, prompt_tokens: dict[str, int], prefix_hit: dict[str, float] | None = None,
             scales: tuple[float, float] | None = None, contention: cont.Contention | None = None,
             acceptance: list[profile_model.Acceptance] | None = None) -> dict:
    """{mode: {"phases": {phase: {metric: median, metric_spread: max - min}}, "switches": [per seed]}}.
    `acceptance`: the workloads' n-gram acceptance in place of the profile's (None: the profile's)."""
    spec = yaml.safe_load(EXAMPLE.read_text())["spec"]
    profile = profile_model.load(profile_path)
    if acceptance is not None:
        profile = replace(profile, acceptance=acceptance)
    if scales is not None:
        profile = scaled(profile, *scales)
    out = {}
    for mode in modes:
        runs = [replay.replay(trace, spec, profile, replay.ReplayConfig(mode=mode, interval_s=interval, dwell_s=dwell,
                                                                       seed=s, prompt_tokens=prompt_tokens,
                                                                       prefix_hit=prefix_hit, contention=contention))
                for s in seeds]
        out[mode] = {"phases": {name: _aggregate([r["phases"][name] for r in runs]) for name in runs[0]["phases"]},
                     "truth_notes": runs[0]["truth_notes"], "token_budget": runs[0]["token_budget"],
                     "max_num_seqs": runs[0]["max_num_seqs"],
                     "switches": [r["switches"] for r in runs], "alpha": runs[0]["alpha"],
                     "calibration": [r["calibration"] for r in runs]}
    return out


def _aggregate(rows: list[dict]) -> dict:
    out = {}
    for key in rows[0]:
        values = [r[key] for r in rows if r[key] is not None]
        if not values or not isinstance(values[0], (int, float)):
            out[key] = rows[0][key]
            continue
        out[key] = round(statistics.median(values), 3)
        out[f"{key}_spread"] = round(max(values) - min(values), 3)
    return out


def compare(sim: dict, real: dict) -> list[dict]:
    """One row per (mode, phase, metric) both sides have: sim, real, ratio, within tolerance."""
    rows = []
    for mode, s in sim.items():
        r = real.get("runs", {}).get(mode)
        if r is None:
            continue
        for phase, figures in s["phases"].items():
            other = r.get("phases", {}).get(phase, {})
            for metric in METRICS:
                a, b = figures.get(metric), other.get(metric)
                ratio = a / b if a is not None and b not in (None, 0) else None
                rows.append({"mode": mode, "phase": phase, "metric": metric, "sim": a, "real": b,
                             "ratio": None if ratio is None else round(ratio, 3),
                             "within": None if ratio is None else abs(ratio - 1) <= TOLERANCE})
    return rows


def print_sim(console: Console, sim: dict) -> None:
    for mode, s in sim.items():
        t = Table(title=f"simulator, speculation {mode} (median over seeds; spread in brackets)")
        t.add_column("phase")
        for m in METRICS:
            t.add_column(m, justify="right")
        for phase, f in s["phases"].items():
            t.add_row(phase, *[_cell(f.get(m), f.get(f"{m}_spread")) for m in METRICS])
        console.print(t)
        for i, switches in enumerate(s["switches"]):
            console.print(f"  seed run {i}: " + ("; ".join(f"{x['t']:g}s {x['direction']} ({x['reason']})"
                                                           for x in switches) or "no switches"), markup=False)


def print_compare(console: Console, rows: list[dict]) -> None:
    t = Table(title=f"sim / real per phase (target: within +-{TOLERANCE:.0%})")
    for c in ("mode", "phase", "metric", "sim", "real", "ratio", "ok"):
        t.add_column(c, justify="left" if c in ("mode", "phase", "metric") else "right")
    for r in rows:
        t.add_row(r["mode"], r["phase"], r["metric"], _cell(r["sim"]), _cell(r["real"]), _cell(r["ratio"]),
                  "" if r["within"] is None else ("yes" if r["within"] else "NO"))
    console.print(t)


def default_profile(real: dict | None) -> Path | None:
    """The profile the real run's operator priced its engines with (its final `status.calibration`, where the
    run recorded one), else the one measured on this CPU, else the pair's own: the simulator's truth is
    what the real loop priced by."""
    priced = Counter((run.get("calibration") or {}).get("profile") for run in (real or {}).get("runs", {}).values())
    for name, _ in priced.most_common():
        found = [Path(d) / f"{name}.json" for d in truth.PROFILE_DIRS if name and (Path(d) / f"{name}.json").is_file()]
        if found:
            return found[0]
    return find_profile("smollm2-135m", "cpu", host=this_host())


def checked_contention(path: Path, basis: str, profile: Path) -> cont.Contention:
    """The calibration run's factors, refused when they were measured against another profile than the truth's
    (each factor is the engines' step time over that profile's)."""
    measured_against = json.loads(path.read_text()).get("profile_file")
    if measured_against and Path(measured_against).name != profile.name:
        raise SystemExit(f"{path} measured its factors against {measured_against}, the truth here is "
                         f"{repo_path(profile)}: give --profile {measured_against}, or measure the factors again "
                         f"(benchmarks/contention.py --profile {repo_path(profile)})")
    return cont.load(path, basis)


def workload_acceptance(path: Path | None) -> list[profile_model.Acceptance] | None:
    """benchmarks/acceptance.py's measurement of the closed loop's prompts (None: none given, or the default
    file absent: the profile's acceptance stands)."""
    if path is None or (path == ACCEPTANCE and not path.is_file()):
        return None
    try:
        return acceptance_from_json(json.loads(path.read_text())["acceptance"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"{path}: not an acceptance measurement of benchmarks/acceptance.py ({exc})") from exc


def within_by(rows: list[dict], key: str) -> dict[str, float]:
    """The share of cells within tolerance per phase or per metric (`key`)."""
    out: dict[str, list[bool]] = {}
    for r in rows:
        if r["within"] is not None:
            out.setdefault(r[key], []).append(bool(r["within"]))
    return {k: round(sum(v) / len(v), 3) for k, v in out.items()}


def _cell(value, spread=None) -> str:
    if value is None:
        return "-"
    text = f"{value:g}"
    return f"{text} [{spread:g}]" if spread else text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", type=Path, help="benchmarks/results/closed_loop.json from benchmarks/closed_loop.py")
    ap.add_argument("--profile", type=Path, help="engine profile (default: the one the real run priced its engines "
                    "with, else the shipped smollm2-135m--cpu one measured on this CPU, else the pair's own)")
    ap.add_argument("--modes", nargs="*", default=list(replay.MODES), choices=replay.MODES)
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--scale", type=float, default=1.0,
                    help="shorten every phase by this factor (with --real: the real run's trace instead)")
    ap.add_argument("--interval", type=float, default=5.0, help="control interval, seconds (as the real run)")
    ap.add_argument("--dwell", type=float, default=10.0, help="speculation dwell, seconds (as the real run)")
    ap.add_argument("--prompt-tokens", type=int, nargs=2, metavar=("COPY_HEAVY", "OPEN_ENDED"),
                    default=[PROMPT_TOKENS["copy-heavy"], PROMPT_TOKENS["open-ended"]],
                    help="prompt tokens per workload (default: those of closed_loop.py's prompts)")
    ap.add_argument("--prefix-hit", type=float, nargs=2, metavar=("COPY_HEAVY", "OPEN_ENDED"),
                    help="share of prompt tokens the prefix cache serves per workload (default: the real run's "
                         "measured share, else the repeated prompts' full blocks)")
    ap.add_argument("--truth", choices=("profile", "real-scales", "contention"), default="profile",
                    help="profile: the profile as measured; real-scales: its fits times the decode and verify "
                         "scales the real run's operator measured online (the engines' speed on the day); "
                         "contention: the profile with each step slowed by the clients in flight as a "
                         "calibration run measured it (--contention)")
    ap.add_argument("--contention", type=Path, default=CONTENTION,
                    help="benchmarks/contention.py's result, for --truth contention")
    ap.add_argument("--contention-basis", choices=cont.BASES, default="step_factor",
                    help="step_factor: the engine's step time over the profile's; period_factor: wall time "
                         "per step (the gaps between steps too)")
    ap.add_argument("--acceptance", type=Path, default=ACCEPTANCE,
                    help="benchmarks/acceptance.py's measurement of the closed loop's prompts (default: "
                         f"{repo_path(ACCEPTANCE)} where it exists, else the profile's acceptance)")
    ap.add_argument("--profile-acceptance", action="store_true",
                    help="the profile's acceptance (measured on the profiler's prompts), not --acceptance")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    real = json.loads(args.real.read_text()) if args.real else None
    path = args.profile or default_profile(real)
    if path is None:
        raise SystemExit("no smollm2-135m--cpu profile shipped; give --profile FILE (`specfleet engine profile`)")
    console, started = Console(width=170), time.time()
    for kind, f in profile_model.load(path).fit.items():
        if f.rel_rms_error > FIT_WARNING:
            console.print(f"[yellow]warning:[/] the profile's {kind} fit misses its own points by "
                          f"{f.rel_rms_error:.0%} (relative RMS)", end="")
            console.print(f"; over {truth.FIT_LIMIT:.0%} the simulator prices {kind} steps by the decode fit"
                          if f.rel_rms_error > truth.FIT_LIMIT else "")
    prompts = dict(zip(("copy-heavy", "open-ended"), args.prompt_tokens))
    trace = (real_trace(real) if real else None) or SIM_TO_REAL.scaled(args.scale)
    hits = prefix_hits(real, prompts) if args.prefix_hit is None else dict(zip(prompts, args.prefix_hit))
    scales = real_scales(real) if real and args.truth == "real-scales" else None
    slowdown = checked_contention(args.contention, args.contention_basis, path) if args.truth == "contention" else None
    accepted = None if args.profile_acceptance else workload_acceptance(args.acceptance)
    sim = simulate(path, tuple(args.modes), tuple(args.seeds), trace, args.interval, args.dwell, prompts, hits,
                   scales, slowdown, accepted)
    print_sim(console, sim)
    result = {**stamp("benchmarks/sim_to_real.py", sys.argv[1:]),
              "profile": repo_path(path),
              "acceptance": repo_path(args.acceptance) if accepted is not None else "profile",
              "prompt_tokens": prompts, "prefix_hit": hits, "truth": args.truth, "truth_scales": scales,
              **({"contention": repo_path(args.contention), "contention_basis": args.contention_basis,
                  "contention_factors": {"clients": slowdown.clients, "off": slowdown.off, "on": slowdown.on}}
                 if slowdown else {}),
              "trace": {"phases": [p.__dict__ for p in trace.phases],
                                                  "max_tokens": trace.max_tokens},
              "seeds": args.seeds, "interval_s": args.interval, "dwell_s": args.dwell, "simulator": sim}
    if real:
        rows = compare(sim, real)
        print_compare(console, rows)
        result.update(real=str(args.real), comparison=rows,
                      within_share=round(sum(bool(r["within"]) for r in rows if r["within"] is not None)
                                         / max(1, sum(r["within"] is not None for r in rows)), 3),
                      within_by_phase=within_by(rows, "phase"), within_by_metric=within_by(rows, "metric"))
        console.print(f"within +-{TOLERANCE:.0%}: {result['within_share']:.0%} of cells; by phase "
                      f"{result['within_by_phase']}; by metric {result['within_by_metric']}", markup=False)
    result["seconds"] = round(time.time() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=float) + "\n")
    console.print(f"wrote {args.out} in {result['seconds']} s")


if __name__ == "__main__":
    main()
