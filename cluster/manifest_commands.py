"""The operator's and the gateway's command lines, read from their Deployments in manifests/ (docs/fleet.md).

`specfleet up` runs what `kubectl apply -k manifests/` runs: `specfleet` (the images' ENTRYPOINT) plus the
container's `args`, with the container's `env` (plain values, and the downward API resolved from the local
stand-in pod's metadata). The files are the installed package's `specfleet.manifests` (manifests/), not a
copy. A laptop changes only what it must, every change listed in `LAPTOP` with its reason; nothing else in
the manifests is rewritten, so an argument or an env var added to a manifest reaches `up` as it is.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib.abc import Traversable

import yaml

from specfleet.cluster import resources

PACKAGE = "specfleet.manifests"
OPERATOR = "operator.yaml"
GATEWAY = "gateway/deployment.yaml"
NODE = "specfleet-local"          # the node agent's Node
POD_SUFFIX = "local-0"            # the local stand-in pod: `<deployment>-local-0`


class ManifestError(ValueError):
    """A Deployment in manifests/ that `up` cannot run as declared."""


@dataclass(frozen=True)
class Workload:
    """One Deployment's first container, as the manifest declares it."""
    name: str                               # the Deployment (the pod is `<name>-local-0`)
    namespace: str
    service_account: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]        # (name, value)
    field_env: tuple[tuple[str, str], ...]  # (name, fieldPath): the downward API

    @property
    def pod(self) -> str:
        return f"{self.name}-{POD_SUFFIX}"


@dataclass(frozen=True)
class Local:
    """What this machine picks where the cluster gives each pod its own network."""
    host: str = "127.0.0.1"      # where `up` listens
    gateway_port: int = 8000     # `up --port`
    liveness_port: int = 0       # the operator's liveness endpoint (a free port)
    metrics_port: int = 0        # the operator's metrics (a free port)
    api_keys: bool = False       # `up --api-key-file` given: `up` created the Secret the gateway names
    prometheus_url: str | None = None   # the fleet's own Prometheus, when `up` runs one


@dataclass(frozen=True)
class Command:
    """`specfleet` + `args`, with `env` on top of this process's environment."""
    args: tuple[str, ...]
    env: dict[str, str]


@dataclass(frozen=True)
class Substitution:
    component: str                                   # "operator" | "gateway"
    target: str                                      # a flag ("--port") or an env var ("$NAME")
    reason: str
    value: Callable[[str | None, Local], str | None]  # the manifest's value (None: not declared) -> here (None: drop)


def _liveness(url: str | None, local: Local) -> str | None:
    if url is None:
        return None
    scheme, _, rest = url.partition("://")
    path = rest[rest.find("/"):] if "/" in rest else ""
    return f"{scheme}://{local.host}:{local.liveness_port}{path}"


LAPTOP: tuple[Substitution, ...] = (
    Substitution("operator", "--liveness", "the pod's 0.0.0.0:8080 is its own on a cluster; here it is this "
                 "machine's loopback at a free port", _liveness),
    Substitution("operator", "$SPECFLEET_METRICS_PORT", "the pod's own port 9090 on a cluster; here a free port "
                 "of this machine (it listens on every address: the operator has no address setting)",
                 lambda v, local: None if v is None else str(local.metrics_port)),
    Substitution("operator", "$SPECFLEET_PROMETHEUS_URL", "a cluster names its own Prometheus (the manifest "
                 "leaves it empty: scrape each pod); here the fleet's Prometheus when `up` runs one",
                 lambda v, local: local.prometheus_url or v),
    Substitution("gateway", "--port", "the pod's 8000 sits behind the Service's port 80 on a cluster; here "
                 "the gateway is the front door itself, at `up --port`", lambda v, local: str(local.gateway_port)),
    Substitution("gateway", "--host", "a pod listens on every address of its own network (0.0.0.0, `gateway "
                 "run`'s default); here it stays on `up`'s loopback address", lambda v, local: local.host),
    Substitution("gateway", "--api-key-secret", "a cluster keeps the door locked by that Secret; `up` creates it "
                 "from `--api-key-file`, and without key files the local door is open (the flag dropped)",
                 lambda v, local: v if local.api_keys else None),
)


# -- reading a Deployment (pure) ---------------------------------------------------------------------------
def read_workload(text: str) -> Workload:
    """The Deployment in `text` (one YAML document) -> its first container's args and env."""
    doc = yaml.safe_load(text)
    if not isinstance(doc, dict) or doc.get("kind") != "Deployment":
        raise ManifestError("expected one Deployment")
    pod = doc["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env, field_env = [], []
    for var in container.get("env") or []:
        source = var.get("valueFrom")
        if source is None:
            env.append((var["name"], str(var.get("value", ""))))
        elif "fieldRef" in source:
            field_env.append((var["name"], source["fieldRef"]["fieldPath"]))
        else:
            raise ManifestError(f"env {var['name']}: only value and fieldRef are run locally, not {sorted(source)}")
    meta = doc["metadata"]
    return Workload(meta["name"], meta.get("namespace", "default"), pod.get("serviceAccountName", "default"),
                    tuple(str(a) for a in container.get("args") or ()), tuple(env), tuple(field_env))


def downward(field_path: str, workload: Workload, local: Local) -> str:
    """The value the downward API gives the local stand-in pod for `fieldPath`."""
    values = {"metadata.name": workload.pod, "metadata.namespace": workload.namespace,
              "spec.serviceAccountName": workload.service_account, "spec.nodeName": NODE,
              "status.podIP": local.host, "status.hostIP": local.host}
    if field_path not in values:
        raise ManifestError(f"{workload.name}: the downward API field {field_path!r} is not run locally")
    return values[field_path]


def local_command(component: str, workload: Workload, local: Local) -> Command:
    """The manifest's command line with `LAPTOP`'s substitutions for `component` applied, and nothing else."""
    args = list(workload.args)
    env = dict(workload.env)
    env.update({name: downward(path, workload, local) for name, path in workload.field_env})
    for sub in (s for s in LAPTOP if s.component == component):
        if sub.target.startswith("$"):
            name = sub.target[1:]
            new = sub.value(env.pop(name, None), local)
            if new is not None:
                env[name] = new
        else:
            args = _substitute_flag(args, sub.target, sub.value, local)
    return Command(tuple(args), env)


def _locate(args: tuple[str, ...] | list[str], flag: str) -> tuple[int, int, str | None]:
    """(index, tokens taken, value) of `flag VALUE` or `flag=VALUE` in args; (len(args), 0, None) if absent."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return i, 2, args[i + 1]
        if arg.startswith(flag + "="):
            return i, 1, arg.split("=", 1)[1]
    return len(args), 0, None


def flag_value(args: tuple[str, ...] | list[str], flag: str) -> str | None:
    return _locate(args, flag)[2]


def kept_args(component: str, args: tuple[str, ...] | list[str]) -> list[str]:
    """`args` without the flags `LAPTOP` substitutes for `component`: what `up` passes through unchanged, so
    equal for the manifest's args and the command line `up` runs."""
    flags = {s.target for s in LAPTOP if s.component == component and s.target.startswith("--")}
    out, i = [], 0
    while i < len(args):
        if args[i] in flags:
            i += 2
            continue
        if args[i].split("=", 1)[0] not in flags:
            out.append(args[i])
        i += 1
    return out


def _substitute_flag(args: list[str], flag: str, value: Callable[[str | None, Local], str | None],
                     local: Local) -> list[str]:
    """args with `flag VALUE` (or `flag=VALUE`) replaced in place, appended, or dropped, as `value` decides."""
    i, span, old = _locate(args, flag)
    new = value(old, local)
    return args[:i] + ([] if new is None else [flag, new]) + args[i + span:]


# -- the installed manifests -------------------------------------------------------------------------------
def manifest(relative: str) -> Traversable:
    return resources.data_file(PACKAGE, relative)


def workload(relative: str) -> Workload:
    """A Deployment of the installed manifests (OPERATOR or GATEWAY)."""
    return read_workload(manifest(relative).read_text(encoding="utf-8"))


def operator_command(local: Local) -> Command:
    return local_command("operator", workload(OPERATOR), local)


def gateway_command(local: Local) -> Command:
    return local_command("gateway", workload(GATEWAY), local)
