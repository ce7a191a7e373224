"""Surge detection end to end: the real operator against the API emulator with a long control interval
(10 s) and a 1 s detection interval, so a flash crowd is met by the detection timer
(`handlers.detect_surge`) before the next interval. Stand-in engine pods as in test_loop_e2e.py, here
also counting ended requests (conservation, which detection needs)."""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from test_loop_e2e import events, operator_for, service, wait_for  # noqa: E402

NS = "surge"
INTERVAL_S = 10.0


def test_a_flash_crowd_is_scaled_up_by_detection_before_the_next_interval(tmp_path, fake_engine_pods):
    engines, urls = fake_engine_pods(1)
    for e in engines:
        e.set(rps=0.2, report_ended=True)       # well within one replica of this CPU model (~0.75 req/s)
    env = {"SPECFLEET_CONTROL_INTERVAL": str(INTERVAL_S), "SPECFLEET_DETECT_INTERVAL": "1"}
    autoscaling = {"minReplicas": 1, "maxReplicas": 8, "scaleUpStabilizationSeconds": 30,
                   "scaleDownStabilizationSeconds": 600}
    with operator_for(tmp_path, urls, NS, env, autoscaling) as (apps, core, custom):
        # The first decision (two scrapes, one interval apart) gives detection its baseline.
        wait_for(lambda: service(custom, NS)["status"].get("observed", {}).get("requestsPerSecond") is not None,
                 timeout=4 * INTERVAL_S)
        start = apps.read_namespaced_deployment("chat", NS).spec.replicas
        raised = time.monotonic()
        for e in engines:
            e.set(rps=60.0)
        scaled = wait_for(lambda: (n := apps.read_namespaced_deployment("chat", NS).spec.replicas) > start and n,
                          timeout=INTERVAL_S)
        took = time.monotonic() - raised
        decision = wait_for(lambda: next((d for d in service(custom, NS)["status"].get("lastDecisions") or []
                                          if d["kind"] == "scale"), None))
        assert decision["reason"] == "LoadSurge" and int(decision["to"]) == scaled, decision
        assert took < INTERVAL_S, took
        surge = wait_for(lambda: events(core, "ScaleUp", NS))
        assert "LoadSurge" in surge[0]["message"] and "req/s" in surge[0]["message"], surge[0]
