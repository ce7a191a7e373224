"""Maps the top-level source folders onto the `specfleet` namespace package.

`engine/` becomes `specfleet.engine`, `operator/` becomes `specfleet.operator` (never a top-level
`operator`, which is a standard-library name: the folder has no `__init__.py`, so from the repository
root `import operator` still finds the standard library's module), and so on. The CRD and the
manifests ship as data packages (`specfleet.crds`, `specfleet.manifests`), read with `importlib.resources`
(`cluster/resources.py`). A folder the build context lacks is left out: the images copy only what they run
(no `sim/`, the fleet simulator, which needs the dev extra's numpy). Everything else lives in pyproject.toml.
"""
from pathlib import Path

from setuptools import find_namespace_packages, setup

SOURCE_FOLDERS = {"engine": "specfleet.engine", "operator": "specfleet.operator",
                  "cluster": "specfleet.cluster", "cli": "specfleet.cli", "sim": "specfleet.sim"}
DATA_FOLDERS = {"crds": "specfleet.crds", "manifests": "specfleet.manifests"}
FOLDERS = {folder: package for folder, package in {**SOURCE_FOLDERS, **DATA_FOLDERS}.items()
           if Path(folder).is_dir()}


def mapped_packages() -> list[str]:
    packages = []
    for folder, package in FOLDERS.items():
        packages.append(package)
        packages += [f"{package}.{sub}" for sub in find_namespace_packages(folder, exclude=["*__pycache__*"])]
    return packages


setup(
    packages=mapped_packages(),
    package_dir={package: folder for folder, package in FOLDERS.items()},
    package_data={"": ["*.yaml", "*.json", "*.lua", "*.jinja", "*.cpp"]},
    include_package_data=True,
)
