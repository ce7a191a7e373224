"""The node agent's and the gateway's pure parts: rolling-update arithmetic, path translation, the
engine's listen address, pod addresses, scheduling by requests, routing by podIP and container port."""
from __future__ import annotations

import os
import socket
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from specfleet.cluster import fleet
from specfleet.cluster.gateway import AFFINITY_SLACK, Balancer, Endpoint, Route, prefix_key, routes_from
from specfleet.cluster.gateway.queues import scrape
from specfleet.cluster.node_agent import addresses, scheduling
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


def test_the_engine_listens_on_the_pod_address_and_its_own_port_flags_are_kept():
    container = {"command": ["specfleet", "engine", "serve"], "args": ["--port", "8000", "--model", "/m"]}
    argv = vol.container_argv(container, [], "127.0.0.7")
    assert argv[-6:] == ["--port", "8000", "--model", "/m", "--host", "127.0.0.7"]
    pinned = vol.container_argv({**container, "args": ["--host=0.0.0.0"]}, [], "127.0.0.7")
    assert pinned[-1] == "--host=0.0.0.0"


def test_pods_keep_the_template_s_container_port_and_wait_for_the_scheduler():
    rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "svc-abc", "namespace": "ns", "uid": "u"},
          "spec": {"template": {"metadata": {"labels": {"a": "b"}, "annotations": {"prometheus.io/port": "8000"}},
                                "spec": {"containers": [{"name": "engine", "ports": [{"name": "http",
                                                                                      "containerPort": 8000}]}]}}}}
    pod = ctl.pod_for(rs)
    assert pod["spec"]["containers"][0]["ports"][0]["containerPort"] == 8000
    assert "nodeName" not in pod["spec"] and pod["metadata"]["annotations"] == {"prometheus.io/port": "8000"}
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "u"


def test_each_pod_gets_its_own_loopback_address_and_gives_it_back():
    pool = addresses.PodAddresses()
    first, second = pool.allocate("a", [8000]), pool.allocate("b", [8000])
    assert first != second and first.startswith("127.") and "127.0.0.1" not in (first, second)
    assert pool.allocate("a", [8000]) == first
    pool.release("a")
    assert pool.allocate("c", [8000]) == first


def test_an_address_whose_port_is_taken_is_skipped():
    pool = addresses.PodAddresses()
    ip = pool.allocate("probe", [])
    pool.release("probe")
    with socket.socket() as taken:
        taken.bind((ip, 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert pool.allocate("a", [port]) != ip


def test_two_fleets_never_share_an_address_while_a_server_is_still_starting():
    ours, theirs = addresses.PodAddresses(), addresses.PodAddresses()    # two `specfleet up` on one machine
    ip = ours.allocate("a", [8000])            # nothing listens yet: vLLM binds its port ~45 s after it starts
    assert theirs.allocate("b", [8000]) != ip
    ours.release("a")
    assert theirs.allocate("c", [8000]) == ip


def test_the_fleet_never_hands_out_the_gateway_s_port_or_one_it_gave_before(monkeypatch):
    offered = iter([9000, 9001, 9000, 9001, 9002])      # the kernel offers a just-released port again

    class Socket:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            self.port = next(offered)

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(fleet.socket, "socket", Socket)
    taken = {9000}                                      # the user's --port, which the gateway binds later
    assert [fleet.free_port("127.0.0.1", taken) for _ in range(2)] == [9001, 9002]
    assert taken == {9000, 9001, 9002}


def test_quantities_count_in_thousandths():
    assert [scheduling.milli(q) for q in ("2", "500m", 1.5, "1Ki", "1G")] == [2000, 500, 1500, 1024000, 10**12]
    with pytest.raises(scheduling.QuantityError):
        scheduling.milli("two")


def _pod(name: str, cpu: str, memory: str = "1Gi", created: str = "2026-01-01T00:00:00Z") -> dict:
    return {"metadata": {"name": name, "creationTimestamp": created},
            "spec": {"containers": [{"resources": {"requests": {"cpu": cpu, "memory": memory}}}]}}


def test_a_pod_that_does_not_fit_what_the_bound_pods_leave_stays_pending():
    node = {"cpu": 2000, "memory": 8 * 2**30 * 1000, "pods": 110_000}
    queue = scheduling.SchedulingQueue()
    decisions = scheduling.schedule(queue.order([_pod("late", "2", created="2026-01-02T00:00:00Z"), _pod("early", "1")]),
                                    [_pod("running", "500m")], node)
    assert [(d.pod["metadata"]["name"], d.fits) for d in decisions] == [("early", True), ("late", False)]
    assert decisions[1].message == "0/1 nodes are available: 1 Insufficient cpu."
    gpu = _pod("gpu", "1")
    gpu["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "1"
    assert "Insufficient nvidia.com/gpu" in scheduling.schedule([gpu], [], node)[0].message


def test_a_pod_that_waited_keeps_its_place_before_a_newer_one_created_in_the_same_second():
    """creationTimestamp has whole seconds: the queue, not the name, says which came first."""
    queue = scheduling.SchedulingQueue()
    waiting = _pod("web-zzz", "600m")
    assert queue.order([waiting]) == [waiting]
    replacement = _pod("web-aaa", "600m")             # same second, a name that sorts first
    assert [p["metadata"]["name"] for p in queue.order([replacement, waiting])] == ["web-zzz", "web-aaa"]
    assert queue.order([replacement]) == [replacement] and list(queue.entered) == ["web-aaa"]


def test_the_node_offers_this_machine_s_cpus_and_memory():
    allocatable = scheduling.machine_allocatable()
    assert allocatable["cpu"] == os.cpu_count() * 1000
    shown = scheduling.node_quantities(allocatable)
    assert shown["cpu"] == str(os.cpu_count()) and shown["memory"].endswith("Ki") and shown["pods"] == "110"


def _gateway(*urls: str) -> Balancer:
    return Balancer({"m": Route("ns", "svc", "m", [Endpoint(u, u) for u in urls])})


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
                "spec": {"containers": [{"ports": [{"name": "metrics", "containerPort": 9090},
                                                   {"name": "http", "containerPort": 8000}]}]},
                "status": {"podIP": f"127.0.0.{len(name) + 1}",
                           "conditions": [{"type": "Ready", "status": str(ready)}]}}

    routes = routes_from([isvc], [service], [pod("p", True), pod("pp", False), pod("ppp", True, {"app": "x"})])
    assert [e.url for e in routes["m"].endpoints] == ["http://127.0.0.2:8000"]


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
    g, url, dead = Balancer(), f"http://127.0.0.1:{port}", f"http://127.0.0.1:{free_port()}"
    session = aiohttp.ClientSession()
    try:
        g.sent = {url: 3, dead: 2}
        assert (await scrape(session, g, url))[0] == 4.0 and url not in g.sent       # the engine counts those now
        assert (await scrape(session, g, dead))[0] is None and g.sent[dead] == 2     # unreadable: keep our own count
    finally:
        await session.close()
        await runner.cleanup()
