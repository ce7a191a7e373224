"""The profile catalogue: measured engine profiles (`profiles/<model>--<accelerator>.json`) by
(model, accelerator type), and more of one pair measured on other CPUs (`<model>--cpu--<host>.json`).

A CPU profile is true of the CPU it was measured on: the planner sizes with the pair's own file (the
operator does not know the nodes its pods will land on), and the control loop prices each interval with
the one measured on the CPU the engines report (`variants`; `control/profile_host.py`).

Each file is what `specfleet engine profile` writes, read with `specfleet.engine.profile_format` (pure
Python: the operator's image has no numpy). A file that cannot be read or priced is kept as an entry
with its error, so that planning falls back to the roofline and says why instead of failing.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Mapping

from specfleet.engine import profile_format
from specfleet.operator.api import ModelRef
from specfleet.operator.catalogs.loader import normalize
from specfleet.operator.cost import ProfileCost, profile_cost

HERE = Path(__file__).parent / "profiles"
SEPARATOR = "--"


@dataclass(frozen=True)
class ProfileEntry:
    """One profile file: its cost, or why it cannot be used."""

    name: str
    cost: ProfileCost | None
    error: str = ""


@dataclass(frozen=True)
class ProfileCatalog:
    """Profiles by (normalized model name, accelerator type)."""

    entries: Mapping[tuple[str, str], ProfileEntry] = field(default_factory=dict)
    others: Mapping[tuple[str, str], tuple[ProfileEntry, ...]] = field(default_factory=dict)

    def lookup(self, model: ModelRef, accelerator: str) -> ProfileEntry | None:
        """The pair's own file (`<model>--<accelerator>.json`), else the first measured on another host."""
        for key in model_names(model):
            if (key, accelerator) in self.entries:
                return self.entries[(key, accelerator)]
            if (key, accelerator) in self.others:
                return self.others[(key, accelerator)][0]
        return None

    def variants(self, model: ModelRef, accelerator: str) -> tuple[ProfileEntry, ...]:
        """Every file of the pair: its own first, then those of other hosts by name."""
        for key in model_names(model):
            found = ((self.entries[(key, accelerator)],) if (key, accelerator) in self.entries else ()) + \
                tuple(self.others.get((key, accelerator), ()))
            if found:
                return found
        return ()


NO_PROFILES = ProfileCatalog()


def model_names(model: ModelRef) -> list[str]:
    """The names a CR's model may be catalogued under: its name, its source, the source's last part."""
    source = normalize(model.source)
    bare = source.split(":", 1)[-1] if source.startswith("builtin:") else source
    return list(dict.fromkeys([normalize(model.name), source, bare, bare.rsplit("/", 1)[-1]]))


def read_entry(path: Path) -> ProfileEntry:
    """One profile file as an entry; a file that cannot be used becomes an entry with its error."""
    try:
        return ProfileEntry(path.stem, profile_cost(profile_format.load(path), path.stem))
    except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
        return ProfileEntry(path.stem, None, f"profile {path.name} is unusable: {exc}")


def read_catalog(folder: Path) -> ProfileCatalog:
    """Every `<model>--<accelerator>[--<host>].json` in `folder` (none when the folder is missing)."""
    entries: dict[tuple[str, str], ProfileEntry] = {}
    others: dict[tuple[str, str], tuple[ProfileEntry, ...]] = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        model, sep, rest = path.stem.partition(SEPARATOR)
        accelerator, other, _ = rest.partition(SEPARATOR)
        key = (normalize(model), accelerator)
        if sep and other:
            others[key] = others.get(key, ()) + (read_entry(path),)
        elif sep:
            entries[key] = read_entry(path)
    return ProfileCatalog(entries, others)


@lru_cache(maxsize=8)
def profiles(path: str | None = None) -> ProfileCatalog:
    """The packaged profile catalogue, or the one in folder `path`."""
    return read_catalog(Path(path) if path else HERE)
