"""`specfleet simulate`: the fleet simulator (`specfleet.sim`) under a scenario or a trace, with the operator's
control policies or a peer baseline. The simulator (and numpy) is imported inside the command."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def simulate_cmd(scenario: Optional[str] = typer.Option(None, "--scenario", "-s",
                                                      help="steady | diurnal | bursty | acceptance-drift"),
                 trace: Optional[Path] = typer.Option(None, "--trace", exists=True, dir_okay=False,
                                                      help="A trace file of `seconds rps` lines."),
                 policy: str = typer.Option("specfleet", "--policy", "-p",
                                            help="specfleet | static-peak | inflight-target | saturation | "
                                                 "spec-always-on | spec-always-off | spec-batch-table"),
                 seed: int = typer.Option(0, help="Random seed of the arrivals."),
                 duration: Optional[float] = typer.Option(None, help="Cut the scenario to this many seconds."),
                 load: float = typer.Option(1.0, help="Multiply the scenario's arrival rate."),
                 replicas: Optional[int] = typer.Option(None, help="A fixed fleet size (isolates speculation)."),
                 startup: Optional[float] = typer.Option(None, help="Pod start-up seconds (default 30)."),
                 min_replicas: Optional[int] = typer.Option(None, "--min-replicas",
                                                            help="Declare another autoscaling.minReplicas."),
                 scale_down: Optional[int] = typer.Option(None, "--scale-down-stabilization",
                                                          help="Declare another autoscaling."
                                                               "scaleDownStabilizationSeconds (default 300)."),
                 queue_policy: Optional[str] = typer.Option(None, "--queue-policy",
                                                            help="Engine queue order, fifo | deadline "
                                                                 "(default: deadline for ours, fifo for peers)."),
                 knob: Optional[list[str]] = typer.Option(None, "--knob",
                                                          help="KEY=VALUE, a peer baseline's setting (repeatable): "
                                                               "inflight-target target_fraction (of maxNumSeqs, "
                                                               "default 0.7), scale_down_delay_s (default 30); "
                                                               "saturation kv_target, queue_target, down_s."),
                 json_out: Optional[Path] = typer.Option(None, "--json", help="Write the result (with the series)."),
                 plot: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG of replicas, load, latency "
                                                                          "(needs matplotlib).")) -> None:
    """Simulate a fleet under a scenario with the operator's control policies (or a peer baseline)."""
    import json

    try:
        from specfleet.sim import report, run, scenarios
    except ModuleNotFoundError as exc:      # no image ships sim/; the operator's has no numpy either
        typer.echo(f"specfleet simulate cannot import the simulator ({exc}): install specfleet from a checkout "
                   "with the dev extra (pip install -e '.[dev]')", err=True)
        raise typer.Exit(1) from exc

    if (scenario is None) == (trace is None):
        raise typer.BadParameter("give --scenario NAME or --trace FILE")
    try:
        sc = scenarios.get(scenario) if scenario else scenarios.from_trace(trace)
        sc = scenarios.adjusted(sc, duration=duration, load=load, startup_s=startup, min_replicas=min_replicas,
                                  scale_down_s=scale_down)
        knobs = _knobs(knob or [])
        result = run.simulate(sc, policy, seed=seed, fixed_replicas=replicas, queue_policy=queue_policy,
                              knobs=knobs or None)
    except (KeyError, ValueError) as exc:
        raise typer.BadParameter(str(exc.args[0] if exc.args else exc)) from exc
    report.print_summary(result)
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result, indent=1, default=float))
    if plot:
        report.plot(result, plot)


def _knobs(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or not key.strip():
            raise ValueError(f"--knob takes KEY=NUMBER, got {pair!r}")
    return out


def register(root: typer.Typer) -> None:
    """`specfleet simulate` sits at the top level."""
    root.command("simulate")(simulate_cmd)
