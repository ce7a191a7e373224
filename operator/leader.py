"""Leader election through a `coordination.k8s.io/v1` Lease, with client-go's leaderelection semantics.

`Elector.try_acquire_or_renew` is one attempt, over a three-verb `LeaseClient` (get, create, update):
a free, released or expired Lease is claimed, a live one held by another replica is left alone, and a
write that loses the optimistic-concurrency race (409 on `resourceVersion`) means another replica won.
Expiry is judged on this replica's own monotonic clock, from when it last saw the record change
(`observed_at` + the record's `leaseDurationSeconds`), never by comparing another host's `renewTime`
with the local wall clock, so clock skew between nodes cannot cut a lease short.

The leader stops acting once `renewDeadline` has passed since the start of its last successful renewal
(`must_stop`), or at once when it sees another holder; `renewDeadline < leaseDuration` leaves the gap
in which it exits before any follower may take over. `Leadership` runs the renewals and a watchdog that
ends the leadership even while a renewal request hangs. `KubeLeases` is the I/O shell on the
`kubernetes` client (raw JSON, a timeout on every call).
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Protocol

log = logging.getLogger("specfleet.operator.leader")

DEFAULT_LEASE_NAME = "specfleet-operator"
DEFAULT_LEASE_NAMESPACE = "specfleet-system"
MICROTIME = "%Y-%m-%dT%H:%M:%S.%fZ"     # metav1.MicroTime, as the Lease's acquireTime and renewTime


@dataclass(frozen=True)
class ElectionConfig:
    """One replica's view of the election; defaults are controller-runtime's (15 s, 10 s, 2 s)."""

    identity: str
    name: str = DEFAULT_LEASE_NAME
    namespace: str = DEFAULT_LEASE_NAMESPACE
    lease_duration_s: int = 15
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not self.identity:
            raise ValueError("leader election needs an identity")
        if not self.lease_duration_s > self.renew_deadline_s > self.retry_period_s > 0:
            raise ValueError("need lease duration > renew deadline > retry period > 0, got "
                             f"{self.lease_duration_s} / {self.renew_deadline_s} / {self.retry_period_s}")


@dataclass(frozen=True)
class LeaseRecord:
    """The Lease's spec (and its resourceVersion; None for a record not yet stored)."""

    holder: str = ""
    duration_s: int = 0
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0
    resource_version: str | None = None

    @classmethod
    def from_body(cls, body: dict) -> "LeaseRecord":
        spec = body.get("spec") or {}
        return cls(spec.get("holderIdentity") or "", int(spec.get("leaseDurationSeconds") or 0),
                   spec.get("acquireTime"), spec.get("renewTime"), int(spec.get("leaseTransitions") or 0),
                   (body.get("metadata") or {}).get("resourceVersion"))

    def to_body(self, name: str, namespace: str) -> dict:
        meta = {"name": name, "namespace": namespace}
        if self.resource_version is not None:
            meta["resourceVersion"] = self.resource_version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                "spec": {"holderIdentity": self.holder, "leaseDurationSeconds": self.duration_s,
                         "acquireTime": self.acquire_time, "renewTime": self.renew_time,
                         "leaseTransitions": self.transitions}}


class LeaseConflict(Exception):
    """The write lost the race: the Lease exists already, or changed since it was read (409)."""


class LeaseUnavailable(Exception):
    """The API server gave no usable answer (timeout, refused connection, 5xx, 403)."""


class LeaseClient(Protocol):
    def get(self) -> LeaseRecord | None: ...

    def create(self, record: LeaseRecord) -> LeaseRecord: ...

    def update(self, record: LeaseRecord) -> LeaseRecord: ...


def micro_now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime(MICROTIME)


class Elector:
    """One replica's side of the election: attempts, what it last observed, and whether it leads."""

    def __init__(self, config: ElectionConfig, client: LeaseClient, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], str] = micro_now):
        self.config, self.client, self.clock, self.wall = config, client, clock, wall
        self.observed: LeaseRecord | None = None
        self.observed_at = 0.0
        self.renewed_at: float | None = None     # start of the last successful claim while leading
        self.lost = False                         # saw another holder while leading

    @property
    def leading(self) -> bool:
        return self.renewed_at is not None and not self.lost

    def must_stop(self, now: float) -> bool:
        """A leader that has not renewed within renewDeadline (or saw another holder) acts no more."""
        return self.renewed_at is not None and (self.lost or now - self.renewed_at >= self.config.renew_deadline_s)

    def holder(self) -> str:
        return self.observed.holder if self.observed else ""

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this replica holds the Lease now. API trouble is a failed attempt."""
        start = self.clock()
        try:
            won = self._attempt(start)
        except LeaseConflict:
            log.debug("lease %s: lost a race to another writer", self.config.name)
            won = False
        except LeaseUnavailable as exc:
            log.warning("lease %s/%s: %s", self.config.namespace, self.config.name, exc)
            won = False
        if won:
            self.renewed_at = start
        return won

    def release(self) -> bool:
        """Give the Lease up (holder cleared, duration 1 s) so a follower takes over at its next attempt."""
        if not self.leading or self.observed is None or self.observed.holder != self.config.identity:
            return False
        now = self.wall()
        released = replace(self.observed, holder="", duration_s=1, acquire_time=now, renew_time=now)
        self.renewed_at = None
        try:
            self._observe(self.client.update(released), self.clock())
        except (LeaseConflict, LeaseUnavailable) as exc:
            log.warning("lease %s: not released: %s", self.config.name, exc)
            return False
        return True

    def _attempt(self, start: float) -> bool:
        now = self.wall()
        current = self.client.get()
        if current is None:
            self._observe(self.client.create(self._claim(None, now)), start)
            return True
        self._observe(current, start)
        if current.holder and current.holder != self.config.identity and self._valid(start):
            self.lost = self.renewed_at is not None
            return False
        self._observe(self.client.update(self._claim(current, now)), start)
        return True

    def _claim(self, current: LeaseRecord | None, now: str) -> LeaseRecord:
        me, duration = self.config.identity, self.config.lease_duration_s
        if current is None:
            return LeaseRecord(me, duration, now, now, 0)
        if current.holder == me:
            return replace(current, duration_s=duration, renew_time=now, acquire_time=current.acquire_time or now)
        return replace(current, holder=me, duration_s=duration, acquire_time=now, renew_time=now,
                       transitions=current.transitions + 1)

    def _observe(self, record: LeaseRecord, at: float) -> None:
        """Remember when the record last changed (any write changes its resourceVersion)."""
        if self.observed is None or record.resource_version != self.observed.resource_version:
            self.observed, self.observed_at = record, at

    def _valid(self, now: float) -> bool:
        duration = self.observed.duration_s or self.config.lease_duration_s
        return self.observed_at + duration > now


def follow(elector: Elector, sleep: Callable[[float], object] = time.sleep,
           stopping: Callable[[], bool] = lambda: False) -> bool:
    """Block until this replica leads (True) or `stopping()` (False): one attempt every retry period."""
    last_holder = None
    while not stopping():
        if elector.try_acquire_or_renew():
            return True
        if elector.holder() != last_holder:
            last_holder = elector.holder()
            log.info("following: lease %s/%s is held by %s", elector.config.namespace, elector.config.name,
                     last_holder or "nobody")
        sleep(elector.config.retry_period_s)
    return False


class Leadership:
    """The leader's background threads: a renewal every retry period, and a watchdog that calls
    `on_lost` once `must_stop` (checked a few times a retry period, independent of a hung request)."""

    def __init__(self, elector: Elector, on_lost: Callable[[str], object]):
        self.elector, self.on_lost = elector, on_lost
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self._renew, name="lease-renew", daemon=True),
                        threading.Thread(target=self._watch, name="lease-watchdog", daemon=True)]

    def start(self) -> "Leadership":
        for thread in self.threads:
            thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join(timeout)

    def _renew(self) -> None:
        while not self.stopped.wait(self.elector.config.retry_period_s):
            self.elector.try_acquire_or_renew()
            if self.elector.must_stop(self.elector.clock()):
                return

    def _watch(self) -> None:
        tick = min(0.1, self.elector.config.retry_period_s / 4)
        while not self.stopped.wait(tick):
            if self.elector.must_stop(self.elector.clock()):
                cfg = self.elector.config
                why = (f"lease {cfg.namespace}/{cfg.name} is held by {self.elector.holder()}"
                       if self.elector.lost else
                       f"lease {cfg.namespace}/{cfg.name} not renewed within {cfg.renew_deadline_s:g} s")
                self.on_lost(why)
                return


class KubeLeases:
    """The three verbs on one Lease through the `kubernetes` client (raw JSON, a timeout on every call)."""

    def __init__(self, api_client, name: str, namespace: str, timeout: float):
        import urllib3
        from kubernetes import client

        self.api = client.CoordinationV1Api(api_client)
        self.name, self.namespace, self.timeout = name, namespace, timeout
        self.errors = (client.ApiException, urllib3.exceptions.HTTPError, OSError)

    @classmethod
    def from_environment(cls, config: ElectionConfig) -> "KubeLeases":
        """In-cluster service account if present, else KUBECONFIG; requests time out at half the renew
        deadline, so a leader gets a second try before it must stop."""
        from kubernetes import client
        from kubernetes import config as kube_config

        try:
            kube_config.load_incluster_config()
        except kube_config.ConfigException:
            kube_config.load_kube_config()
        return cls(client.ApiClient(), config.name, config.namespace, config.renew_deadline_s / 2)

    def get(self) -> LeaseRecord | None:
        try:
            response = self.api.read_namespaced_lease(self.name, self.namespace, _preload_content=False,
                                                      _request_timeout=self.timeout)
        except self.errors as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise self._error(exc) from exc
        return LeaseRecord.from_body(json.loads(response.data))

    def create(self, record: LeaseRecord) -> LeaseRecord:
        return self._write(self.api.create_namespaced_lease, self.namespace,
                           record.to_body(self.name, self.namespace))

    def update(self, record: LeaseRecord) -> LeaseRecord:
        return self._write(self.api.replace_namespaced_lease, self.name, self.namespace,
                           record.to_body(self.name, self.namespace))

    def _write(self, verb, *args) -> LeaseRecord:
        try:
            response = verb(*args, _preload_content=False, _request_timeout=self.timeout)
        except self.errors as exc:
            raise self._error(exc) from exc
        return LeaseRecord.from_body(json.loads(response.data))

    @staticmethod
    def _error(exc: BaseException) -> Exception:
        status = getattr(exc, "status", None)
        if status == 409:
            return LeaseConflict(str(getattr(exc, "reason", exc)))
        return LeaseUnavailable(f"{type(exc).__name__}: {status or ''} {str(exc)[:200]}".strip())
