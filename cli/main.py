"""Entry point of the `specfleet` command.

Each part of the project owns a module of subcommands; this module only assembles them. Heavy imports
(torch, kopf) happen inside the commands, so `specfleet --help` stays fast and torch-free.
"""
from __future__ import annotations

import typer

from specfleet.cli import bench_cmds, cluster_cmds, engine_cmds, operator_cmds
from specfleet.cli import fleet_cmds, gateway_cmds, sim_cmds

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Serve LLMs on Kubernetes under declared latency SLOs.")
app.add_typer(engine_cmds.app, name="engine", help="Run the inference engine.")
app.add_typer(operator_cmds.app, name="operator", help="Run the Kubernetes operator.")
app.add_typer(cluster_cmds.app, name="cluster", help="Kubernetes API emulator for tests and local fleets.")
app.add_typer(bench_cmds.app, name="bench", help="Load-test an OpenAI-compatible server.")
app.add_typer(gateway_cmds.app, name="gateway", help="Run the gateway: the OpenAI front door of every InferenceService.")
operator_cmds.register_top_level(app)
sim_cmds.register(app)
fleet_cmds.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
