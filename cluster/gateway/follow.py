"""What the gateway learns from the API server, and the one thing it writes there.

`follow` lists then watches (never polls) InferenceServices, Services and Pods (in the given
namespaces, or all) and rebuilds the routes on every change; with `--api-key-secret` it also watches
that one Secret (a field selector on its name, so RBAC can grant just it). `Announcer` publishes the
requests held per service as an annotation on the InferenceService, `held.gateway.specfleet.io/<gateway
id>: "<count>"`, removed when the count drops to 0: a watch event reaches the operator at once, so it
can scale 0 -> 1 without polling the gateway. One key per gateway replica; the operator sums them.
"""
from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from specfleet.cluster.api_client import ApiCallError, ApiClient, Informer

log = logging.getLogger("specfleet.gateway")
HELD_PREFIX = "held.gateway.specfleet.io/"
KINDS = ("InferenceService", "Service", "Pod")


def held_annotation(gateway_id: str) -> str:
    """The annotation key of one gateway replica (the name part: at most 63 [-._a-zA-Z0-9], alnum ends)."""
    name = re.sub(r"[^-._a-zA-Z0-9]", "-", gateway_id)[:63].strip("-._") or "gateway"
    return HELD_PREFIX + name


async def follow(api: ApiClient, namespaces: list[str] | None, on_routes: Callable[[list, list, list], None],
                 secret: tuple[str, str] | None = None,
                 on_secret: Callable[[dict | None], None] = lambda s: None) -> None:
    """Run the informers until cancelled; `on_routes(isvcs, services, pods)` after every change."""
    scopes = namespaces or [None]
    informers = {kind: [Informer(api, kind, namespace=ns) for ns in scopes] for kind in KINDS}

    def update() -> None:
        on_routes(*([obj for inf in informers[kind] for obj in inf.items()] for kind in KINDS))

    tasks = [inf.run(update) for group in informers.values() for inf in group]
    if secret is not None:
        watched = Informer(api, "Secret", namespace=secret[0], fields=f"metadata.name={secret[1]}")
        tasks.append(watched.run(lambda: on_secret(next(iter(watched.items()), None))))
    await asyncio.gather(*tasks)


@dataclass
class Announcer:
    """Writes the held counts to the InferenceServices' annotations, latest value wins, one patch at a time."""

    api: ApiClient
    gateway_id: str
    latest: dict[str, int] = field(default_factory=dict)
    written: dict[str, int] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def note(self, service: str, count: int) -> None:
        self.latest[service] = count
        self.wake.set()

    async def run(self) -> None:
        key = held_annotation(self.gateway_id)
        while True:
            await self.wake.wait()
            self.wake.clear()
            for service, count in list(self.latest.items()):
                if self.written.get(service, 0) == count:
                    continue
                namespace, _, name = service.partition("/")
                try:
                    await self.api.patch("InferenceService", namespace, name,
                                         {"metadata": {"annotations": {key: str(count) if count else None}}})
                    self.written[service] = count
                except ApiCallError as exc:
                    if exc.status == 404:
                        self.written[service] = count        # gone: nothing to tell
                    elif exc.forbidden:                      # RBAC: the next count tries again, not a loop
                        log.warning("missing RBAC permission: %s (held-requests annotation on %s)",
                                    exc.message, service)
                        self.written[service] = count
                    else:
                        log.warning("annotating %s with %d held requests: %s", service, count, exc)
                        self.wake.set()
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    log.warning("annotating %s: %s", service, exc)
                    self.wake.set()
            if self.wake.is_set():
                await asyncio.sleep(1.0)          # an error: try again, but not in a tight loop
