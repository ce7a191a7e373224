"""`specfleet operator ...` and `specfleet plan`: the operator's commands (`specfleet simulate` is cli/sim_cmds.py).

Heavy imports (kopf, kubernetes) happen inside the commands.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(no_args_is_help=True)


@app.callback()
def _operator() -> None:
    """The InferenceService operator."""


@app.command("run")
def run(namespace: list[str] = typer.Option([], "--namespace", "-n", help="Namespace to watch (repeatable)."),
        all_namespaces: bool = typer.Option(False, "--all-namespaces", "-A", help="Watch every namespace."),
        liveness: Optional[str] = typer.Option(None, help="Liveness endpoint, e.g. http://0.0.0.0:8080/healthz"),
        verbose: bool = typer.Option(False, "--verbose", "-v"),
        leader_elect: bool = typer.Option(False, "--leader-elect",
                                          help="Act only while holding a coordination.k8s.io Lease (replicas > 1); "
                                               "identity from $POD_NAME, else hostname_pid."),
        lease_name: str = typer.Option("specfleet-operator", "--lease-name", help="The Lease's name."),
        lease_namespace: Optional[str] = typer.Option(None, "--lease-namespace",
                                                      help="The Lease's namespace (default: $POD_NAMESPACE, "
                                                           "else specfleet-system)."),
        lease_duration: int = typer.Option(15, "--lease-duration", min=1,
                                           help="Seconds a follower waits after the last renewal it saw."),
        renew_deadline: float = typer.Option(10.0, "--renew-deadline",
                                             help="Seconds without a renewal after which the leader exits."),
        retry_period: float = typer.Option(2.0, "--retry-period",
                                           help="Seconds between attempts to acquire or renew."),
        prometheus_url: Optional[str] = typer.Option(None, "--prometheus-url", envvar="SPECFLEET_PROMETHEUS_URL",
                                                     help="Read engine metrics from this Prometheus (one query per "
                                                          "interval for the fleet; pods it lacks are scraped "
                                                          "directly). Default: scrape each pod.")) -> None:
    """Run the operator (kopf, standalone) against the cluster in KUBECONFIG or in-cluster config."""
    if bool(namespace) == all_namespaces:
        raise typer.BadParameter("give --namespace NS (one or more) or --all-namespaces")
    if prometheus_url:
        if not prometheus_url.startswith(("http://", "https://")):
            raise typer.BadParameter(f"--prometheus-url must be an http(s) URL, got {prometheus_url!r}")
        os.environ["SPECFLEET_PROMETHEUS_URL"] = prometheus_url      # read with the loop's other settings
    from specfleet.operator import leader
    from specfleet.operator.main import identity_from_environment, lease_namespace_from_environment
    from specfleet.operator.main import run as run_operator

    election = None
    if leader_elect:
        try:
            election = leader.ElectionConfig(identity_from_environment(), lease_name,
                                             lease_namespace_from_environment(lease_namespace), lease_duration,
                                             renew_deadline, retry_period)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from exc
    run_operator(namespaces=namespace, clusterwide=all_namespaces, liveness=liveness, verbose=verbose,
                 election=election)


def plan_cmd(file: Path = typer.Option(..., "--file", "-f", exists=True, dir_okay=False,
                                       help="An InferenceService manifest."),
             output: str = typer.Option("table", "--output", "-o", help="table | yaml"),
             profiles: Optional[Path] = typer.Option(None, "--profiles", exists=True, file_okay=False,
                                                     help="A folder of <model>--<accelerator>.json profiles to "
                                                          "plan with (default: the packaged catalogue).")) -> None:
    """Print the plan for an InferenceService, without a cluster."""
    import yaml

    from specfleet.operator import api, catalogs, model_folder, planner, render, status

    docs = [d for d in yaml.safe_load_all(file.read_text()) if d and d.get("kind") == api.KIND]
    if not docs:
        raise typer.BadParameter(f"no {api.KIND} in {file}")
    failed = False
    for doc in docs:
        name = doc.get("metadata", {}).get("name", "unnamed")
        try:
            spec = api.parse_spec(doc.get("spec") or {})
        except api.SpecError as exc:
            typer.echo(f"{name}: invalid spec: {exc}", err=True)
            failed = True
            continue
        spec = model_folder.with_folder_architecture(spec, catalogs.models())
        result = planner.plan(spec, catalogs.gpus(), catalogs.models(),
                              catalogs.profiles(str(profiles) if profiles else None))
        failed |= isinstance(result, planner.Infeasible)
        if output == "yaml":
            typer.echo(yaml.safe_dump(_as_yaml(name, doc, spec, result, render, status), sort_keys=False))
        else:
            _print_table(name, spec, result)
    raise typer.Exit(1 if failed else 0)


def _as_yaml(name, doc, spec, result, render, status) -> dict:
    from specfleet.operator import planner

    if isinstance(result, planner.Infeasible):
        return {"name": name, "infeasible": {"reason": result.reason, "message": result.message,
                                             "closest": result.closest}}
    namespace = doc.get("metadata", {}).get("namespace", "default")
    deployment = render.render(name, namespace, spec, result)[0]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {"name": name, "plan": status.plan_dict(result), "calibration": status.calibration_dict(result.calibration),
            "replicas": result.replicas,
            "warnings": list(result.warnings), "command": container["command"] + container["args"]}


def _print_table(name, spec, result) -> None:
    from rich.console import Console
    from rich.table import Table

    from specfleet.operator import planner, status

    console = Console()
    if isinstance(result, planner.Infeasible):
        console.print(f"[bold red]{name}: infeasible ({result.reason})[/] {result.message}")
        for key, value in result.closest.items():
            console.print(f"  closest feasible {key}: {value:g}")
        return
    table = Table(title=f"{name}: {spec.model.name} on {spec.accelerator.type} ({spec.runtime.engine})")
    table.add_column("field")
    table.add_column("value", justify="right")
    sp, pr = result.speculation, result.predicted
    rows = [("GPUs per replica / TP", f"{result.gpus_per_replica} / {result.tensor_parallel_size}"),
            ("weights", f"{result.weights_bytes / 1e9:.1f} GB"),
            ("KV per token", f"{result.kv_bytes_per_token / 1024:g} KiB"),
            ("KV blocks x block size", f"{result.kv_cache_blocks} x {result.block_size}"),
            ("max num seqs", str(result.max_num_seqs)),
            ("max num batched tokens", str(result.max_num_batched_tokens)),
            ("speculation", f"{'on' if sp.enabled else 'off'} ({sp.method or 'none'}, k={sp.k})"),
            ("max batch for speculation", str(pr.max_batch_for_speculation)),
            ("predicted TTFT p99", f"{pr.ttft_p99_ms:g} ms (target {spec.slo.ttft_p99_ms:g})"),
            ("predicted ITL p99", f"{pr.itl_p99_ms:g} ms (target {spec.slo.itl_p99_ms:g})"),
            ("tokens/s per replica", f"{pr.tokens_per_second_per_replica:g}"),
            ("replicas", str(result.replicas)),
            ("step costs", _cost_source(result.calibration))]
    if result.calibration.reason and result.calibration.source != "roofline":
        rows.append(("step cost note", result.calibration.reason))
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/] {warning}")
    if result.calibration.refused:
        console.print(f"[yellow]warning:[/] {status.profile_refused(result)}", soft_wrap=True)


def _cost_source(source) -> str:
    """`profile smollm2-135m--cpu, fit error 4.1%` or `roofline (no profile for ...)`."""
    if source.source == "roofline":
        return f"roofline ({source.reason})" if source.reason else "roofline"
    error = "" if source.fit_error is None else f", fit error {source.fit_error:.1%}"
    return f"{source.source} {source.profile or ''}{error}".replace("  ", " ")


def register_top_level(root: typer.Typer) -> None:
    """Commands that sit at the top level (`specfleet plan`)."""
    root.command("plan")(plan_cmd)
