"""The images as the tests see them: each Dockerfile in images/ parsed, and a virtual environment built as it builds one.

Nothing here restates a Dockerfile: its name and tag come from its build comment (`docker build -f
images/X.Dockerfile -t NAME:TAG .`), its build context from the build stage's COPY lines, its installs
from the build stage's `pip install` commands (replayed in order), its environment from the final stage's
ENV and its command from ENTRYPOINT/CMD. What a laptop must change to run an image is in `LAPTOP`, each
change with its reason, and `local_command` applies exactly those (on sys.path through pytest's
`pythonpath = ["tests"]`).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "images"
VENV = "/opt/specfleet"                    # where every image keeps its virtual environment
PYTHON = "python3.11"
BUILD_COMMENT = re.compile(r"docker build -f (images/\S+\.Dockerfile) -t (\S+):(\S+) \.")


# -- a Dockerfile, parsed (pure) ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Image:
    component: str                               # operator | gateway | engine (images/<component>.Dockerfile)
    name: str                                    # ghcr.io/specfleet/<component>: the build comment's -t
    tag: str
    extra: str                                   # pip install ".[EXTRA]"
    context: tuple[tuple[tuple[str, ...], str], ...]   # the build stage's COPY (sources, destination)
    installs: tuple[tuple[str, ...], ...]        # the build stage's pip install argument lists, in order
    env: tuple[tuple[str, str], ...]             # the final stage's ENV
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]

    @property
    def reference(self) -> str:
        return f"{self.name}:{self.tag}"


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction: continuation lines joined, comments dropped."""
    out, pending = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, rest = pending.strip().partition(" ")
        out.append((keyword.upper(), rest.strip()))
        pending = ""
    return out


def stages(text: str) -> list[list[tuple[str, str]]]:
    """The instructions of each FROM stage, in order."""
    out: list[list[tuple[str, str]]] = []
    for keyword, rest in instructions(text):
        if keyword == "FROM":
            out.append([])
        if out:
            out[-1].append((keyword, rest))
    return out


def pip_installs(run: str) -> list[tuple[str, ...]]:
    """The arguments after `<venv>/bin/pip install` of each `&&`-joined command of a RUN."""
    out = []
    for command in run.split("&&"):
        words = shlex.split(command)
        if len(words) > 2 and words[0] == f"{VENV}/bin/pip" and words[1] == "install":
            out.append(tuple(words[2:]))
    return out


def env_pairs(rest: str) -> list[tuple[str, str]]:
    """ENV's `K=V K2=V2` (the only form the Dockerfiles use)."""
    return [tuple(word.split("=", 1)) for word in shlex.split(rest)]


def parse_dockerfile(text: str) -> Image:
    declared = BUILD_COMMENT.search(text)
    if declared is None:
        raise ValueError("no build comment `docker build -f images/X.Dockerfile -t NAME:TAG .`")
    build = next(s for s in stages(text) if any(pip_installs(r) for k, r in s if k == "RUN"))
    final = stages(text)[-1]
    installs = [args for keyword, rest in build if keyword == "RUN" for args in pip_installs(rest)]
    extras = [m.group(1) for args in installs for a in args if (m := re.fullmatch(r"\.\[([\w,-]+)\]", a))]
    copies = [shlex.split(rest) for keyword, rest in build if keyword == "COPY" and "--from" not in rest]
    last = {keyword: rest for keyword, rest in final}
    return Image(component=Path(declared.group(1)).name.removesuffix(".Dockerfile"), name=declared.group(2),
                 tag=declared.group(3), extra=extras[0], context=tuple((tuple(c[:-1]), c[-1]) for c in copies),
                 installs=tuple(installs), env=tuple(p for k, r in final if k == "ENV" for p in env_pairs(r)),
                 entrypoint=tuple(json.loads(last["ENTRYPOINT"])), cmd=tuple(json.loads(last.get("CMD", "[]"))))


def images() -> dict[str, Image]:
    """Every images/*.Dockerfile by component."""
    parsed = (parse_dockerfile(path.read_text()) for path in sorted(IMAGES.glob("*.Dockerfile")))
    return {image.component: image for image in parsed}


def project_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def extra_requirements(extra: str) -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][extra]


def torch_pin(extra: str) -> str | None:
    """The extra's torch requirement (`torch==X`), if it has one."""
    return next((r for r in extra_requirements(extra) if re.match(r"torch\b", r)), None)


# -- what a laptop changes -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Here:
    """This machine's stand-ins for what a cluster gives a container."""
    venv: Path                                   # the image's /opt/specfleet
    tmp: Path                                    # the container's /tmp (an emptyDir)
    kubeconfig: Path | None = None               # the pod's ServiceAccount credentials
    port: int = 0                                # the container's listening port, here a free one
    liveness_port: int = 0
    metrics_port: int = 0
    pod_name: str = "parity-0"                   # the stand-in pod's name, in the Deployment's namespace
    namespace: str = "default"
    model_dir: Path | None = None                # the engine's hostPath model volume
    admin_token_file: Path | None = None         # the engine's admin-token Secret volume


@dataclass(frozen=True)
class Command:
    """A container's argv and environment; `env_from` holds the valueFrom entries still to resolve."""
    argv: tuple[str, ...]
    env: dict[str, str]
    env_from: dict[str, dict] = field(default_factory=dict)


@dataclass(frozen=True)
class Substitution:
    components: tuple[str, ...]
    target: str                                  # a flag, `$ENV`, or a build step
    reason: str
    apply: Callable[[Command, Here], Command] = lambda command, here: command   # build steps: done by build_venv


def with_flag(command: Command, flag: str, value: str) -> Command:
    """`flag VALUE` replaced in place, or appended where the command does not give it."""
    argv = list(command.argv)
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    return replace(command, argv=tuple(argv))


def with_env(command: Command, name: str, value: str | None) -> Command:
    env, env_from = dict(command.env), dict(command.env_from)
    env_from.pop(name, None)
    env.pop(name, None) if value is None else env.__setitem__(name, value)
    return replace(command, env=env, env_from=env_from)


def _paths(command: Command, here: Here) -> Command:
    """In one pass: the venv itself may lie under this machine's /tmp."""
    def local(value: str) -> str:
        return re.sub(rf"{re.escape(VENV)}|/tmp\b", lambda m: str(here.venv if m.group() == VENV else here.tmp), value)
    return replace(command, env={k: local(v) for k, v in command.env.items()})


def _liveness(command: Command, here: Here) -> Command:
    url = command.argv[command.argv.index("--liveness") + 1]
    return with_flag(command, "--liveness", re.sub(r"//[^/]+", f"//127.0.0.1:{here.liveness_port}", url, count=1))


def _downward(command: Command, here: Here) -> Command:
    values = {"metadata.name": here.pod_name, "metadata.namespace": here.namespace, "status.podIP": "127.0.0.1"}
    for name, source in dict(command.env_from).items():
        path = source.get("fieldRef", {}).get("fieldPath")
        command = with_env(command, name, values[path]) if path in values else command
    return command


def _model(command: Command, here: Here) -> Command:
    return with_flag(command, "--model", str(here.model_dir))


ALL = ("operator", "gateway", "engine")
LAPTOP: tuple[Substitution, ...] = (
    Substitution(ALL, f"{VENV}, /tmp", "the image's virtual environment is a fresh `python3.11 -m venv` in a "
                 "temp folder, with the Dockerfile's own pip installs replayed into it; the container's /tmp (an "
                 "emptyDir: HOME and the caches) is a temp folder", _paths),
    Substitution(ALL, "pip --no-cache-dir", "kept out: pip's cache makes a rebuilt environment quick; the "
                 "environment is reused while pyproject.toml, setup.py and the Dockerfile are unchanged, with "
                 "specfleet reinstalled (non-editable) from a fresh copy of the build context each session"),
    Substitution(("engine",), "python3 (Ubuntu 24.04: 3.12)", "python3.11: the local torch build is for 3.11"),
    Substitution(("engine",), "pip install torch first", "the CPU build of the pinned torch, from local disk, "
                 "before the extra; the image resolves the CUDA build"),
    Substitution(ALL, "$KUBECONFIG", "the pod's ServiceAccount token and in-cluster address: a kubeconfig for "
                 "the API emulator (the tests' `kubeconfigs` fixture)",
                 lambda c, here: with_env(c, "KUBECONFIG", str(here.kubeconfig)) if here.kubeconfig else c),
    Substitution(("operator",), "--liveness", "the pod's 0.0.0.0:8080 is its own; here 127.0.0.1 at a free port",
                 _liveness),
    Substitution(("operator",), "$SPECFLEET_METRICS_PORT", "the pod's own 9090; here a free port",
                 lambda c, here: with_env(c, "SPECFLEET_METRICS_PORT", str(here.metrics_port))),
    Substitution(("gateway", "engine"), "--port", "the pod's own port; here a free one",
                 lambda c, here: with_flag(c, "--port", str(here.port))),
    Substitution(("gateway", "engine"), "--host", "a pod listens on all of its own addresses (0.0.0.0, the "
                 "default); here only on the loopback", lambda c, here: with_flag(c, "--host", "127.0.0.1")),
    Substitution(ALL, "env fieldRef", "the downward API: the stand-in pod's name (`Here.pod_name`), the "
                 "Deployment's namespace, 127.0.0.1 as its IP", _downward),
    Substitution(("engine",), "--model", "the hostPath volume mounted at /models/model: the tiny model's folder",
                 _model),
    Substitution(("engine",), "--admin-token-file", "the admin-token Secret's volume: a file holding a token",
                 lambda c, here: with_flag(c, "--admin-token-file", str(here.admin_token_file))),
    Substitution(("engine",), "$HF_TOKEN", "an optional key of the `hf-token` Secret, which does not exist: unset",
                 lambda c, here: with_env(c, "HF_TOKEN", None)),
    Substitution(("engine",), "$SPECFLEET_ATTENTION_BACKEND", "torch: the image's runtime stage has no compiler, "
                 "so its engine cannot build the C++ CPU kernel and runs the torch path; this machine has one",
                 lambda c, here: with_env(c, "SPECFLEET_ATTENTION_BACKEND", "torch")),
)


def container_command(image: Image, container: dict) -> Command:
    """What a container runs: `command` (else the image's ENTRYPOINT) + `args` (else CMD), in the image's
    environment (a base PATH, the Dockerfile's ENV) plus the container's."""
    argv = tuple(container.get("command") or image.entrypoint) + tuple(container.get("args") or image.cmd)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    for name, value in image.env:
        env[name] = re.sub(r"\$(\w+)|\$\{(\w+)\}", lambda m: env.get(m.group(1) or m.group(2), ""), value)
    env_from = {}
    for var in container.get("env") or []:
        if "valueFrom" in var:
            env_from[var["name"]] = var["valueFrom"]
        else:
            env[var["name"]] = str(var.get("value", ""))
    return Command(tuple(str(a) for a in argv), env, env_from)


def local_command(component: str, command: Command, here: Here) -> Command:
    """`command` with `LAPTOP`'s changes for `component`, and nothing else; a valueFrom left unresolved fails."""
    for sub in LAPTOP:
        if component in sub.components:
            command = sub.apply(command, here)
    if command.env_from:
        raise ValueError(f"{component}: env {sorted(command.env_from)} come from the cluster and nothing here "
                         "stands in for them (add a substitution to LAPTOP)")
    return command


# -- an image's virtual environment --------------------------------------------------------------------------
def stage_context(image: Image, dest: Path) -> Path:
    """The build stage's COPY sources (repository-relative) laid out under `dest`, its WORKDIR."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for sources, target in image.context:
        for source in sources:
            src = ROOT / source
            if src.is_dir():                       # a folder's contents go into the target folder
                shutil.copytree(src, dest / target, ignore=ignore, dirs_exist_ok=True)
            elif target.endswith("/"):             # files into a folder
                (dest / target).mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / target / src.name)
            else:
                shutil.copy2(src, dest / target)
    return dest


def environment_key(image: Image) -> str:
    """What decides an image's dependencies: pyproject.toml, setup.py, its Dockerfile, the interpreter."""
    digest = hashlib.sha256(subprocess.run([PYTHON, "-VV"], capture_output=True, text=True).stdout.encode())
    for path in (ROOT / "pyproject.toml", ROOT / "setup.py", IMAGES / f"{image.component}.Dockerfile"):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def pip(venv: Path, *args: str, log: Path) -> None:
    with log.open("a") as out:
        out.write(f"$ pip {shlex.join(args)}\n")
        out.flush()
        done = subprocess.run([str(venv / "bin/pip"), *args], stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        raise RuntimeError(f"pip {shlex.join(args)} failed ({done.returncode}):\n{log.read_text()[-3000:]}")


def replayed(args: tuple[str, ...], context: Path) -> tuple[str, ...]:
    """A Dockerfile's pip arguments here: `.[extra]` is the staged context, no --no-cache-dir (LAPTOP)."""
    return tuple(str(context) + a[1:] if a.startswith(".[") else a for a in args if a != "--no-cache-dir")


@contextmanager
def image_venv(image: Image, cache: Path):
    """The image's virtual environment, built or reused under `cache`, locked while the caller uses it."""
    folder = cache / f"{image.component}-{environment_key(image)}"
    folder.mkdir(parents=True, exist_ok=True)
    venv, done, log = folder / "venv", folder / "complete", folder / "pip.log"
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        context = stage_context(image, folder / "context")
        log.write_text("")
        if done.exists():
            pip(venv, "install", "-q", "--no-deps", "--force-reinstall", str(context), log=log)
        else:
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([PYTHON, "-m", "venv", str(venv)], check=True)
            if pin := torch_pin(image.extra):    # LAPTOP: torch first
                pip(venv, "install", "-q", pin, log=log)
            for args in image.installs:
                pip(venv, "install", *replayed(args, context), log=log)
            done.touch()
        yield venv


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def default_cache() -> Path:
    import tempfile

    return Path(tempfile.gettempdir()) / f"specfleet-image-venvs-py{sys.version_info[0]}{sys.version_info[1]}"
