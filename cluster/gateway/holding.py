"""Holding requests while a service has no ready replica (the gateway half of scale to zero).

A request for a service without a ready pod waits here instead of failing: at most `max_per_service`
at once per service, each for at most `timeout_s`. Past either bound it is refused (`HoldRefused`, which
the gateway answers 503 with `Retry-After`), so nothing hangs. The count is kept in a `try/finally`, so
a client that disconnects while held (its handler cancelled) leaves nothing behind. Every change of a
service's count is reported to `on_change` (the metrics gauge and the annotation the operator watches).
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field


class HoldRefused(Exception):
    """The request could not be held (`reason`: "full" or "timeout"); retry after `retry_after_s`."""

    def __init__(self, reason: str, message: str, retry_after_s: int):
        super().__init__(message)
        self.reason, self.retry_after_s = reason, retry_after_s


@dataclass
class Holds:
    max_per_service: int = 64
    timeout_s: float = 120.0
    retry_after_s: int = 5
    on_change: Callable[[str, int], None] = lambda service, count: None
    counts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_per_service < 0 or not self.timeout_s > 0 or self.retry_after_s < 1:
            raise ValueError("hold bounds: max per service >= 0, timeout > 0, Retry-After >= 1 s")

    async def until(self, service: str, available: Callable[[], bool], changed: Callable[[], asyncio.Event],
                    deadline: float) -> float:
        """Wait until `available()` (re-checked whenever `changed()` fires) or until `deadline` (monotonic);
        returns the seconds held. Raises `HoldRefused` when the service already holds its maximum, or
        when the deadline passes first."""
        if available():
            return 0.0
        if self.counts.get(service, 0) >= self.max_per_service:
            raise HoldRefused("full", f"{self.max_per_service} requests already wait for a replica of "
                              f"{service}", self.retry_after_s)
        start = time.monotonic()
        self._add(service, 1)
        try:
            while not available():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise HoldRefused("timeout", f"no ready replica of {service} within "
                                      f"{self.timeout_s:g} s", self.retry_after_s)
                try:
                    await asyncio.wait_for(changed().wait(), min(left, 1.0))
                except asyncio.TimeoutError:
                    pass
            return time.monotonic() - start
        finally:
            self._add(service, -1)

    def _add(self, service: str, delta: int) -> None:
        count = self.counts.get(service, 0) + delta
        if count:
            self.counts[service] = count
        else:
            self.counts.pop(service, None)
        self.on_change(service, count)
