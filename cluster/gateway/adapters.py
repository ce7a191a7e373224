"""LoRA adapters at the gateway (pure): which adapters an InferenceService declares, which ones a pod
serves, and which service a request for an adapter belongs to.

Declared: `spec.adapters[].name` of the InferenceService (absent or malformed: none). Served: read from
the pod's `/metrics`, the scrape the gateway already makes for the queue depth (`queues.py`), so adapter
awareness costs no extra request and needs no API key: `specfleet:lora_adapter_info` names every adapter
the engine serves, idle or not; a vLLM pod exports only `vllm:lora_requests_info`, whose labels name the
adapters of its running and waiting requests, so those count too.

A request's `model` that names no base model is an adapter of the first service (by namespace/name) that
declares it, else of the first service with a ready pod serving it.
"""
from __future__ import annotations

import re
from typing import Iterable, Mapping, Protocol, TypeVar


class _Endpoint(Protocol):
    url: str


class _Route(Protocol):
    """What `adapter_routes` reads of a `routing.Route`."""
    @property
    def key(self) -> str: ...
    adapters: tuple[str, ...]
    endpoints: Iterable[_Endpoint]


R = TypeVar("R", bound=_Route)

INFO_METRIC = "specfleet:lora_adapter_info"
REQUESTS_INFO_METRIC = "vllm:lora_requests_info"
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def declared_adapters(isvc: dict) -> tuple[str, ...]:
    """The adapter names `spec.adapters` declares, in order, each once."""
    items = (isvc.get("spec") or {}).get("adapters")
    if not isinstance(items, list):
        return ()
    names = (item.get("name") for item in items if isinstance(item, dict))
    return tuple(dict.fromkeys(name for name in names if isinstance(name, str) and name))


def served_adapters(metrics_text: str) -> frozenset[str]:
    """The adapters an engine's /metrics exposition says it serves."""
    names: set[str] = set()
    for line in metrics_text.splitlines():
        if line.startswith(INFO_METRIC + "{"):
            names.update(value for key, value in _labels(line) if key == "lora_name")
        elif line.startswith(REQUESTS_INFO_METRIC + "{"):
            for key, value in _labels(line):
                if key in ("running_lora_adapters", "waiting_lora_adapters"):
                    names.update(name for name in value.split(",") if name)
    return frozenset(names)


def _labels(line: str) -> list[tuple[str, str]]:
    body = line[line.index("{") + 1:line.rindex("}")]
    return [(key, value.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\"))
            for key, value in _LABEL.findall(body)]


def adapter_routes(routes: Mapping[str, R], served: Mapping[str, frozenset[str]]) -> dict[str, R]:
    """adapter name -> its route: declared ones first, then those a ready pod serves; a base model's name is
    never an adapter."""
    ordered = sorted(routes.values(), key=lambda r: r.key)
    index: dict[str, R] = {}
    for route in ordered:
        for name in route.adapters:
            index.setdefault(name, route)
    for route in ordered:
        for endpoint in route.endpoints:
            for name in sorted(served.get(endpoint.url, ())):
                index.setdefault(name, route)
    return {name: route for name, route in index.items() if name not in routes}
