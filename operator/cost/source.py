"""Where a service model's step costs come from and how well they fit (`status.calibration`)."""
from __future__ import annotations

from dataclasses import dataclass

from specfleet.operator.cost.profile import ProfileCost

ROOFLINE, PROFILE, ONLINE = "roofline", "profile", "online"


@dataclass(frozen=True)
class CostSource:
    """Where a service model's step costs come from (`status.calibration`)."""

    source: str = ROOFLINE               # profile | online | roofline
    profile: str | None = None           # the profile's name (also after online refinement of it)
    fit_error: float | None = None       # relative RMS against the observed steps (before any: the profile's own)
    samples: int = 0                     # observed steps behind an online refinement
    reason: str = ""                     # why the roofline is used, or which of the profile's fits are not
    scales: tuple[float, float] | None = None   # a refined profile's (decode, verify) scales
    refused: bool = False                # the service's profile file was refused (unreadable, too few points,
                                         # another model or machine): the reason says why, Degraded says so

    def as_status(self) -> dict:
        out = {"source": self.source, "profile": self.profile,
               "fitError": None if self.fit_error is None else round(self.fit_error, 4), "samples": self.samples}
        if self.scales is not None:
            out |= {"decodeScale": round(self.scales[0], 4), "verifyScale": round(self.scales[1], 4)}
        return {**out, "reason": self.reason} if self.reason else out


def planned_source(cost: ProfileCost | None, reason: str = "", refused: bool = False) -> CostSource:
    """The source of a freshly planned service: the profile's own fit error, or the roofline and why
    (`refused`: the service's profile file exists but cannot price it)."""
    if cost is None:
        return CostSource(ROOFLINE, reason=reason or "no profile for this model and accelerator", refused=refused)
    return CostSource(PROFILE, cost.name, cost.fit_error, 0, cost.refused)
