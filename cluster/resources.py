"""The files `specfleet up` reads from the installed package: the CRD, the example manifests, and the
operator's and gateway's Deployments and RBAC (`manifest_commands.py`, `service_accounts.py`).

They ship as the data packages `specfleet.crds` (crds/) and `specfleet.manifests` (manifests/), mapped in
setup.py, so `up` works the same from a wheel as from an editable checkout.
"""
from __future__ import annotations

import importlib.resources
import importlib.util
import os
from importlib.abc import Traversable
from importlib.resources.readers import MultiplexedPath

CRD = ("specfleet.crds", "inferenceservice.yaml")
DEFAULT_CR = ("specfleet.manifests", "examples/smollm2-cpu.yaml")


def data_file(package: str, relative: str) -> Traversable:
    """A file of a data package (one without `__init__.py`)."""
    path = package_root(package)
    for part in relative.split("/"):
        path = path / part
    return path


def package_root(package: str) -> Traversable:
    """The folder of an installed package (a data package included)."""
    spec = importlib.util.find_spec(package)
    if spec is None:
        raise FileNotFoundError(f"the package {package} is not installed")
    if spec.origin is None and spec.submodule_search_locations is not None:
        # A namespace package: Python 3.11's files() refuses one whose path holds a non-folder entry, which
        # setuptools' editable finder adds (a path-hook placeholder); keep the real folders.
        return MultiplexedPath(*[p for p in spec.submodule_search_locations if os.path.isdir(p)])
    return importlib.resources.files(package)


def crd_text() -> str:
    return data_file(*CRD).read_text(encoding="utf-8")


def default_cr() -> Traversable:
    return data_file(*DEFAULT_CR)
