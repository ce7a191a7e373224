"""A pod's volumes, env and command line, translated for a local process (no containers, no images).

Each volume becomes a local folder (emptyDir: a fresh folder under the pod's state folder; secret and
configMap: their keys written as files; hostPath: the path itself), and every path that starts with a
mount path, in args, command and env values, is rewritten to that folder. A server the agent knows
(`specfleet engine serve`, `vllm serve`) is told to listen on the pod's own address. All pure but
`write_keys`, which writes the files.
"""
from __future__ import annotations

import base64
import os
import shutil
import sys
from pathlib import Path

UNSUPPORTED = ("persistentVolumeClaim", "csi", "ephemeral", "nfs", "iscsi")


class PodConfigError(Exception):
    """The pod cannot run here (an unsupported volume, a missing Secret key): reason + message."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def volume_source(volume: dict) -> tuple[str, dict]:
    kind = next((k for k in volume if k != "name"), "emptyDir")
    return kind, volume.get(kind) or {}


def mount_map(pod_spec: dict, container: dict, volume_dirs: dict[str, Path]) -> list[tuple[str, str]]:
    """(mountPath, local path) pairs of one container, longest mount path first."""
    pairs = []
    for mount in container.get("volumeMounts") or []:
        local = volume_dirs.get(mount["name"])
        if local is None:
            raise PodConfigError("CreateContainerConfigError", f"volume {mount['name']!r} is not defined")
        if mount.get("subPath"):
            local = local / mount["subPath"]
        pairs.append((mount["mountPath"].rstrip("/") or "/", str(local)))
    return sorted(pairs, key=lambda p: -len(p[0]))


def translate(value: str, mounts: list[tuple[str, str]]) -> str:
    """`value` with a leading mount path replaced by its local folder (also after `--flag=`)."""
    if value.startswith("-") and "=" in value:
        flag, _, rest = value.partition("=")
        return f"{flag}={translate(rest, mounts)}"
    for mount_path, local in mounts:
        if value == mount_path or value.startswith(mount_path + "/"):
            return local + value[len(mount_path):]
    return value


def executable(command: list[str]) -> list[str]:
    """The container's command as a local argv: `specfleet` is this installation's CLI."""
    if not command:
        raise PodConfigError("CreateContainerError", "the container has no command (images are not run locally)")
    name, rest = command[0], list(command[1:])
    if name == "specfleet":
        local = Path(sys.executable).parent / "specfleet"
        return ([str(local)] if local.exists() else [sys.executable, "-m", "specfleet.cli.main"]) + rest
    found = shutil.which(name)
    if found is None:
        raise PodConfigError("CreateContainerError", f"executable {name!r} not found on this machine")
    return [found, *rest]


SERVERS = (("engine", "serve"), ("vllm", "serve"))   # command endings that take `--host ADDRESS`


def container_argv(container: dict, mounts: list[tuple[str, str]], pod_ip: str) -> list[str]:
    """The local argv of a container (`vllm serve`: `vllm_peer.py`); a known server listens on the pod's
    address, as it would on all of a pod's (one-address) interfaces on a cluster, instead of every address
    of this machine."""
    argv = executable([translate(c, mounts) for c in container.get("command") or []])
    args = [translate(a, mounts) for a in container.get("args") or []]
    words = [Path(w).name for w in argv[-2:]]
    return argv + (listening_on(args, pod_ip) if tuple(words) in SERVERS else args)


def listening_on(args: list[str], pod_ip: str) -> list[str]:
    """A server's args plus `--host POD_IP`, unless they name a host themselves."""
    if any(a == "--host" or a.startswith("--host=") for a in args):
        return args
    return [*args, "--host", pod_ip]


def decode(obj: dict) -> dict[str, bytes]:
    """The keys of a Secret or ConfigMap as bytes (`data` is base64 for Secrets, text for ConfigMaps)."""
    out: dict[str, bytes] = {}
    secret = obj.get("kind") == "Secret"
    for key, value in (obj.get("data") or {}).items():
        out[key] = base64.b64decode(value) if secret else str(value).encode()
    for key, value in (obj.get("stringData") or {}).items():
        out[key] = str(value).encode()
    for key, value in (obj.get("binaryData") or {}).items():
        out[key] = base64.b64decode(value)
    return out


def write_keys(folder: Path, keys: dict[str, bytes], source: dict) -> None:
    """Write a Secret/ConfigMap volume: every key (or the listed `items`) as a file with the given mode."""
    folder.mkdir(parents=True, exist_ok=True)
    default_mode = source.get("defaultMode", 0o644)
    items = source.get("items") or [{"key": k, "path": k} for k in keys]
    for item in items:
        if item["key"] not in keys:
            if source.get("optional"):
                continue
            raise PodConfigError("CreateContainerConfigError", f"key {item['key']!r} not found")
        target = folder / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            target.chmod(0o600)
        target.write_bytes(keys[item["key"]])
        target.chmod((item.get("mode", default_mode) & 0o777) | 0o400)   # the owner can always read


def base_env(host_cache: str | None) -> dict[str, str]:
    """What every local container gets before its own env: this machine's env, one torch thread each."""
    env = dict(os.environ)
    for key in ("KUBECONFIG",):
        env.pop(key, None)
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                "PYTHONUNBUFFERED": "1"})
    if host_cache:
        env.setdefault("SPECFLEET_CACHE", host_cache)   # built-in models are "in the image": the shared cache
    return env
