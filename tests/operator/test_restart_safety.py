"""Restarting or upgrading the operator over a running fleet leaves every object it rendered alone.

The real operator (`specfleet operator run -A`) over the API emulator and the fleet of
tests/operator/fixtures/fleet_state.py (GPU services, a CPU service with a live stand-in engine, a
PlanOnly service, one at zero replicas). Writes are counted from the emulator's own event history
between two points, so a write that changes anything shows as a MODIFIED event (the emulator, like
kube-apiserver, stores no event for a write that changes nothing).

What may be written after a restart: the status of `chat`, whose control loop reports every interval
(`observed`, `errorBudget`, condition messages) as it did before the restart. Nothing else: no owned
object (Deployment, Service, PDB, NetworkPolicy, Secret), no pod, no InferenceService's spec, metadata
or annotations (kopf's included), no other status, no condition transition, no speculation switch.
"""
from __future__ import annotations

import datetime as dt
import importlib.util
import json
import signal
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("specfleet.cluster.apiserver", reason="the API emulator is not available")

from specfleet.operator.plan_pinning import REPLAN  # noqa: E402

pytestmark = pytest.mark.slow

_spec = importlib.util.spec_from_file_location("fleet_state", Path(__file__).parent / "fixtures/fleet_state.py")
fs = sys.modules.setdefault("fleet_state", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(fs)

INTERVALS_AFTER_RESUME = 3          # control intervals (1 s each) the restarted operator runs before the checks


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("restart")
    with fs.stand_ins() as (engines, ports), fs.cluster(tmp) as c:
        op = fs.Operator(c.env, tmp / "operator.log")
        op.start()
        try:
            fs.build(c, ports)
            yield c, op, engines
        finally:
            op.stop(signal.SIGTERM)
            print(op.log.read_text()[-3000:])


def _meta(obj: dict) -> dict:
    return {k: v for k, v in obj["metadata"].items() if k not in ("resourceVersion", "managedFields")}


def _seconds(iso: str) -> float:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def writes_since(c, rv: int) -> list:
    """Every stored change in the fleet's namespace after resourceVersion `rv` (Events aside)."""
    return [e for e in list(c.store.history) if e.rv > rv and e.key != "/events"
            and (e.obj.get("metadata") or {}).get("namespace") == fs.NS]


def assert_only_live_status_writes(events: list, live: set[str]) -> None:
    """No write but the status of a service in `live`; none of those moves a condition's status."""
    for e in events:
        what = f"{e.type} {e.key} {e.obj['metadata']['name']}"
        assert e.key == fs.IS_KEY and e.type == "MODIFIED" and e.obj["metadata"]["name"] in live, what
        assert _meta(e.obj) == _meta(e.old) and e.obj.get("spec") == e.old.get("spec"), what
        before = {cd["type"]: cd for cd in e.old["status"].get("conditions", [])}
        for cd in e.obj["status"].get("conditions", []):
            old = before.get(cd["type"])
            assert old is None or (old["status"], old["lastTransitionTime"]) == (
                cd["status"], cd["lastTransitionTime"]), f"{what}: {old} -> {cd}"


def assert_owned_untouched(before: dict, after: dict) -> None:
    assert after.keys() == before.keys()
    for key, obj in before.items():
        now = after[key]
        assert now["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"], key
        assert now["metadata"].get("generation") == obj["metadata"].get("generation"), key
        if key[0] == "Deployment":
            assert json.dumps(now["spec"]["template"]) == json.dumps(obj["spec"]["template"]), key
        assert now == obj, key


CARRIED = ("observedGeneration", "phase", "plan", "desiredReplicas", "replicas", "readyReplicas", "selector",
           "lastDecisions", "plannedActions", "calibration")


def assert_status_carried(before: dict, after: dict, live: set[str]) -> None:
    """Plan, replicas, decisions, actions and every condition (lastTransitionTime too) as they were;
    services without a running loop: their whole status."""
    assert after.keys() == before.keys()
    for name, svc in before.items():
        old, new = svc.get("status") or {}, after[name].get("status") or {}
        assert {k: new.get(k) for k in CARRIED} == {k: old.get(k) for k in CARRIED}, name
        stamps = lambda s: {cd["type"]: (cd["status"], cd["lastTransitionTime"]) for cd in s["conditions"]}  # noqa: E731
        assert stamps(new) == stamps(old), name
        if name not in live:
            assert new == old and _meta(after[name]) == _meta(svc), name


def assert_budget_carried(old: dict, new: dict) -> None:
    """The error budget's windows went on from where they were: the history spans the restart and the
    longest window holds at least the requests it held before (a reset would start both from zero)."""
    elapsed = _seconds(new["asOf"]) - _seconds(old["asOf"])
    assert new["historySeconds"] >= old["historySeconds"] + elapsed - 1.5, (old, new)
    assert new["windows"]["6h"]["served"] >= old["windows"]["6h"]["served"] - 0.002, (old, new)
    assert new["attainment"]["6h"] == pytest.approx(old["attainment"]["6h"], abs=0.002)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_a_restarted_operator_writes_nothing_and_carries_every_status_over(live, sig):
    c, op, engines = live
    services, owned, mark = c.services(), c.owned(), c.store.rv
    budget, calls = services[fs.LIVE]["status"]["errorBudget"], sum(len(e.admin_calls) for e in engines)
    op.stop(sig)
    restarted = time.time()
    op.start()
    fs.wait_for(lambda: op.resumed(len(services)))
    fs.wait_for(lambda: _seconds(c.services()[fs.LIVE]["status"]["errorBudget"]["asOf"])
                >= restarted + INTERVALS_AFTER_RESUME)
    assert_only_live_status_writes(writes_since(c, mark), {fs.LIVE})
    assert_owned_untouched(owned, c.owned())
    assert_status_carried(services, c.services(), {fs.LIVE})
    assert_budget_carried(budget, c.services()[fs.LIVE]["status"]["errorBudget"])
    assert sum(len(e.admin_calls) for e in engines) == calls          # no speculation switch on any pod


def test_an_upgrade_from_the_stored_release_state_changes_no_pod_template(tmp_path):
    """tests/operator/fixtures/fleet_state.json (what the previous release rendered and wrote) loaded into a
    fresh emulator, then the current operator: it resumes every service and writes no owned object, until a
    user asks for one service to be planned afresh (`specfleet.io/replan`): then that Deployment alone moves."""
    state = json.loads(fs.FIXTURE.read_text())
    with fs.cluster(tmp_path) as c:
        fs.load(c, state)
        services, owned, mark = c.services(), c.owned(), c.store.rv
        assert len(services) == len(fs.fleet()) and any(k[0] == "Deployment" for k in owned)
        op = fs.Operator(c.env, tmp_path / "operator.log")
        op.start()
        try:
            fs.wait_for(lambda: op.resumed(len(services)))
            time.sleep(INTERVALS_AFTER_RESUME)
            changed = [e for e in writes_since(c, mark) if e.key != fs.IS_KEY]
            assert not changed, [(e.type, e.key, e.obj["metadata"]["name"]) for e in changed]
            assert_owned_untouched(owned, c.owned())
            assert_only_live_status_writes(writes_since(c, mark), set(services))
            assert_status_carried(services, c.services(), set())
            assert_replan_rolls_only_the_annotated_service(c, services)
        finally:
            op.stop(signal.SIGTERM)
            print(op.log.read_text()[-3000:])


def assert_replan_rolls_only_the_annotated_service(c, services: dict) -> None:
    """`kubectl annotate ... specfleet.io/replan=1` on code-8b: the current pricing plans it afresh (its
    Deployment's arguments follow), the status records the request, and no other service's objects move."""
    mark = c.store.rv
    c.kubectl("annotate", "inferenceservice", "code-8b", "-n", fs.NS, f"{REPLAN}=1")
    fs.wait_for(lambda: c.services()["code-8b"]["status"].get("replanned") == "1")
    plan = c.services()["code-8b"]["status"]["plan"]
    assert plan["maxNumSeqs"] != services["code-8b"]["status"]["plan"]["maxNumSeqs"]
    args = c.deployment("code-8b")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-num-seqs") + 1] == str(plan["maxNumSeqs"])
    moved = {(e.key, e.obj["metadata"]["name"]) for e in writes_since(c, mark) if e.key != fs.IS_KEY}
    assert moved == {("apps/deployments", "code-8b")}, moved
    reasons = [e.get("reason") for e in c.store.list("/events", fs.NS)
               if e.get("involvedObject", {}).get("name") == "code-8b"]
    assert "Replanned" in reasons
