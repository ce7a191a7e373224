"""Object storage with one global resourceVersion counter, a bounded event history and watchers.

Stored dicts are never mutated in place: writers build a new dict and `put` it, so events and list
results can share them safely. Watch delivery is thread-safe (the server's loop owns the queues).
"""
from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from specfleet.cluster.apiserver.errors import gone
from specfleet.cluster.apiserver.selectors import (FieldRequirement, Requirement, fields_match,
                                                     labels_match)

ObjKey = tuple[str, str]             # (namespace, name)


@dataclass
class Event:
    rv: int
    key: str                         # storage key: group/plural
    type: str                        # ADDED | MODIFIED | DELETED
    obj: dict[str, Any]
    old: dict[str, Any] | None = None


@dataclass(eq=False)
class Watcher:
    """One watch stream's filter and queue. `None` in the queue means: stop."""
    key: str
    namespace: str | None
    labels: list[Requirement]
    fields: list[FieldRequirement]
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)

    def matches(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        ns = (obj.get("metadata") or {}).get("namespace", "")
        return ((self.namespace is None or ns == self.namespace) and labels_match(self.labels, obj)
                and fields_match(self.fields, obj))

    def translate(self, event: Event) -> tuple[str, dict[str, Any]] | None:
        """The event this watcher sees: selector transitions turn MODIFIED into ADDED or DELETED."""
        now_in = self.matches(event.obj)
        if event.type != "MODIFIED":
            return (event.type, event.obj) if now_in else None
        was_in = self.matches(event.old)
        if now_in:
            return ("MODIFIED" if was_in else "ADDED", event.obj)
        return ("DELETED", event.obj) if was_in else None

    def offer(self, item: Any) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            self.queue.put_nowait(item)
        elif not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


@dataclass
class Store:
    history_size: int = 50_000
    rv: int = 1
    objects: dict[str, dict[ObjKey, dict[str, Any]]] = field(default_factory=dict)
    history: deque = field(default_factory=deque)
    compacted: int = 0               # newest resourceVersion no longer in the history
    watchers: set[Watcher] = field(default_factory=set)
    listeners: list[Callable[[Event], None]] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)
    #: list snapshots that `continue` tokens point at: (key, namespace, rv) -> objects (never mutated in place)
    snapshots: OrderedDict = field(default_factory=OrderedDict)
    max_snapshots: int = 64

    # ------------------------------------------------------------ reads
    def get(self, key: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            return self.objects.get(key, {}).get((namespace, name))

    def list(self, key: str, namespace: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            items = self.objects.get(key, {})
            if namespace is None:
                return [items[k] for k in sorted(items)]
            return [items[k] for k in sorted(items) if k[0] == namespace]

    def keep_snapshot(self, key: str, namespace: str | None, rv: int, items: list[dict[str, Any]]) -> None:
        """Remember the list a paginated read started from, for its later pages."""
        with self.lock:
            self.snapshots[(key, namespace, rv)] = list(items)
            while len(self.snapshots) > self.max_snapshots:
                self.snapshots.popitem(last=False)

    def snapshot_at(self, key: str, namespace: str | None, rv: int) -> list[dict[str, Any]] | None:
        """The snapshot a continue token refers to; None once it is gone (the real server's compaction)."""
        with self.lock:
            if rv <= self.compacted:
                return None
            return self.snapshots.get((key, namespace, rv))

    def keys(self) -> list[str]:
        with self.lock:
            return list(self.objects)

    def all_objects(self) -> Iterable[tuple[str, dict[str, Any]]]:
        with self.lock:
            return [(key, obj) for key, items in self.objects.items() for obj in items.values()]

    def count(self) -> int:
        with self.lock:
            return sum(len(items) for items in self.objects.values())

    # ------------------------------------------------------------ writes
    def _stamp(self, obj: dict[str, Any]) -> int:
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        return self.rv

    def put(self, key: str, obj: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, Any]:
        """Store a new or changed object under a fresh resourceVersion and tell the watchers."""
        with self.lock:
            rv = self._stamp(obj)
            m = obj["metadata"]
            self.objects.setdefault(key, {})[(m.get("namespace", ""), m["name"])] = obj
            self._emit(Event(rv, key, "MODIFIED" if old is not None else "ADDED", obj, old))
        return obj

    def remove(self, key: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Delete an object for good; the DELETED event carries a fresh resourceVersion."""
        with self.lock:
            m = obj["metadata"]
            self.objects.get(key, {}).pop((m.get("namespace", ""), m["name"]), None)
            final = {**obj, "metadata": dict(m)}
            rv = self._stamp(final)
            self._emit(Event(rv, key, "DELETED", final))
        return final

    def _emit(self, event: Event) -> None:
        self.history.append(event)
        while len(self.history) > self.history_size:
            self.compacted = self.history.popleft().rv
        for watcher in list(self.watchers):
            if watcher.key == event.key:
                seen = watcher.translate(event)
                if seen:
                    watcher.offer(seen)
        for listener in self.listeners:
            listener(event)

    # ------------------------------------------------------------ watches
    def watch(self, watcher: Watcher, since: int | None) -> list[tuple[str, dict[str, Any]]]:
        """Register a watcher; returns the events it must see first (initial state or history replay)."""
        with self.lock:
            if since is None:
                initial = [("ADDED", obj) for obj in self.list(watcher.key, watcher.namespace)
                           if watcher.matches(obj)]
            else:
                if since < self.compacted:
                    raise gone(f"too old resource version: {since} ({self.compacted + 1})")
                initial = [seen for ev in self.history if ev.rv > since and ev.key == watcher.key
                           for seen in [watcher.translate(ev)] if seen]
            self.watchers.add(watcher)
        return initial

    def unwatch(self, watcher: Watcher) -> None:
        with self.lock:
            self.watchers.discard(watcher)

    def stop_watchers(self) -> None:
        with self.lock:
            for watcher in list(self.watchers):
                watcher.offer(None)

    # ------------------------------------------------------------ persistence
    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"resourceVersion": self.rv,
                    "objects": {key: list(items.values()) for key, items in self.objects.items() if items}}

    def restore(self, data: dict[str, Any]) -> None:
        with self.lock:
            self.rv = int(data.get("resourceVersion", 1))
            self.compacted = self.rv           # no history survives a restart
            for key, items in (data.get("objects") or {}).items():
                bucket = self.objects.setdefault(key, {})
                for obj in items:
                    m = obj["metadata"]
                    bucket[(m.get("namespace", ""), m["name"])] = obj
