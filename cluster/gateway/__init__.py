"""The gateway: the fleet's front door, one component for `specfleet up` and for a real cluster
(`specfleet gateway run`).

routing.py  routes from InferenceServices, Services and Pods; the balancer (pure)
adapters.py LoRA adapters: declared per service, served per pod, the service a request's adapter names (pure)
holding.py  requests held while a service has no ready replica, bounded per service and in time
keys.py     API keys from files and a watched Secret (the engine's constant-time comparison)
metrics.py  Prometheus metrics
follow.py   list-then-watch of the API; the held-requests annotation the operator watches
queues.py   the engines' prefill queues and served adapters, polled from their /metrics
connect.py  in-cluster or kubeconfig connection to the API server
proxy.py    `Gateway`: the HTTP handlers, holding, retries, streaming
"""
from specfleet.cluster.gateway.proxy import Gateway, GatewayConfig
from specfleet.cluster.gateway.routing import AFFINITY_SLACK, Balancer, Endpoint, Route, prefix_key, routes_from

__all__ = ["AFFINITY_SLACK", "Balancer", "Endpoint", "Gateway", "GatewayConfig", "Route", "prefix_key", "routes_from"]
