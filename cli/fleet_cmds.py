"""`specfleet up`, `down`, `status`: a whole fleet on one machine (docs/fleet.md).

Heavy imports (torch, kopf) stay out: `up` runs the engines and the operator as subprocesses.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

STATE_HELP = "State folder: kubeconfig, logs, pids, pod volumes."


def up(file: list[Path] = typer.Option([], "--file", "-f", help="InferenceService manifest(s) "
                                       "(default: the built-in SmolLM2 on cpu)."),
       port: int = typer.Option(8000, help="Gateway port (OpenAI API at http://127.0.0.1:PORT/v1)."),
       load: Optional[str] = typer.Option(None, help="Drive a built-in load profile: ramp, spike or steady."),
       state_dir: Path = typer.Option(Path(".specfleet"), help=STATE_HELP),
       live: Optional[bool] = typer.Option(None, "--live/--plain", help="Live status table (default: when "
                                           "stdout is a terminal) or plain log lines."),
       node_cpus: Optional[float] = typer.Option(None, envvar="SPECFLEET_NODE_CPUS", help="CPUs the local "
                                                 "node offers pods (default: this machine's)."),
       node_memory: Optional[str] = typer.Option(None, envvar="SPECFLEET_NODE_MEMORY", help="Memory the local "
                                                 "node offers pods, e.g. 16Gi (default: this machine's)."),
       api_key_file: list[Path] = typer.Option([], help="File of API keys, one per line (repeatable): the "
                                               "gateway then answers only 'Authorization: Bearer KEY'."),
       prometheus: Optional[bool] = typer.Option(None, "--prometheus/--no-prometheus", help="Run a Prometheus "
                                                 "the control loop reads (default: when `prometheus` is on PATH).")
       ) -> None:
    """Start the API emulator, operator, node agent and gateway; serve until Ctrl-C (or SIGTERM, SIGHUP)."""
    from specfleet.cluster import fleet

    config = fleet.FleetConfig(files=list(file), port=port, state_dir=state_dir, load=load, live=live,
                               node_cpus=node_cpus, node_memory=node_memory,
                               api_key_files=list(api_key_file), prometheus=prometheus)
    try:
        lock, docs = fleet.preflight(config)
        with lock:
            code = fleet.Fleet(config, docs).run()
    except fleet.FleetError as exc:
        typer.echo(f"specfleet up: {exc}", err=True)
        raise typer.Exit(1)
    raise typer.Exit(code)


def down(state_dir: Path = typer.Option(Path(".specfleet"), help=STATE_HELP)) -> None:
    """Stop the fleet that `specfleet up` runs from this folder (and any process it left behind)."""
    from specfleet.cluster import fleet

    typer.echo(fleet.down(state_dir))


def status(state_dir: Path = typer.Option(Path(".specfleet"), help=STATE_HELP)) -> None:
    """One snapshot of the fleet: InferenceServices, pods, gateway."""
    from rich.console import Console

    from specfleet.cluster import fleet

    view = fleet.status(state_dir)
    if view is None:
        typer.echo(f"specfleet is not running in {state_dir}", err=True)
        raise typer.Exit(1)
    Console().print(view)


def register(root: typer.Typer) -> None:
    root.command("up")(up)
    root.command("down")(down)
    root.command("status")(status)
