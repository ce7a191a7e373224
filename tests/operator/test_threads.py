"""An SLO edit's reconcile never queues behind the control loop's background work (`operator/threads.py`).

The operator is started as kopf starts it (`handlers.configure`); a wave of control-step status writes
is held in the API server (here: blocked until released) while an InferenceService's spec update is
handled. Before the control loop had its own threads, the wave filled asyncio's default executor and the
reconcile waited for all of it."""
from __future__ import annotations

import asyncio
import threading

import kopf
import pytest

from specfleet.operator import handlers, threads
from specfleet.operator.control.runner import ControlOutcome

from tests.operator.fake_kube import BASE, FakeKube, body

WAVE = 40                   # control steps publishing at once (the scheduler runs up to 32 steps at a time)


class HeldStatusKube(FakeKube):
    """Holds the wave's status writes (services `svc-N`) until `release` is set; records each writer."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()
        self.writers: list[str] = []

    def patch_service_status(self, namespace, name, patch, resource_version=None):
        self.writers.append(threading.current_thread().name)
        if name.startswith("svc-"):
            assert self.release.wait(30), "the wave was never released"

    def post_event(self, *args):
        pass

    def forbidden(self, exc):
        return None


def _service(index: int) -> dict:
    return {**body(BASE), "metadata": {"name": f"svc-{index}", "namespace": "ns", "uid": f"u{index}",
                                       "generation": 1}}


async def _edit_during_a_wave_of_control_writes() -> HeldStatusKube:
    memo, kube = kopf.Memo(), HeldStatusKube()
    memo.kube = kube
    await handlers.configure(settings=kopf.OperatorSettings(), memo=memo)
    try:
        outcome = ControlOutcome({"desiredReplicas": 2}, [])
        wave = [asyncio.create_task(memo.scheduler.publish(_service(i), outcome)) for i in range(WAVE)]
        await asyncio.sleep(0.2)
        assert 0 < len(kube.writers) <= threads.CONTROL_THREADS       # the rest of the wave queues
        await asyncio.wait_for(handlers.reconcile_service(body=body(BASE), memo=memo), timeout=10)
        kube.release.set()
        await asyncio.wait_for(asyncio.gather(*wave), timeout=30)
    finally:
        kube.release.set()
        await handlers.close(memo=memo)
    return kube


def test_an_edit_is_reconciled_while_a_wave_of_control_status_writes_waits_on_the_api_server():
    kube = asyncio.run(_edit_during_a_wave_of_control_writes())
    reconciled = [name for name in kube.writers if not name.startswith("specfleet-control")]
    assert len(reconciled) == 1 and len(kube.writers) == WAVE + 1
    assert kube.objects, "the edit's reconcile wrote the service's workload"


@pytest.mark.parametrize("call", [threads.in_control_thread, threads.in_parse_thread])
def test_each_kind_of_background_work_has_threads_of_its_own(call):
    name = asyncio.run(call(lambda: threading.current_thread().name))
    assert name.startswith("specfleet-control" if call is threads.in_control_thread else "specfleet-parse")
