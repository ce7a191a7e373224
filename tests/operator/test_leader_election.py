"""Operator high availability end to end: two real `specfleet operator run -A --leader-elect` processes
against the API emulator, a 3 s Lease (renew deadline 2 s, retry 0.5 s), under a stream of SLO edits and
`spec.replicas` changes (tests/failover.py). `kill -9` of the leader: the follower takes over once the
Lease expires, the last edit reaches the Deployment and status, and nothing is done twice. SIGTERM of
the leader: it releases the Lease and the follower takes over at its next attempt.

One fleet for the module; the tests run in file order (kill, restart as follower, stop).
"""
from __future__ import annotations

import signal
import time

import pytest

pytest.importorskip("specfleet.cluster.apiserver", reason="the API emulator is not available")
import failover  # noqa: E402  (tests/failover.py)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ha")
    with failover.Fleet(tmp) as f:
        try:
            f.start("op-a")
            assert f.wait_leading() == "op-a"
            f.start("op-b")
            f.wait_following("op-b")
            yield f
        finally:
            for name in f.names:
                path = tmp / f"{name}.log"
                print(f"--- {name}\n" + (path.read_text()[-3000:] if path.exists() else "(no log)"))


def test_one_replica_leads_and_the_other_follows_healthy(fleet):
    assert fleet.holder() == "op-a"
    a, b = fleet.replicas["op-a"], fleet.replicas["op-b"]
    assert a.leader_gauge() == 1.0 and b.leader_gauge() == 0.0
    assert a.health()["leader"] is True                     # kopf's /healthz with the leader probe
    assert b.health() == {"leader": False, "identity": "op-b", "holder": "op-a"}
    lease = fleet.lease()
    assert lease["leaseDurationSeconds"] == failover.DURATION_S and lease["acquireTime"] and lease["renewTime"]


def test_kill_9_of_the_leader_under_edits_loses_nothing_and_does_nothing_twice(fleet):
    outcome = fleet.edit_stream(edits=8, kill_at=3, sig=signal.SIGKILL)
    print(outcome)
    assert (outcome.old, outcome.new) == ("op-a", "op-b")
    # expiry judged from the follower's last sight of a renewal: at most a duration and two retry periods
    assert outcome.takeover_s <= failover.DURATION_S + 2 * failover.RETRY_S + 0.5, outcome
    assert outcome.takeover_s >= failover.DURATION_S - failover.RETRY_S - 0.5, outcome     # no early takeover
    assert outcome.transitions == 1
    assert outcome.lost == 0
    assert outcome.deployment_writes <= outcome.edits and outcome.revisits == 0, outcome
    assert outcome.duplicate_switches == 0, [s.calls for s in fleet.stand_ins]
    assert sum(len(s.calls) for s in fleet.stand_ins) > 0      # speculation did follow the plans
    assert fleet.replicas["op-b"].leader_gauge() == 1.0


def test_a_restarted_replica_follows_the_new_leader(fleet):
    fleet.start("op-a")
    fleet.wait_following("op-a")
    assert fleet.holder() == "op-b"
    assert fleet.replicas["op-a"].health()["holder"] == "op-b"


def test_sigterm_releases_the_lease_and_the_follower_takes_over_in_about_a_retry_period(fleet):
    outcome = fleet.edit_stream(edits=5, kill_at=2, sig=signal.SIGTERM)
    print(outcome)
    assert (outcome.old, outcome.new) == ("op-b", "op-a")
    assert outcome.takeover_s < failover.DURATION_S - failover.RETRY_S, outcome     # well before expiry
    assert outcome.lost == 0 and outcome.duplicates == 0, outcome
    stopped = fleet.replicas["op-b"].proc
    assert stopped.wait(20) == 0                               # a clean exit, not the lost-leadership one


def test_a_leader_that_cannot_renew_exits_before_anyone_may_take_over(fleet):
    from specfleet.operator.main import EXIT_LEADERSHIP_LOST

    leader = fleet.wait_leading()
    other = next(n for n in fleet.names if n != leader)
    fleet.start(other)
    fleet.wait_following(other)
    fleet.faults("POST", {"method": "PUT", "path": f"/leases/{failover.LEASE}", "status": 503, "count": 10_000})
    try:
        start = time.monotonic()
        code = fleet.replicas[leader].proc.wait(15)
        exited = time.monotonic() - start
    finally:
        fleet.faults("DELETE")
    assert code == EXIT_LEADERSHIP_LOST
    # its last renewal was at most a retry period before the fault: out within the renew deadline of it,
    # before the Lease may expire for the follower
    assert exited < failover.DURATION_S, exited
    assert "leadership lost" in fleet.replicas[leader].log.read_text()
    assert fleet.wait_leading() == other
