"""A CPU profile prices only engines on its own CPU: the control loop's check, each interval.

The planner sizes a service with its (model, accelerator) pair's profile before any pod exists, so
without knowing the CPU its pods will land on. The engines report theirs (`specfleet:host_info`, keyed
by `profile_format.host_key`: vendor, family/model, vector ISA). Where the profile pricing the service
was measured on another CPU, the pair's profile of the engines' CPU takes over
(`ProfileCatalog.variants`), and where there is none the roofline prices the steps, refined online as
any roofline is, with `status.calibration.reason` and a Degraded condition (`ProfileHostMismatch`)
saying why. The plan's sizes stay: they are the pods' arguments, and changing them restarts the pods.

Not checked: engines that report no host (vLLM, an older specfleet), and GPU profiles (the planner
matches those to the accelerator by the GPU's name).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Mapping, Sequence, TypeVar

from specfleet.operator.control.window import Scrape, parse_labels
from specfleet.operator.status import PROFILE_HOST_MISMATCH
from specfleet.operator.cost import CostSource, ProfileCost, planned_source
from specfleet.operator.cost.calibration import CostedModel
from specfleet.operator.cost.source import ROOFLINE

HOST_INFO = "specfleet:host_info"

M = TypeVar("M", bound=CostedModel)


@dataclass(frozen=True)
class HostPricing:
    """What prices engines on the hosts they report: a profile, or the roofline (None) and why."""

    profile: ProfileCost | None
    reason: str = ""

    @property
    def mismatch(self) -> str:
        """What the Warning Event and the Degraded condition say ("" while a profile prices the engines)."""
        if self.profile is not None:
            return ""
        return f"{self.reason}: the roofline prices the steps instead, refined online"


def engine_hosts(scrapes: Mapping[str, Scrape]) -> Counter[str]:
    """How many of the scraped pods report each host (none for engines that do not report it)."""
    hosts: Counter[str] = Counter()
    for scrape in scrapes.values():
        for key, value in scrape.gauges.items():
            if key.startswith(HOST_INFO + "{") and value > 0 and (host := parse_labels(key)[1].get("host")):
                hosts[host] += 1
    return hosts


def pricing(planned: ProfileCost | None, candidates: Sequence[ProfileCost],
            hosts: Counter[str]) -> HostPricing | None:
    """What should price engines on `hosts`; None where no check applies (no CPU profile planned, or no
    engine reported its host). The planned profile while any engine runs on its CPU; else the candidate
    measured on the CPU most engines run on; else the roofline."""
    if planned is None or not planned.host or not hosts:
        return None
    if planned.host in hosts:
        return HostPricing(planned)
    host = hosts.most_common(1)[0][0]
    match = next((c for c in candidates if c.host == host), None)
    if match is not None:
        return HostPricing(match)
    return HostPricing(None, f"profile {planned.name} was measured on a CPU {planned.host}; the engines run on "
                             f"{' and '.join(sorted(hosts))}, and no profile of this model was measured there")


def repriced(model: M, chosen: HostPricing) -> M:
    """`model` priced as `chosen` says; unchanged (its online scales kept) where it already is."""
    current = model.profile.name if model.profile is not None else None
    if chosen.profile is not None:
        if current == chosen.profile.name:
            return model
        return replace(model, profile=chosen.profile, calibration=planned_source(chosen.profile))
    if current is None and model.calibration.reason == chosen.reason:
        return model
    return replace(model, profile=None, cal=model.prior,
                   calibration=CostSource(ROOFLINE, reason=chosen.reason, refused=True))


def change_event(before: CostedModel, after: CostedModel, chosen: HostPricing) -> tuple[str, str, str] | None:
    """The Event of a change of what prices the steps (None when nothing changed)."""
    if before is after:
        return None
    if chosen.profile is None:
        return ("Warning", PROFILE_HOST_MISMATCH, chosen.mismatch)
    return ("Normal", "ProfileSelected", f"profile {chosen.profile.name} prices the steps: measured on "
                                         f"{chosen.profile.host}, the CPU the engines run on")
