"""Contention calibration: how much slower the real engine steps than its profile predicts, per client count.

The engine profile (`--profile`; by default the shipped SmolLM2-135M CPU profile measured on this CPU, else
the pair's own, operator/catalogs/profiles/smollm2-135m--cpu.json) was measured with nothing else running;
under `specfleet up` the engine shares the machine's cores with the gateway, the operator, the API emulator
and the load generator's clients. This benchmark measures that, from its own inputs (fixed client counts,
never the closed-loop run's answers), for the fleet simulator (sim/contention.py).

For each speculation state (spec.speculation.mode on, off) it starts `specfleet up` exactly as
benchmarks/closed_loop.py does (same CR, one fixed replica, same control interval and dwell, same
closed-loop client code: `closed_loop.run_clients`), then holds each client count (1, 2, 4, 8, 16, 24 by
default) for a short steady phase of copy-heavy prompts, and at 8 clients one of open-ended prompts first
(benchmarks/speculation.py's, as the closed loop's trace sends them). Once a second it scrapes the pod's
/metrics (parsed by the operator's own parser). Over each phase, after `--settle` seconds, each
batch-size bucket of the engine's step-time summary (`specfleet:step_duration_seconds`, with
`specfleet:step_seqs` and `specfleet:step_tokens`) gives the steps, their mean batch, tokens and time.
The simulator's truth (`sim.truth.ProfileTruth` at the service's context, as sim/replay.py builds it)
prices the same steps: a decode step's tokens (prompt tokens included) by the decode fit, a verifying
step's by the verify fit, over the mean tokens per sequence the bucket computed. Per phase:

    step factor   = measured step seconds / predicted step seconds   (summed over the phase's steps)
    period factor = phase seconds / predicted step seconds            (time between steps counts too)

and the mean time to first token of the phase's requests as the clients saw it and as the engine timed
it (`ttft_means`: what the path outside the engine's step loop adds, which no step factor slows);
and per (client count, speculation state) the same sums over its phases; with `--repeats`, the median over
repeats (a fresh fleet each, the states alternating) and the range. The simulator scales its
step times by the step factor at the clients in flight (linear between counts, clamped outside).

    .venv/bin/python benchmarks/contention.py                          # ~6 min; writes results/contention.json
    .venv/bin/python benchmarks/contention.py --counts 1 4 --seconds 6 --settle 2 --out /tmp/c.json   # quick
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

import closed_loop                               # benchmarks/closed_loop.py: the same fleet and clients
from provenance import repo_path, stamp          # benchmarks/provenance.py: command, commit, machine, date

from specfleet.engine.host import this_host
from specfleet.operator.control.scrape import parse_exposition
from specfleet.operator.control.window import TTFT, Scrape, StepStat, build_window
from specfleet.sim.replay import service_spec
from specfleet.sim.run import setup_spec
from specfleet.sim.trace import Phase, Trace
from specfleet.sim.truth import ProfileTruth, find_profile

OUT = Path(__file__).parent / "results" / "contention.json"
COUNTS = (1, 2, 4, 8, 16, 24)
STATES = {"off": "off", "on": "on"}       # speculation state -> spec.speculation.mode


@dataclass(frozen=True)
class Settings:
    counts: tuple[int, ...] = COUNTS
    seconds: float = 16.0               # per (count, workload) phase: a request or more per client at 24
    settle_s: float = 4.0               # left out at each phase's start (clients joining, the last ones leaving)
    states: tuple[str, ...] = ("off", "on")
    open_ended_at: tuple[int, ...] = (8,)    # counts held with open-ended prompts too (the trace's last phase)
    port: int = 8795
    seed: int = 0


def calibration_trace(s: Settings) -> Trace:
    """Fixed client counts, ascending, each held with copy-heavy prompts, preceded by open-ended ones at
    the counts `open_ended_at` names (so the clients only ever grow in number)."""
    workloads = lambda c: ("open-ended", "copy-heavy") if c in s.open_ended_at else ("copy-heavy",)  # noqa: E731
    return Trace(tuple(Phase(f"{w}@{c}", w, s.seconds, c, c) for c in s.counts for w in workloads(c)),
                 max_tokens=closed_loop.SIM_TO_REAL.max_tokens)


# -- measuring --------------------------------------------------------------------------------------------
class Sampler(threading.Thread):
    """The pod's /metrics once a second, as the operator parses them (time: seconds since `t0`)."""

    def __init__(self, url: str, t0: float):
        super().__init__(daemon=True)
        self.url, self.t0 = url, t0
        self.scrapes: list[Scrape] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                with urllib.request.urlopen(self.url + "/metrics", timeout=5) as response:
                    text = response.read().decode()
                self.scrapes.append(parse_exposition(text, time.monotonic() - self.t0))
            except OSError:
                pass               # a missed sample; the next is a second away
            self.halt.wait(1.0)


def steps_between(scrapes: list[Scrape], start: float, end: float) -> tuple[tuple[StepStat, ...], float] | None:
    """The engine's steps (per batch-size bucket) between the first scrape at or after `start` and the last
    at or before `end`, and the seconds between those scrapes."""
    inside = [s for s in scrapes if start <= s.time <= end]
    if len(inside) < 2:
        return None
    window = build_window({"pod": inside[0]}, {"pod": inside[-1]}, expected=1)
    return (window.steps, window.seconds) if window is not None else None


def ttft_means(scrapes: list[Scrape], requests: list, start: float, end: float) -> dict:
    """Mean time to first token of the requests sent between `start` and `end`: as the clients saw it (through
    the gateway, to the first streamed text) and as the engine timed it (`vllm:time_to_first_token_seconds`,
    from its HTTP handler to the token's publication), over the same scrapes as the steps. Their difference
    is what the path outside the engine's step loop adds, which a step factor does not slow."""
    sent = [r.ttft_s for r in requests if start <= r.start < end and r.ttft_s is not None and not r.error]
    inside = [s for s in scrapes if start <= s.time <= end and TTFT in s.histograms]
    engine = inside[-1].histograms[TTFT].minus(inside[0].histograms[TTFT]) if len(inside) >= 2 else None
    return {"ttft_client_ms": _r(statistics.fmean(sent) * 1000 if sent else None, 1), "ttft_requests": len(sent),
            "ttft_engine_ms": _r(engine.sum / engine.count * 1000 if engine and engine.count else None, 1)}


def predicted_seconds(truth: ProfileTruth, step: StepStat) -> float:
    """The truth's time for one mean step of a bucket: its tokens per sequence over one forward pass (the
    verify fit while speculating, else the decode fit)."""
    per_seq = (step.tokens or step.batch) / step.batch
    fit = truth.fit("verify") if step.speculating else truth.profile.fit["decode"]
    return float(fit.seconds(step.batch, truth.ctx, per_seq))


def phase_row(truth: ProfileTruth, steps: tuple[StepStat, ...], seconds: float) -> dict:
    """Measured against predicted over one phase's steps."""
    count = sum(s.steps for s in steps)
    measured = sum(s.steps * s.seconds for s in steps)
    predicted = sum(s.steps * predicted_seconds(truth, s) for s in steps)
    batch = sum(s.steps * s.batch for s in steps) / count if count else None
    tokens = sum(s.steps * (s.tokens or s.batch) for s in steps) / count if count else None
    return {"seconds": round(seconds, 2), "steps": round(count), "batch_mean": _r(batch), "tokens_per_step": _r(tokens),
            "measured_step_ms": _r(measured / count * 1000 if count else None),
            "predicted_step_ms": _r(predicted / count * 1000 if count else None),
            "busy_share": _r(measured / seconds if seconds else None),
            "step_factor": _r(measured / predicted if predicted else None),
            "period_factor": _r(seconds / predicted if predicted else None),
            "_sums": (measured, predicted, seconds)}


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def run_state(state: str, s: Settings, truth: ProfileTruth, progress=None) -> dict:
    """One `specfleet up` with speculation `state`; a row per (client count, workload) phase."""
    doc = closed_loop.manifest(STATES[state])
    trace = calibration_trace(s)
    settings = closed_loop.Settings(trace, (STATES[state],), port=s.port, seed=s.seed)
    with closed_loop.fleet_up(doc, settings) as fleet:
        url, _ = fleet.pod()
        t0 = time.monotonic()
        sampler = Sampler(url, t0)
        sampler.start()
        task = progress.add_task(state, total=trace.duration) if progress else None
        tick = (lambda t: progress.update(task, completed=t)) if progress else (lambda t: None)
        requests = closed_loop.run_clients(fleet, trace, s.seed, t0, tick)
        sampler.halt.set()
        sampler.join(10)
    rows = {}
    for (name, start, end), phase in zip(trace.bounds(), trace.phases):
        found = steps_between(sampler.scrapes, start + s.settle_s, end)
        rows[name] = {"clients": phase.clients_to, "workload": phase.workload,
                      **(phase_row(truth, *found) if found else {"steps": 0}),
                      **ttft_means(sampler.scrapes, requests, start + s.settle_s, end)}
    return {"phases": rows, "requests": len(requests), "failed": sum(1 for r in requests if r.error)}


def count_factors(run: dict) -> dict[int, tuple[float, float]]:
    """Per client count of one run: (step factor, period factor) over its phases (both workloads)."""
    per: dict[int, list[float]] = {}
    for row in run["phases"].values():
        if "_sums" in row:
            acc = per.setdefault(row["clients"], [0.0, 0.0, 0.0])
            for i, v in enumerate(row["_sums"]):
                acc[i] += v
    return {c: (m / p, t / p) for c, (m, p, t) in sorted(per.items()) if p > 0}


def factors(runs: dict[str, list[dict]]) -> dict:
    """Per speculation state, per client count: the median step and period factors over the repeats, and
    their range."""
    out = {}
    for state, repeats in runs.items():
        each = [count_factors(run) for run in repeats]
        counts = sorted(set().union(*each))
        out[state] = {}
        for c in counts:
            steps, periods = [f[c][0] for f in each if c in f], [f[c][1] for f in each if c in f]
            out[state][str(c)] = {"step_factor": round(statistics.median(steps), 3),
                                  "period_factor": round(statistics.median(periods), 3),
                                  "step_factor_range": [round(min(steps), 3), round(max(steps), 3)]}
    return out


def strip(runs: dict[str, list[dict]]) -> dict:
    return {state: [{**run, "phases": {n: {k: v for k, v in row.items() if k != "_sums"}
                                       for n, row in run["phases"].items()}} for run in repeats]
            for state, repeats in runs.items()}


# -- report ----------------------------------------------------------------------------------------------------
def print_report(console: Console, runs: dict, summary: dict) -> None:
    t = Table(title="engine step time under `specfleet up` vs the profile (SmolLM2-135M, 1 CPU replica)")
    for c in ("spec", "repeat", "clients", "workload", "steps", "batch", "tokens/step", "measured ms", "profile ms",
              "busy", "step factor", "period factor"):
        t.add_column(c, justify="right")
    for state, repeats in runs.items():
        for r, row in ((r, row) for r, run in enumerate(repeats, 1) for row in run["phases"].values()):
            t.add_row(state, str(r), str(row["clients"]), row["workload"], str(row.get("steps", 0)),
                      *(_cell(row.get(k)) for k in ("batch_mean", "tokens_per_step", "measured_step_ms",
                                                    "predicted_step_ms", "busy_share", "step_factor", "period_factor")))
    console.print(t)
    f = Table(title="slowdown factor per client count (all its phases' steps; median over repeats, range in brackets)")
    f.add_column("clients", justify="right")
    for state in summary:
        f.add_column(f"{state}: step", justify="right")
        f.add_column(f"{state}: period", justify="right")
    counts = sorted({int(c) for v in summary.values() for c in v})
    for c in counts:
        cells = []
        for v in summary.values():
            x = v.get(str(c), {})
            lo, hi = x.get("step_factor_range") or (None, None)
            cells += [_cell(x.get("step_factor")) + (f" [{lo:g}–{hi:g}]" if lo != hi else ""),
                      _cell(x.get("period_factor"))]
        f.add_row(str(c), *cells)
    console.print(f)


def _cell(v) -> str:
    return "-" if v is None else f"{v:g}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--counts", type=int, nargs="*", default=list(COUNTS), help="client counts, held in turn")
    ap.add_argument("--seconds", type=float, default=Settings.seconds, help="seconds per (count, workload) phase")
    ap.add_argument("--settle", type=float, default=Settings.settle_s, help="seconds left out at each phase's start")
    ap.add_argument("--states", nargs="*", default=["off", "on"], choices=list(STATES), help="speculation states")
    ap.add_argument("--open-ended-at", type=int, nargs="*", default=list(Settings.open_ended_at),
                    help="client counts also held with open-ended prompts (copy-heavy at every count)")
    ap.add_argument("--repeats", type=int, default=1, help="sweeps per state (a fresh fleet each); factors are "
                    "the median over them")
    ap.add_argument("--port", type=int, default=Settings.port)
    ap.add_argument("--profile", type=Path, help="the profile the factors are measured against (default: the "
                    "shipped smollm2-135m--cpu one measured on this CPU, else the pair's own)")
    ap.add_argument("--notes", default="", help="a line about the machine's state during the run")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if not args.counts or min(args.counts) < 1 or args.seconds <= args.settle or args.repeats < 1:
        ap.error("--counts must be >= 1, --seconds > --settle and --repeats >= 1")
    s = Settings(tuple(sorted(set(args.counts))), args.seconds, args.settle, tuple(args.states),
                 tuple(args.open_ended_at), args.port)
    profile = args.profile or find_profile("smollm2-135m", "cpu", host=this_host())
    _, _, _, truth = setup_spec(service_spec(closed_loop.manifest("auto")["spec"], "auto"), profile)
    from rich.progress import BarColumn, Progress, TextColumn
    console, started = Console(width=150), time.time()
    with Progress(TextColumn("{task.description:>4}"), BarColumn(), TextColumn("{task.completed:>5.0f} s")) as p:
        runs: dict[str, list[dict]] = {state: [] for state in s.states}
        for _ in range(args.repeats):          # the states alternate, so a slow spell of the host hits both
            for state in s.states:
                runs[state].append(run_state(state, s, truth, p))
    summary = factors(runs)
    runs = strip(runs)
    print_report(console, runs, summary)
    result = {**stamp("benchmarks/contention.py", [shlex.quote(a) for a in sys.argv[1:]]),
              "notes": args.notes, "profile": truth.source, "profile_file": repo_path(profile),
              "truth_ctx": truth.ctx, "token_budget": truth.chunk,
              "config": {"counts": list(s.counts), "seconds": s.seconds, "settle_s": s.settle_s,
                         "open_ended_at": list(s.open_ended_at), "max_tokens": closed_loop.SIM_TO_REAL.max_tokens,
                         "manifest": str(closed_loop.EXAMPLE.relative_to(closed_loop.ROOT)), "replicas": 1,
                         "repeats": args.repeats},
              "factors": summary, "runs": runs, "seconds": round(time.time() - started, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    console.print(f"wrote {args.out} in {result['seconds']} s")


if __name__ == "__main__":
    main()
