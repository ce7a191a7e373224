"""kopf's per-object workers are capped (`handlers.worker_limit`): a burst of creates waits as raw events
instead of holding every handler in memory at once, and every object is still reconciled, the ones beyond
the cap as slots free up.

The burst runs against the real operator (`specfleet operator run`) and the API emulator, with a cap of 2
so that most of the burst has to wait for a slot."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from specfleet.operator import api, handlers

pytest.importorskip("specfleet.cluster.apiserver", reason="the API emulator (specfleet.cluster.apiserver) "
                    "is not available")
from specfleet.cluster.apiserver import running_apiserver  # noqa: E402

from tests.operator.operator_kit import NS, ROOT, Cluster, Operator, example, wait_for  # noqa: E402

BURST = 8


def test_the_worker_limit_comes_from_the_environment_and_must_be_positive():
    assert handlers.worker_limit({}) == handlers.DEFAULT_WORKER_LIMIT
    assert handlers.worker_limit({"SPECFLEET_WORKER_LIMIT": "2"}) == 2
    with pytest.raises(ValueError, match="at least 1"):
        handlers.worker_limit({"SPECFLEET_WORKER_LIMIT": "0"})


def test_a_burst_larger_than_the_worker_limit_is_reconciled_whole(tmp_path: Path):
    with running_apiserver(tmp_path / "kubeconfig", port=0) as server:
        cluster = Cluster(Path(server.kubeconfig))
        cluster.kubectl("apply", "-f", str(ROOT / "crds/inferenceservice.yaml"))
        cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        wait_for(lambda: cluster.kubectl("get", "infsvc", "-n", NS, check=False).returncode == 0)
        operator = Operator({**cluster.env, "SPECFLEET_WORKER_LIMIT": "2"}, tmp_path / "operator.log")
        operator.start()
        try:
            names = [f"burst-{i}" for i in range(BURST)]

            def create(name: str) -> None:
                cluster.custom.create_namespaced_custom_object(api.GROUP, api.VERSION, NS, api.PLURAL,
                                                               example(name))
            with ThreadPoolExecutor(BURST) as pool:
                list(pool.map(create, names))

            def reconciled() -> list[str]:
                done = [n for n in names if (cluster.service(n).get("status") or {}).get("plan")
                        and cluster.deployment(n) is not None]
                if len(done) < BURST:
                    raise AssertionError(f"reconciled so far: {done}")     # wait_for polls on, and reports it
                return done
            wait_for(reconciled, timeout=60, every=0.5)
            assert operator.alive()
        finally:
            operator.stop()
