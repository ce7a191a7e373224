"""What kube-scheduler does for one node: pods are admitted by their containers' resource requests.

The node's allocatable CPU and memory are this machine's (`os.cpu_count()`, physical memory). A pod
fits when its requests (the sum over containers, or the largest init container's if larger) fit in
what the pods already bound to the node leave free; a pod that does not fit stays Pending with
`PodScheduled=False` (reason `Unschedulable`) until capacity frees up. Pending pods are taken in the
order the scheduler first saw them (`SchedulingQueue`), as kube-scheduler's queue orders by the time a
pod entered it: `creationTimestamp` has whole seconds, so a replacement created in the same second as
an older pending pod must not overtake it by name. Quantities are counted in
thousandths of their unit ("500m" CPU is 500, "1Gi" is 1024**3 * 1000) so that nothing rounds.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

MAX_PODS = 110
_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_QUANTITY = re.compile(r"^\+?([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)(m|k|[KMGTPE]i|[MGTPE]|)$")


class QuantityError(ValueError):
    """A resource quantity that Kubernetes would not accept either."""


def milli(quantity) -> int:
    """A Kubernetes quantity ("2", "500m", "1.5Gi", 4) in thousandths of its unit."""
    match = _QUANTITY.match(str(quantity).strip())
    if match is None:
        raise QuantityError(f"not a resource quantity: {quantity!r}")
    number, suffix = float(match.group(1)), match.group(2)
    if suffix == "m":
        return round(number)
    return round(number * _SUFFIX[suffix] * 1000)


def requests(pod_spec: dict) -> dict[str, int]:
    """The pod's resource requests (milli-units by resource name), as the scheduler counts them."""
    total: dict[str, int] = {}
    for container in pod_spec.get("containers") or []:
        for name, value in ((container.get("resources") or {}).get("requests") or {}).items():
            total[name] = total.get(name, 0) + milli(value)
    for container in pod_spec.get("initContainers") or []:
        for name, value in ((container.get("resources") or {}).get("requests") or {}).items():
            total[name] = max(total.get(name, 0), milli(value))
    return total


def machine_allocatable() -> dict[str, int]:
    """This machine's CPU count and physical memory, in milli-units."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"cpu": (os.cpu_count() or 1) * 1000, "memory": memory * 1000, "pods": MAX_PODS * 1000}


def node_quantities(allocatable: dict[str, int]) -> dict[str, str]:
    """Allocatable as the Node object's status shows it: cpu in cores, memory in Ki."""
    out = {"cpu": f"{allocatable['cpu']}m" if allocatable["cpu"] % 1000 else str(allocatable["cpu"] // 1000),
           "memory": f"{allocatable['memory'] // 1000 // 1024}Ki", "pods": str(allocatable["pods"] // 1000)}
    return out


@dataclass(frozen=True)
class Decision:
    """Where one pending pod goes: bound to the node, or the reason it does not fit."""

    pod: dict
    fits: bool
    message: str = ""


def _created(pod: dict) -> tuple[str, str]:
    return pod["metadata"].get("creationTimestamp") or "", pod["metadata"]["name"]


def _key(pod: dict) -> str:
    return pod["metadata"].get("uid") or pod["metadata"]["name"]


@dataclass
class SchedulingQueue:
    """The order pending pods entered the queue: a sequence number per pod uid, given when first seen."""

    entered: dict[str, int] = field(default_factory=dict)
    next_number: int = 0

    def order(self, pending: list[dict]) -> list[dict]:
        """`pending` in queue order; pods seen for the first time join at the end, oldest first. Pods no
        longer pending leave the queue."""
        for pod in sorted(pending, key=_created):
            if _key(pod) not in self.entered:
                self.entered[_key(pod)] = self.next_number
                self.next_number += 1
        keys = {_key(pod) for pod in pending}
        self.entered = {key: n for key, n in self.entered.items() if key in keys}
        return sorted(pending, key=lambda pod: self.entered[_key(pod)])


def schedule(pending: list[dict], bound: list[dict], allocatable: dict[str, int]) -> list[Decision]:
    """Decide every pending pod in the order given (`SchedulingQueue.order`), each admitted pod taking its
    requests from what is free."""
    free = dict(allocatable)
    for pod in bound:
        _take(free, {**requests(pod["spec"]), "pods": 1000})
    decisions = []
    for pod in pending:
        want = {**requests(pod["spec"]), "pods": 1000}
        short = sorted(name for name, amount in want.items() if amount > free.get(name, 0))
        if short:
            reasons = ", ".join(f"1 Too many {n}" if n == "pods" else f"1 Insufficient {n}" for n in short)
            decisions.append(Decision(pod, False, f"0/1 nodes are available: {reasons}."))
        else:
            _take(free, want)
            decisions.append(Decision(pod, True))
    return decisions


def _take(free: dict[str, int], want: dict[str, int]) -> None:
    for name, amount in want.items():
        free[name] = free.get(name, 0) - amount
