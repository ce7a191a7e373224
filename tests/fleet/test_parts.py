"""The node agent's and the gateway's pure parts: rolling-update arithmetic, path/port translation, routing."""
from __future__ import annotations

from pathlib import Path

import aiohttp
from aiohttp import web

from specfleet.cluster.gateway import AFFINITY_SLACK, Endpoint, Gateway, Route, prefix_key, routes_from
from specfleet.cluster.node_agent import controller as ctl
from specfleet.cluster.node_agent import volumes as vol
from testkit import free_port


def test_rolling_update_surges_one_new_pod_then_retires_old_ones_only_when_new_ones_are_ready():
    # desired 2, maxSurge 1, maxUnavailable 0; old RS has 2 ready pods
    assert ctl.scale_plan(2, 1, 0, (0, 0), [(2, 2, 0)]) == (1, [2])
    assert ctl.scale_plan(2, 1, 0, (1, 0), [(2, 2, 0)]) == (1, [2])      # new pod not ready: keep old
    assert ctl.scale_plan(2, 1, 0, (1, 1), [(2, 2, 0)]) == (1, [1])      # one ready: one old goes
    assert ctl.scale_plan(2, 1, 0, (1, 1), [(1, 1, 0)]) == (2, [1])
    assert ctl.scale_plan(2, 1, 0, (2, 2), [(1, 1, 0)]) == (2, [0])
    assert ctl.scale_plan(3, 1, 0, (0, 0), []) == (3, [])


def test_not_ready_old_pods_go_at_once():
    assert ctl.scale_plan(1, 1, 0, (1, 0), [(1, 0, 1)]) == (1, [0])


def test_mount_paths_in_args_and_env_become_local_folders():
    mounts = vol.mount_map({}, {"volumeMounts": [{"name": "tmp", "mountPath": "/tmp"},
                                                 {"name": "token", "mountPath": "/var/run/admin"}]},
                           {"tmp": Path("/s/tmp"), "token": Path("/s/token")})
    assert vol.translate("/var/run/admin/token", mounts) == "/s/token/token"
    assert vol.translate("--admin-token-file=/var/run/admin/token", mounts) == "--admin-token-file=/s/token/token"
    assert vol.translate("/tmp", mounts) == "/s/tmp" and vol.translate("/tmpfoo", mounts) == "/tmpfoo"


def test_port_flags_point_at_the_assigned_local_port():
    assert vol.rewrite_ports(["--port", "8000", "--x", "1"], {8000: 41001}, 41001) == ["--port", "41001", "--x", "1"]
    assert vol.rewrite_ports(["--port=8000"], {8000: 41001}, 41001) == ["--port=41001"]


def test_pods_get_their_local_port_as_container_port_and_endpoint_annotation():
    rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "svc-abc", "namespace": "ns", "uid": "u"},
          "spec": {"template": {"metadata": {"labels": {"a": "b"}, "annotations": {"prometheus.io/port": "8000"}},
                                "spec": {"containers": [{"name": "engine", "ports": [{"name": "http",
                                                                                      "containerPort": 8000}]}]}}}}
    pod = ctl.pod_for(rs, "node", set())
    port = pod["spec"]["containers"][0]["ports"][0]["containerPort"]
    assert port != 8000 and pod["spec"]["nodeName"] == "node"
    assert pod["metadata"]["annotations"]["specfleet.io/endpoint"] == f"http://127.0.0.1:{port}"
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "u"


def _gateway(*urls: str) -> Gateway:
    g = Gateway("http://unused")
    g.routes = {"m": Route("ns", "svc", "m", [Endpoint(u, u) for u in urls])}
    return g


def test_the_same_prefix_sticks_to_one_pod_until_it_is_busier_than_the_slack():
    g = _gateway("a", "b", "c")
    key = prefix_key({"messages": [{"role": "user", "content": "same long system prompt"}]})
    first = g.pick("m", key, set())
    assert all(g.pick("m", key, set()) == first for _ in range(10))
    g.outstanding[first.url] = AFFINITY_SLACK + 1
    assert g.pick("m", key, set()) != first


def test_without_a_prefix_the_least_loaded_pod_wins_and_tried_pods_are_skipped():
    g = _gateway("a", "b")
    g.outstanding = {"a": 3, "b": 1}
    assert g.pick("m", None, set()).url == "b"
    assert g.pick("m", None, {"b"}).url == "a"
    assert g.pick("m", None, {"a", "b"}) is None


def test_routes_follow_the_service_selector_and_only_ready_pods():
    isvc = {"metadata": {"name": "svc", "namespace": "ns"}, "spec": {"model": {"name": "m"}}}
    service = {"metadata": {"name": "svc", "namespace": "ns"},
               "spec": {"selector": {"app": "svc"}, "ports": [{"targetPort": "http"}]}}

    def pod(name, ready, labels={"app": "svc"}):
        return {"metadata": {"name": name, "namespace": "ns", "labels": labels},
                "spec": {"containers": [{"ports": [{"name": "http", "containerPort": 9000 + len(name)}]}]},
                "status": {"podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": str(ready)}]}}

    routes = routes_from([isvc], [service], [pod("p", True), pod("pp", False), pod("ppp", True, {"app": "x"})])
    assert [e.url for e in routes["m"].endpoints] == ["http://127.0.0.1:9001"]


def test_the_pod_with_the_shortest_prefill_queue_wins_over_the_least_outstanding():
    """A pod that just became ready holds nothing, but once prompts queue there for prefill the
    others (busy decoding, nothing waiting) take the next requests."""
    g = _gateway("busy", "new")
    g.outstanding = {"busy": 40, "new": 3}
    g.waiting = {"busy": 0.0, "new": 3.0}
    assert g.pick("m", None, set()).url == "busy"
    g.waiting = {"busy": 0.0, "new": 0.0}
    assert g.pick("m", None, set()).url == "new"
    g.sent = {"new": 2}                                  # sent since the last poll: likely still waiting
    assert g.pick("m", None, set()).url == "busy"


async def test_the_queue_poll_reads_the_engine_s_waiting_gauge_and_unknown_is_not_zero():
    exposition = ('# TYPE vllm:num_requests_waiting gauge\n'
                  'vllm:num_requests_waiting{model_name="m"} 4.0\nvllm:num_requests_running{model_name="m"} 9.0\n')
    app = web.Application()
    app.router.add_get("/metrics", lambda _r: web.Response(text=exposition))
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    g, url, dead = Gateway("http://unused"), f"http://127.0.0.1:{port}", f"http://127.0.0.1:{free_port()}"
    g.session = aiohttp.ClientSession()
    try:
        g.sent = {url: 3, dead: 2}
        assert await g._waiting_of(url) == 4.0 and url not in g.sent       # the engine counts those now
        assert await g._waiting_of(dead) is None and g.sent[dead] == 2      # unreadable: keep our own count
    finally:
        await g.session.close()
        await runner.cleanup()
