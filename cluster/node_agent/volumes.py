"""A pod's volumes, env and command line, translated for a local process (no containers, no images).

Each volume becomes a local folder (emptyDir: a fresh folder under the pod's state folder; secret and
configMap: their keys written as files; hostPath: the path itself), and every path that starts with a
mount path, in args, command and env values, is rewritten to that folder. `--port N` is rewritten to the
port the agent assigned. All pure but `materialize`, which writes the files.
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


def rewrite_ports(args: list[str], ports: dict[int, int], default: int | None) -> list[str]:
    """`--port N` / `--port=N` pointed at the local port that stands for container port N."""
    out, i = [], 0
    while i < len(args):
        arg = args[i]
        if arg == "--port" and i + 1 < len(args):
            out += [arg, str(_local(args[i + 1], ports, default))]
            i += 2
            continue
        if arg.startswith("--port="):
            arg = f"--port={_local(arg[7:], ports, default)}"
        out.append(arg)
        i += 1
    return out


def _local(value: str, ports: dict[int, int], default: int | None) -> int | str:
    try:
        return ports.get(int(value), default if default is not None else value)
    except ValueError:
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


def container_argv(container: dict, mounts: list[tuple[str, str]], ports: dict[int, int],
                   default_port: int | None) -> list[str]:
    argv = executable([translate(c, mounts) for c in container.get("command") or []])
    args = rewrite_ports([translate(a, mounts) for a in container.get("args") or []], ports, default_port)
    if argv[-2:] == ["engine", "serve"] and "--host" not in args:
        args += ["--host", "127.0.0.1"]   # the engine listens on 0.0.0.0 by default; keep it on loopback
    return argv + args


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
