"""The routing choice for LoRA adapters, on the pure layer: which service a `model` names, which of its pods
serve the adapter (read from their /metrics), and which pod takes the request."""
from __future__ import annotations

from specfleet.cluster.gateway.adapters import declared_adapters, served_adapters
from specfleet.cluster.gateway.routing import Balancer, Endpoint, Route, routes_from

ENGINE_METRICS = """# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
vllm:num_requests_waiting{model_name="base"} 0.0
# TYPE specfleet:lora_adapter_info gauge
specfleet:lora_adapter_info{lora_name="sql",model_name="base",parent="base"} 1.0
specfleet:lora_adapter_info{lora_name="chat-v2",model_name="base",parent="base"} 1.0
vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.7e+09
"""
VLLM_METRICS = ('vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b",waiting_lora_adapters="c"} '
                '1.7e+09\n')


def balancer(*routes: Route, served: dict[str, set[str]] | None = None) -> Balancer:
    g = Balancer({r.model: r for r in routes})
    g.served = {url: frozenset(names) for url, names in (served or {}).items()}
    return g


def route(service: str, model: str, *urls: str, adapters: tuple[str, ...] = (), namespace: str = "ns") -> Route:
    return Route(namespace, service, model, [Endpoint(u, u) for u in urls], adapters)


def test_served_adapters_are_read_from_the_engine_s_info_gauge_and_vllm_s_running_and_waiting_labels():
    assert served_adapters(ENGINE_METRICS) == {"sql", "chat-v2"}
    assert served_adapters(VLLM_METRICS) == {"a", "b", "c"}
    assert served_adapters("vllm:num_requests_waiting 0\n") == served_adapters("") == frozenset()


def test_declared_adapters_come_from_spec_adapters_and_their_absence_or_bad_shapes_mean_none():
    assert declared_adapters({"spec": {"adapters": [{"name": "sql", "source": "a/sql"}, {"name": "x", "rank": 8},
                                                    {"name": "sql", "source": "b"}]}}) == ("sql", "x")
    for spec in ({}, {"adapters": None}, {"adapters": "sql"}, {"adapters": [{"source": "a"}, "x", {"name": 3}]}):
        assert declared_adapters({"spec": spec}) == ()
    assert declared_adapters({"metadata": {}}) == ()


def test_routes_from_keep_each_service_s_declared_adapters():
    isvc = {"metadata": {"name": "svc", "namespace": "ns"},
            "spec": {"model": {"name": "base"}, "adapters": [{"name": "sql", "source": "adapters/sql"}]}}
    assert routes_from([isvc], [], [])["base"].adapters == ("sql",)


def test_a_model_resolves_to_a_base_model_then_a_declared_adapter_then_one_a_pod_serves_else_nothing():
    one = route("one", "base", "u1", adapters=("sql",))
    two = route("two", "other", "u2", adapters=("sql", "base"))      # "base" is a model's name: never an adapter
    g = balancer(one, two, served={"u2": {"loaded-by-hand"}})
    assert g.resolve("base") == (one, None) and g.resolve("other") == (two, None)
    assert g.resolve("sql") == (one, "sql")                          # declared twice: the first service by name
    assert g.resolve("loaded-by-hand") == (two, "loaded-by-hand")    # declared nowhere, but a pod serves it
    assert g.resolve("nope") is None
    g.served = {}
    assert g.resolve("loaded-by-hand") is None                      # the cache follows what the pods say


def test_pods_serving_the_adapter_win_even_when_busier_then_load_decides_among_them():
    g = balancer(route("svc", "base", "idle", "busy", "busier", adapters=("sql",)),
                 served={"busy": {"sql"}, "busier": {"sql"}})
    g.outstanding = {"idle": 0, "busy": 5, "busier": 9}
    assert {g.pick("base", None, set(), "sql").url for _ in range(10)} == {"busy"}
    assert g.pick("base", None, {"busy"}, "sql").url == "busier"
    assert g.pick("base", None, set()).url == "idle"                 # the base model: any pod


def test_while_no_pod_serves_a_declared_adapter_strict_finds_none_and_then_load_decides():
    g = balancer(route("svc", "base", "a", "b", adapters=("sql",)))
    g.outstanding = {"a": 4, "b": 1}
    assert g.pick("base", None, set(), "sql") is None                # wait for the operator to load it
    assert g.pick("base", None, set(), "sql", strict=False).url == "b"
    g.served = {"a": frozenset({"sql"})}
    assert g.pick("base", None, set(), "sql", strict=False).url == "a"   # a holder still wins when there is one


def test_a_pod_that_answered_it_lacks_the_adapter_is_not_preferred_until_the_next_poll():
    g = balancer(route("svc", "base", "a", "b"), served={"a": {"sql"}, "b": {"sql"}})
    g.outstanding = {"a": 0, "b": 3}
    g.forget("a", "sql")
    assert g.pick("base", None, set(), "sql").url == "b" and g.resolve("sql")[1] == "sql"
