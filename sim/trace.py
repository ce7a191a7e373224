"""A closed-loop client trace: phases of concurrent clients, each sending its next request when the last ends.

One trace drives both the real fleet (`benchmarks/closed_loop.py`) and the simulator, so the two are
compared on the same arrivals. Within a phase the number of active clients moves linearly from
`clients_from` to `clients_to`; a client sends prompts of its phase's workload (copy-heavy or
open-ended) with no think time. `scaled` shortens every phase by one factor (CI, quick runs).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

WORKLOADS = ("copy-heavy", "open-ended")


@dataclass(frozen=True)
class Phase:
    name: str
    workload: str
    seconds: float
    clients_from: int
    clients_to: int

    def clients_at(self, elapsed: float) -> int:
        """Active clients `elapsed` seconds into the phase (linear between the two ends, rounded)."""
        share = min(max(elapsed / self.seconds, 0.0), 1.0) if self.seconds > 0 else 1.0
        return max(0, round(self.clients_from + share * (self.clients_to - self.clients_from)))


@dataclass(frozen=True)
class Trace:
    phases: tuple[Phase, ...]
    max_tokens: int = 96
    seed: int = 0

    def __post_init__(self) -> None:
        for p in self.phases:
            if p.workload not in WORKLOADS:
                raise ValueError(f"phase {p.name!r}: workload must be one of {', '.join(WORKLOADS)}")
            if p.seconds <= 0 or min(p.clients_from, p.clients_to) < 0:
                raise ValueError(f"phase {p.name!r}: seconds must be > 0 and clients >= 0")

    @property
    def duration(self) -> float:
        return sum(p.seconds for p in self.phases)

    def at(self, t: float) -> tuple[Phase, int]:
        """The phase at `t` seconds from the start and its active clients (the last phase past the end)."""
        start = 0.0
        for p in self.phases:
            if t < start + p.seconds:
                return p, p.clients_at(t - start)
            start += p.seconds
        last = self.phases[-1]
        return last, last.clients_to

    def bounds(self) -> list[tuple[str, float, float]]:
        """(phase name, start s, end s) for each phase."""
        out, start = [], 0.0
        for p in self.phases:
            out.append((p.name, start, start + p.seconds))
            start += p.seconds
        return out

    def scaled(self, factor: float) -> "Trace":
        return replace(self, phases=tuple(replace(p, seconds=p.seconds * factor) for p in self.phases))


# About ten minutes: copy-heavy clients ramp 1 -> 24 and back, then an open-ended phase.
SIM_TO_REAL = Trace(phases=(
    Phase("ramp-up", "copy-heavy", 150.0, 1, 24),
    Phase("peak", "copy-heavy", 90.0, 24, 24),
    Phase("ramp-down", "copy-heavy", 150.0, 24, 1),
    Phase("open-ended", "open-ended", 150.0, 8, 8),
))
