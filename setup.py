"""Maps the top-level source folders onto the `specfleet` namespace package.

`engine/` becomes `specfleet.engine`, `operator/` becomes `specfleet.operator` (never a top-level
`operator`, which is a standard-library name), and so on. Everything else lives in pyproject.toml.
"""
from setuptools import find_packages, setup

SOURCE_FOLDERS = {"engine": "specfleet.engine", "operator": "specfleet.operator",
                  "cluster": "specfleet.cluster", "cli": "specfleet.cli"}


def mapped_packages() -> list[str]:
    packages = []
    for folder, package in SOURCE_FOLDERS.items():
        packages.append(package)
        packages += [f"{package}.{sub}" for sub in find_packages(folder)]
    return packages


setup(
    packages=mapped_packages(),
    package_dir={package: folder for folder, package in SOURCE_FOLDERS.items()},
    package_data={"": ["*.yaml", "*.json", "*.lua", "*.jinja", "*.cpp"]},
    include_package_data=True,
)
