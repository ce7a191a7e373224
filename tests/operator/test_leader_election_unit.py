"""The Lease election state machine (operator/leader.py) over an in-memory Lease with resourceVersion
checks, on a fake clock; and the leader's watchdog and release on real threads with short periods."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from specfleet.operator import leader
from specfleet.operator.leader import ElectionConfig, Elector, LeaseConflict, LeaseRecord, LeaseUnavailable

ROOT = Path(__file__).resolve().parents[2]


class FakeLeases:
    """One Lease as the API server keeps it: every write a new resourceVersion, a stale one a 409."""

    def __init__(self):
        self.record: LeaseRecord | None = None
        self.rv = 0
        self.down = False
        self.writes: list[LeaseRecord] = []

    def get(self) -> LeaseRecord | None:
        if self.down:
            raise LeaseUnavailable("connection refused")
        return self.record

    def create(self, record: LeaseRecord) -> LeaseRecord:
        if self.record is not None:
            raise LeaseConflict("already exists")
        return self._store(record)

    def update(self, record: LeaseRecord) -> LeaseRecord:
        if self.down:
            raise LeaseUnavailable("timed out")
        if self.record is None or record.resource_version != self.record.resource_version:
            raise LeaseConflict("the object has been modified")
        return self._store(record)

    def _store(self, record: LeaseRecord) -> LeaseRecord:
        self.rv += 1
        self.record = LeaseRecord(record.holder, record.duration_s, record.acquire_time, record.renew_time,
                                  record.transitions, str(self.rv))
        self.writes.append(self.record)
        return self.record


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def lease():
    return FakeLeases()


@pytest.fixture
def clock():
    return Clock()


def elector(name: str, lease: FakeLeases, clock: Clock, **config) -> Elector:
    cfg = ElectionConfig(name, **{"lease_duration_s": 15, "renew_deadline_s": 10, "retry_period_s": 2, **config})
    return Elector(cfg, lease, clock=clock, wall=lambda: f"t={clock.t:g}")


def test_a_missing_lease_is_created_and_held(lease, clock):
    a = elector("a", lease, clock)
    assert a.try_acquire_or_renew() and a.leading
    assert (lease.record.holder, lease.record.duration_s, lease.record.transitions) == ("a", 15, 0)
    assert lease.record.acquire_time == lease.record.renew_time == "t=100"


def test_a_live_holder_is_respected_until_its_lease_expires_by_the_followers_own_clock(lease, clock):
    a, b = elector("a", lease, clock), elector("b", lease, clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew() and not b.leading and b.holder() == "a"
    clock.t += 14.9                                 # a stopped renewing; b first saw the record at 100
    assert not b.try_acquire_or_renew()
    clock.t += 0.1
    assert b.try_acquire_or_renew() and b.leading
    assert (lease.record.holder, lease.record.transitions, lease.record.acquire_time) == ("b", 1, "t=115")


def test_a_renewal_seen_late_restarts_the_followers_wait(lease, clock):
    a, b = elector("a", lease, clock), elector("b", lease, clock)
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    clock.t += 10
    assert a.try_acquire_or_renew()                 # renewed at 110: a new resourceVersion
    clock.t += 6                                    # 16 s after b's first look, 6 after the renewal
    assert not b.try_acquire_or_renew()
    clock.t += 9
    assert not b.try_acquire_or_renew()             # b saw the renewal at 116: valid until 131
    clock.t += 6
    assert b.try_acquire_or_renew()


def test_a_fresh_follower_waits_a_whole_duration_whatever_the_renew_time_says(lease, clock):
    a = elector("a", lease, clock)
    a.try_acquire_or_renew()
    clock.t += 1000                                 # renewTime long past by anyone's wall clock
    b = elector("b", lease, clock)
    assert not b.try_acquire_or_renew()             # b has never seen it change: it waits 15 s from now
    clock.t += 15
    assert b.try_acquire_or_renew()


def test_the_holder_renews_keeping_acquire_time_and_transitions(lease, clock):
    a = elector("a", lease, clock)
    a.try_acquire_or_renew()
    clock.t += 2
    assert a.try_acquire_or_renew()
    assert (lease.record.acquire_time, lease.record.renew_time, lease.record.transitions) == ("t=100", "t=102", 0)
    assert a.renewed_at == 102


def test_an_update_conflict_is_a_lost_race(lease, clock):
    a, b, c = elector("a", lease, clock), elector("b", lease, clock), elector("c", lease, clock)
    for e in (a, b, c):
        e.try_acquire_or_renew()
    clock.t += 15
    real_update = lease.update

    def c_lands_first(record):                      # between b's read and b's write, c claims the lease
        lease.update = real_update
        assert c.try_acquire_or_renew()
        return real_update(record)

    lease.update = c_lands_first
    assert not b.try_acquire_or_renew() and not b.leading
    assert lease.record.holder == "c" and lease.record.transitions == 1


def test_two_followers_of_an_expired_lease_elect_exactly_one(lease, clock):
    a = elector("a", lease, clock)
    followers = [elector(n, lease, clock) for n in "bcd"]
    a.try_acquire_or_renew()
    for f in followers:
        f.try_acquire_or_renew()
    clock.t += 15
    won = [f.try_acquire_or_renew() for f in followers]
    assert won == [True, False, False] and lease.record.transitions == 1


def test_release_clears_the_holder_so_a_follower_takes_over_at_once(lease, clock):
    a, b = elector("a", lease, clock), elector("b", lease, clock)
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    assert a.release() and not a.leading
    assert (lease.record.holder, lease.record.duration_s) == ("", 1)
    assert b.try_acquire_or_renew()                 # no wait at all: nobody holds it
    assert (lease.record.holder, lease.record.transitions) == ("b", 1)
    assert not a.release()                          # not the holder: nothing to release, nothing written
    assert lease.writes[-1].holder == "b"


def test_the_leader_must_stop_after_the_renew_deadline_without_a_renewal(lease, clock):
    a = elector("a", lease, clock)
    a.try_acquire_or_renew()
    lease.down = True
    for _ in range(4):
        clock.t += 2
        assert not a.try_acquire_or_renew()
        assert not a.must_stop(clock())             # 8 s since the last renewal
    clock.t += 2
    assert a.must_stop(clock())                     # 10 s: the deadline, 5 s before anyone may take over


def test_the_leader_stops_at_once_when_another_holds_the_lease(lease, clock):
    a, b = elector("a", lease, clock), elector("b", lease, clock)
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    clock.t += 15                                   # a paused (GC, CPU starvation) for the whole duration
    assert b.try_acquire_or_renew()
    assert not a.try_acquire_or_renew()
    assert a.must_stop(clock()) and a.lost and not a.leading


def test_a_follower_never_must_stop(lease, clock):
    a, b = elector("a", lease, clock), elector("b", lease, clock)
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    clock.t += 100
    assert not b.must_stop(clock())


@pytest.mark.parametrize("duration, deadline, retry", [(10, 10, 2), (15, 10, 10), (15, 10, 0), (5, 10, 2)])
def test_the_config_needs_duration_above_deadline_above_retry(duration, deadline, retry):
    with pytest.raises(ValueError):
        ElectionConfig("a", lease_duration_s=duration, renew_deadline_s=deadline, retry_period_s=retry)


def test_follow_tries_every_retry_period_until_elected(lease, clock):
    a, b = elector("a", lease, clock), elector("b", lease, clock)
    a.try_acquire_or_renew()
    slept = []

    def sleep(s):
        slept.append(s)
        clock.t += s

    assert leader.follow(b, sleep=sleep)
    assert slept == [2] * 8 and clock.t == 116      # first look at 100, valid until 115, taken at 116


def test_the_watchdog_ends_leadership_while_a_renewal_hangs(lease):
    a = Elector(ElectionConfig("a", lease_duration_s=1, renew_deadline_s=0.4, retry_period_s=0.05), lease)
    assert a.try_acquire_or_renew()
    hung = threading.Event()

    def hang():                                     # a request that does not answer before the deadline
        hung.wait(10)
        raise LeaseUnavailable("timed out")

    lease.get = hang
    lost: list[tuple[str, float]] = []
    start = time.monotonic()
    running = leader.Leadership(a, lambda why: lost.append((why, time.monotonic() - start))).start()
    try:
        deadline = time.monotonic() + 3
        while not lost and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        hung.set()
        running.stop(timeout=2)
    assert lost and "not renewed within 0.4 s" in lost[0][0]
    assert 0.35 <= lost[0][1] < 0.9


def test_leadership_renews_every_retry_period(lease):
    a = Elector(ElectionConfig("a", lease_duration_s=1, renew_deadline_s=0.5, retry_period_s=0.05), lease)
    a.try_acquire_or_renew()
    lost: list[str] = []
    running = leader.Leadership(a, lost.append).start()
    time.sleep(0.6)
    running.stop(timeout=2)
    assert not lost and len(lease.writes) >= 5 and {w.holder for w in lease.writes} == {"a"}


def test_the_record_round_trips_through_the_lease_body():
    record = LeaseRecord("a", 15, "2025-01-01T00:00:00.000000Z", "2025-01-01T00:00:02.000000Z", 3, "42")
    body = record.to_body("specfleet-operator", "specfleet-system")
    assert body["metadata"] == {"name": "specfleet-operator", "namespace": "specfleet-system", "resourceVersion": "42"}
    assert body["spec"]["leaseTransitions"] == 3 and body["spec"]["holderIdentity"] == "a"
    assert LeaseRecord.from_body(body) == record


# -- the manifests that run two replicas under the election -------------------------------------------------
def _docs(name: str) -> list[dict]:
    import yaml

    return [d for d in yaml.safe_load_all((ROOT / "manifests" / name).read_text()) if d]


def test_the_operator_runs_two_elected_replicas_spread_over_nodes():
    deployment = next(d for d in _docs("operator.yaml") if d["kind"] == "Deployment")
    spec, pod = deployment["spec"], deployment["spec"]["template"]["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    container = pod["containers"][0]
    assert "--leader-elect" in container["args"]
    downward = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"] if "valueFrom" in e}
    assert downward == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]


def test_the_operator_pdb_keeps_one_replica_and_validates():
    import kubernetes_validate

    (pdb,) = _docs("operator-pdb.yaml")
    kubernetes_validate.validate(pdb, "1.32.0", strict=True)
    deployment = next(d for d in _docs("operator.yaml") if d["kind"] == "Deployment")
    assert pdb["spec"]["minAvailable"] == 1 and pdb["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert "operator-pdb.yaml" in _docs("kustomization.yaml")[0]["resources"]


def test_the_election_role_grants_exactly_what_the_election_uses():
    role = next(d for d in _docs("rbac.yaml") if d["kind"] == "Role")
    binding = next(d for d in _docs("rbac.yaml") if d["kind"] == "RoleBinding")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == leader.DEFAULT_LEASE_NAMESPACE
    granted = {(verb, tuple(rule.get("resourceNames") or ())) for rule in role["rules"] for verb in rule["verbs"]}
    assert all(rule["apiGroups"] == ["coordination.k8s.io"] and rule["resources"] == ["leases"]
               for rule in role["rules"])
    name = (leader.DEFAULT_LEASE_NAME,)
    assert granted == {("create", ()), ("get", name), ("update", name)}     # create cannot name its object
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "specfleet-operator",
                                    "namespace": "specfleet-system"}]


def test_the_lease_shell_uses_only_the_granted_verbs():
    import inspect

    source = inspect.getsource(leader.KubeLeases)
    used = {v for v in ("read", "create", "replace", "patch", "delete", "list") if f".{v}_namespaced_lease" in source}
    assert used == {"read", "create", "replace"}        # get, create, update
