"""Watch streams: newline-delimited JSON events, resuming from a resourceVersion, bookmarks, 410 Gone."""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from specfleet.cluster.apiserver import table
from specfleet.cluster.apiserver.errors import ApiError, bad_request
from specfleet.cluster.apiserver.registry import ResourceType
from specfleet.cluster.apiserver.service import Service
from specfleet.cluster.apiserver.store import Watcher


@dataclass
class WatchRequest:
    rt: ResourceType
    namespace: str | None
    label: str | None
    fields: str | None
    since: int | None
    bookmarks: bool
    initial_events: bool
    timeout: float | None
    as_table: bool
    include: str

    @classmethod
    def parse(cls, rt: ResourceType, namespace: str | None, q: Any, as_table: bool) -> "WatchRequest":
        rv = q.get("resourceVersion") or ""
        try:
            since = int(rv) if rv not in ("", "0") else None
            timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds") else None
        except ValueError:
            raise bad_request(f"invalid resourceVersion or timeoutSeconds: {rv!r}") from None
        initial = q.get("sendInitialEvents") == "true"
        return cls(rt, namespace, q.get("labelSelector"), q.get("fieldSelector"), None if initial else since,
                   q.get("allowWatchBookmarks") == "true", initial, timeout, as_table,
                   q.get("includeObject", "Metadata"))


def encode(req: WatchRequest, service: Service, kind: str, obj: dict[str, Any]) -> bytes:
    body = service.served(req.rt, obj)
    if req.as_table and kind != "BOOKMARK":
        body = table.table(req.rt, [body], include=req.include)
    return (json.dumps({"type": kind, "object": body}, separators=(",", ":")) + "\n").encode()


def bookmark(req: WatchRequest, service: Service, initial_end: bool = False) -> bytes:
    m: dict[str, Any] = {"resourceVersion": str(service.store.rv)}
    if initial_end:
        m["annotations"] = {"k8s.io/initial-events-end": "true"}
    obj = {"kind": req.rt.kind, "apiVersion": req.rt.api_version, "metadata": m}
    return (json.dumps({"type": "BOOKMARK", "object": obj}) + "\n").encode()


async def serve_watch(request: web.Request, service: Service, req: WatchRequest,
                      bookmark_interval: float) -> web.StreamResponse:
    labels, field_reqs = service.selector_filter(req.rt, req.label, req.fields)
    watcher = Watcher(req.rt.key, req.namespace, labels, field_reqs, asyncio.get_running_loop())
    response = web.StreamResponse(headers={"Content-Type": "application/json",
                                           "Transfer-Encoding": "chunked", "Cache-Control": "no-cache"})
    try:
        initial = service.store.watch(watcher, req.since)
    except ApiError as exc:                                   # too old: 200, then an ERROR event, as k8s does
        await response.prepare(request)
        await response.write((json.dumps({"type": "ERROR", "object": exc.status()}) + "\n").encode())
        return response
    try:
        await response.prepare(request)
        await pump(response, service, req, watcher, initial, bookmark_interval)
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        service.store.unwatch(watcher)
    return response


async def pump(response: web.StreamResponse, service: Service, req: WatchRequest, watcher: Watcher,
               initial: list, bookmark_interval: float) -> None:
    for kind, obj in initial:
        await response.write(encode(req, service, kind, obj))
    if req.initial_events and req.bookmarks:
        await response.write(bookmark(req, service, initial_end=True))
    deadline = time.monotonic() + req.timeout if req.timeout else None
    while True:
        wait = bookmark_interval if req.bookmarks else None
        if deadline is not None:
            left = deadline - time.monotonic()
            wait = left if wait is None else min(wait, left)
            if left <= 0:
                break
        try:
            item = await asyncio.wait_for(watcher.queue.get(), wait)
        except asyncio.TimeoutError:
            if req.bookmarks and watcher.queue.empty():
                await response.write(bookmark(req, service))
            continue
        if item is None:
            break
        await response.write(encode(req, service, *item))
