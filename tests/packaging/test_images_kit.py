"""The image kit (tests/images_kit.py) on its own: what it reads from a Dockerfile, and that a container's
command changes only by `LAPTOP`'s substitutions."""
from __future__ import annotations

from pathlib import Path

import pytest

from images_kit import Command, Here, container_command, images, local_command, parse_dockerfile

DOCKERFILE = '''# Build from the repository root:
#   docker build -f images/thing.Dockerfile -t example.com/thing:1.2.3 .
FROM python:3.11 AS build
WORKDIR /src
COPY pyproject.toml setup.py ./
COPY cli/ cli/
COPY --from=elsewhere /x /y
RUN /opt/specfleet/bin/pip install --no-cache-dir ".[thing]" \\
 && /opt/specfleet/bin/pip install --no-deps extra==1
FROM python:3.11
ENV PATH=/opt/specfleet/bin:$PATH HOME=/tmp
ENTRYPOINT ["specfleet"]
CMD ["thing", "run"]
'''


def test_a_dockerfile_gives_its_name_extra_context_installs_env_and_command():
    image = parse_dockerfile(DOCKERFILE)
    assert (image.component, image.reference, image.extra) == ("thing", "example.com/thing:1.2.3", "thing")
    assert image.context == ((("pyproject.toml", "setup.py"), "./"), (("cli/",), "cli/"))
    assert image.installs == (("--no-cache-dir", ".[thing]"), ("--no-deps", "extra==1"))
    assert image.env == (("PATH", "/opt/specfleet/bin:$PATH"), ("HOME", "/tmp"))
    assert (image.entrypoint, image.cmd) == (("specfleet",), ("thing", "run"))


def test_a_dockerfile_without_a_build_comment_is_refused():
    with pytest.raises(ValueError, match="no build comment"):
        parse_dockerfile(DOCKERFILE.replace("docker build", "docker run"))


def test_the_operator_s_command_changes_only_where_laptop_says(tmp_path):
    container = {"args": ["operator", "run", "-A", "--liveness", "http://0.0.0.0:8080/healthz"],
                 "env": [{"name": "SPECFLEET_METRICS_PORT", "value": "9090"}, {"name": "KEEP", "value": "/tmp/x"},
                         {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}
    venv = tmp_path / "venv"                       # under /tmp, like the cache: substituted in one pass
    here = Here(venv=venv, tmp=tmp_path / "pod-tmp", kubeconfig=tmp_path / "kc", liveness_port=1234,
                metrics_port=5678, pod_name="op-0", namespace="ns")
    command = local_command("operator", container_command(images()["operator"], container), here)
    assert command.argv == ("specfleet", "operator", "run", "-A", "--liveness", "http://127.0.0.1:1234/healthz")
    assert command.env["PATH"].startswith(f"{venv}/bin:") and command.env["HOME"] == str(tmp_path / "pod-tmp")
    assert command.env["KEEP"] == str(tmp_path / "pod-tmp" / "x")
    assert (command.env["SPECFLEET_METRICS_PORT"], command.env["POD_NAME"]) == ("5678", "op-0")
    assert command.env["KUBECONFIG"] == str(tmp_path / "kc")


def test_an_env_var_from_the_cluster_that_nothing_stands_in_for_fails(tmp_path):
    command = Command(("specfleet",), {"PATH": "/bin"}, {"TOKEN": {"secretKeyRef": {"name": "s", "key": "k"}}})
    with pytest.raises(ValueError, match="TOKEN"):
        local_command("gateway", command, Here(venv=Path("/v"), tmp=tmp_path, port=1))
