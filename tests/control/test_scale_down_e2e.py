"""Scale-down through the API emulator: the real operator (control interval 1 s) lowers a 3-replica
service with little load to its minimum of 2, and before it lowers `spec.replicas` it has set
`controller.kubernetes.io/pod-deletion-cost` on every pod, the least loaded lowest. "Before" is read
from the emulator's one global resourceVersion counter: every pod's annotation was written at a lower
version than the Deployment's scale. Stand-in engines and Pods as in test_loop_e2e.py."""
from __future__ import annotations

import pytest

pytest.importorskip("specfleet.cluster.apiserver", reason="the API emulator is not available")

from specfleet.operator.control.scale_down import DELETION_COST  # noqa: E402

from .test_loop_e2e import operator_for, wait_for  # noqa: E402

NS = "sd"


def test_the_least_loaded_pods_are_marked_before_the_deployment_scales_down(tmp_path, fake_engine_pods):
    engines, urls = fake_engine_pods(3)
    for engine, (batch, waiting) in zip(engines, ((6.0, 1.0), (0.0, 0.0), (2.0, 0.0))):
        engine.set(rps=0.02, batch=batch, waiting=waiting, alpha=0.86)
    env = {"SPECFLEET_CONTROL_INTERVAL": "1", "SPECFLEET_DETECT_INTERVAL": "0"}
    autoscaling = {"minReplicas": 2, "maxReplicas": 4, "scaleUpStabilizationSeconds": 0,
                   "scaleDownStabilizationSeconds": 0}
    with operator_for(tmp_path, urls, NS, env, autoscaling) as (apps, core, custom):
        wait_for(lambda: apps.read_namespaced_deployment("chat", NS))
        apps.patch_namespaced_deployment("chat", NS, {"spec": {"replicas": 3}})
        apps.patch_namespaced_deployment_status("chat", NS, {"status": {"replicas": 3, "readyReplicas": 3}})
        scaled = wait_for(lambda: (d := apps.read_namespaced_deployment("chat", NS)).spec.replicas < 3 and d,
                          timeout=60)
        pods = {p.metadata.name: p for p in core.list_namespaced_pod(NS).items}
        costs = {name: int((p.metadata.annotations or {})[DELETION_COST]) for name, p in pods.items()}
        assert scaled.spec.replicas == 2
        assert costs == {"chat-pod-1": -1, "chat-pod-2": 1, "chat-pod-0": 2}     # the idle one goes, busiest last
        assert max(int(p.metadata.resource_version) for p in pods.values()) < int(scaled.metadata.resource_version)


def test_a_lowered_fixed_replica_count_also_removes_the_least_loaded_pods(tmp_path, fake_engine_pods):
    """`kubectl scale infsvc` (a fixed spec.replicas lowered): the reconcile marks the pods first too."""
    engines, urls = fake_engine_pods(3)
    for engine, (batch, waiting) in zip(engines, ((6.0, 1.0), (0.0, 0.0), (2.0, 0.0))):
        engine.set(rps=0.02, batch=batch, waiting=waiting, alpha=0.86)
    env = {"SPECFLEET_CONTROL_INTERVAL": "1", "SPECFLEET_DETECT_INTERVAL": "0"}
    with operator_for(tmp_path, urls, NS, env, {"minReplicas": 1, "maxReplicas": 4}) as (apps, core, custom):
        def set_replicas(n: int) -> None:
            custom.patch_namespaced_custom_object("specfleet.io", "v1alpha1", NS, "inferenceservices", "chat",
                                                  {"spec": {"replicas": n}})
        set_replicas(3)
        wait_for(lambda: apps.read_namespaced_deployment("chat", NS).spec.replicas == 3, timeout=30)
        apps.patch_namespaced_deployment_status("chat", NS, {"status": {"replicas": 3, "readyReplicas": 3}})
        wait_for(lambda: custom.get_namespaced_custom_object("specfleet.io", "v1alpha1", NS, "inferenceservices",
                                                             "chat").get("status", {}).get("readyReplicas") == 3)
        set_replicas(1)
        scaled = wait_for(lambda: (d := apps.read_namespaced_deployment("chat", NS)).spec.replicas == 1 and d,
                          timeout=30)
        pods = {p.metadata.name: p for p in core.list_namespaced_pod(NS).items}
        costs = {name: int((p.metadata.annotations or {})[DELETION_COST]) for name, p in pods.items()}
        assert costs == {"chat-pod-1": -2, "chat-pod-2": -1, "chat-pod-0": 1}     # idle, then light; busiest stays
        assert max(int(p.metadata.resource_version) for p in pods.values()) < int(scaled.metadata.resource_version)
