"""Which pods go when the autoscaler lowers replicas (pure).

The ReplicaSet controller removes pods with the lowest `controller.kubernetes.io/pod-deletion-cost`
first (after unscheduled, pending and unready ones). Before lowering `spec.replicas` the operator
ranks the service's pods: a pod it could not scrape serves nothing we can see and goes first, then
the pod with the fewest requests in flight (running + waiting: the work a SIGTERM would have to
drain), and among equals the one whose prefix cache earned least (prefix-cache hit tokens since the
previous scrape: the warm cache a deletion throws away). The chosen pods get negative costs in that
order, the others positive ones, so a pod chosen by an earlier scale-down is no longer first once it
has become the busiest.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from specfleet.operator.control.window import Scrape

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
RUNNING, WAITING, PREFIX_HITS = "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:prefix_cache_hits"


@dataclass(frozen=True)
class PodLoad:
    pod: str
    in_flight: float | None         # running + waiting requests; None: not scraped this interval
    prefix_value: float = 0.0       # prefix-cache hit tokens since the previous scrape

    def key(self) -> tuple:
        return (self.in_flight is not None, self.in_flight or 0.0, self.prefix_value, self.pod)


def loads(pods: list[str], scrapes: Mapping[str, Scrape], previous: Mapping[str, Scrape]) -> list[PodLoad]:
    """Each pod's load from this interval's scrape (and the previous one, for the prefix-cache hits)."""
    out = []
    for pod in pods:
        s = scrapes.get(pod)
        if s is None or (RUNNING not in s.gauges and WAITING not in s.gauges):
            out.append(PodLoad(pod, None))
            continue
        hits = s.counters.get(PREFIX_HITS, 0.0)
        before = previous.get(pod)
        earlier = before.counters.get(PREFIX_HITS, 0.0) if before is not None else hits
        out.append(PodLoad(pod, s.gauges.get(RUNNING, 0.0) + s.gauges.get(WAITING, 0.0),
                           hits - earlier if hits >= earlier else hits))
    return out


def choose(pods: list[PodLoad], remove: int) -> list[PodLoad]:
    """The `remove` pods to delete, first to go first."""
    if remove < 0:
        raise ValueError(f"cannot remove {remove} pods")
    return sorted(pods, key=PodLoad.key)[:remove]


def deletion_costs(pods: list[PodLoad], remove: int) -> dict[str, int]:
    """pod -> deletion cost: -remove..-1 for the chosen ones in deletion order, 1..n for the rest."""
    ranked = sorted(pods, key=PodLoad.key)
    chosen = min(remove, len(ranked))
    return {p.pod: (i - chosen if i < chosen else i - chosen + 1) for i, p in enumerate(ranked)}
