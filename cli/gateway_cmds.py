"""`specfleet gateway run`: the fleet's front door on a cluster (docs/gateway.md).

The very `Gateway` that `specfleet up` runs, here against a real API server (in-cluster service account
or a kubeconfig). On SIGTERM it turns unready, lets in-flight and held requests finish for up to
`--drain-timeout`, then exits 0.
"""
from __future__ import annotations

import asyncio
import os
import signal
import socket
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False)


@app.command("run")
def run(host: str = typer.Option("0.0.0.0", help="Listen address."),
        port: int = typer.Option(8000, help="Listen port (OpenAI API at /v1, metrics at /metrics)."),
        namespace: list[str] = typer.Option([], "--namespace", "-n", help="Route the InferenceServices of this "
                                            "namespace (repeatable; default: all namespaces)."),
        kubeconfig: Optional[Path] = typer.Option(None, envvar="KUBECONFIG", help="Kubeconfig (default: "
                                                  "in-cluster service account)."),
        max_held: int = typer.Option(64, help="Requests held per service while it has no ready replica."),
        hold_timeout: float = typer.Option(120.0, help="Seconds a request may wait for a ready replica."),
        retry_after: int = typer.Option(5, help="Retry-After seconds on a 503 for a full or timed-out hold."),
        api_key_file: list[Path] = typer.Option([], help="File of API keys, one per line (repeatable)."),
        api_key_secret: Optional[str] = typer.Option(None, help="NAMESPACE/NAME of a Secret whose values are "
                                                     "API keys (watched: a change applies at once)."),
        gateway_id: str = typer.Option("", envvar="POD_NAME", help="This replica's name in the held-requests "
                                       "annotation (default: the host name)."),
        announce_held: bool = typer.Option(True, "--announce-held/--no-announce-held", help="Annotate "
                                           "InferenceServices with their held requests (scale from zero)."),
        drain_timeout: float = typer.Option(25.0, help="Seconds to finish requests after SIGTERM.")) -> None:
    """Serve the OpenAI API in front of every InferenceService's ready pods."""
    from specfleet.cluster.gateway import GatewayConfig
    from specfleet.cluster.gateway.connect import connect
    from specfleet.cluster.gateway.keys import ApiKeys

    try:
        connection = connect(str(kubeconfig) if kubeconfig else None)
        keys = ApiKeys.from_flags([str(p) for p in api_key_file], api_key_secret)
        config = GatewayConfig(host=host, port=port, namespaces=list(namespace) or None, max_held=max_held,
                               hold_timeout_s=hold_timeout, retry_after_s=retry_after, api_keys=keys,
                               gateway_id=gateway_id or socket.gethostname(), announce_held=announce_held)
    except (OSError, ValueError) as exc:
        typer.echo(f"specfleet gateway: {exc}", err=True)
        raise typer.Exit(2)
    raise typer.Exit(asyncio.run(_serve(connection, config, drain_timeout)))


async def _serve(connection, config, drain_timeout: float) -> int:
    from specfleet.cluster.gateway import Gateway

    gateway = Gateway(connection, config)
    try:
        await gateway.start()
    except OSError as exc:
        typer.echo(f"specfleet gateway: cannot listen on {config.host}:{config.port}: {exc}", err=True)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    typer.echo(f"specfleet gateway on http://{config.host}:{config.port}/v1 (API {connection.url}, pid {os.getpid()})")
    await stop.wait()
    await gateway.drain(drain_timeout)
    await gateway.stop()
    return 0
