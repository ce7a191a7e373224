"""`specfleet cluster ...`: the Kubernetes API emulator."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(no_args_is_help=True)


@app.command()
def apiserver(port: int = typer.Option(6443, help="Port to listen on (0: any free port)."),
              kubeconfig: Path = typer.Option(..., help="Where to write a kubeconfig for kubectl and clients."),
              state: Optional[Path] = typer.Option(None, help="JSON file that keeps objects across restarts."),
              host: str = typer.Option("127.0.0.1", help="Address to bind."),
              verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at INFO level.")) -> None:
    """Run the Kubernetes API emulator in the foreground until interrupted."""
    import asyncio
    import logging

    from specfleet.cluster.apiserver.kubeconfig import write_kubeconfig
    from specfleet.cluster.apiserver.server import ApiServer, ServerConfig

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)
    server = ApiServer(ServerConfig(host=host, port=port, state_file=state))

    async def main() -> None:
        task = asyncio.create_task(server.serve())
        await asyncio.get_running_loop().run_in_executor(None, server.ready.wait)
        write_kubeconfig(kubeconfig, server.url)
        typer.echo(f"API emulator at {server.url}; kubeconfig: {kubeconfig}")
        await task

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
