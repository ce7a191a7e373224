"""Garbage collection, the way kube-controller-manager does it: owner references (background, foreground,
orphan propagation) and namespace termination. Runs on the server's loop after deletions."""
from __future__ import annotations

import asyncio
import copy
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from specfleet.cluster.apiserver.errors import ApiError
from specfleet.cluster.apiserver.service import NS_KEY, Service, WriteOptions

log = logging.getLogger(__name__)
GC = WriteOptions(manager="generic-garbage-collector")
Ref = tuple[str, dict[str, Any]]          # (storage key, object)


@dataclass
class GarbageCollector:
    service: Service
    loop: asyncio.AbstractEventLoop | None = None
    pending: bool = False
    running: bool = False
    again: bool = False
    dependents: dict[str, list[Ref]] = field(default_factory=dict)

    def schedule(self) -> None:
        """Coalesce triggers into one sweep on the loop (or sweep now when there is no loop)."""
        if self.running:
            self.again = True
            return
        if self.pending:
            return
        self.pending = True
        if self.loop is None or self.loop.is_closed():
            self.sweep()
        else:
            self.loop.call_soon_threadsafe(self.sweep)

    def sweep(self) -> None:
        self.pending, self.running = False, True
        try:
            with self.service.store.lock:
                for _ in range(100):                            # cascades settle within one sweep
                    self.again = False
                    self.collect()
                    if not self.again:
                        break
        except Exception:                                       # never kill the loop
            log.exception("garbage collection failed")
        finally:
            self.running = False

    def collect(self) -> None:
        objects = self.service.store.all_objects()
        uids = {obj["metadata"]["uid"] for _, obj in objects}
        self.dependents = defaultdict(list)
        for key, obj in objects:
            for ref in obj["metadata"].get("ownerReferences") or []:
                self.dependents[ref.get("uid")].append((key, obj))
        for key, obj in objects:
            m = obj["metadata"]
            refs = m.get("ownerReferences") or []
            if refs and not any(r.get("uid") in uids for r in refs) and not m.get("deletionTimestamp"):
                self.delete(key, obj, "Background")
            elif m.get("deletionTimestamp"):
                self.finalize(key, obj)

    def finalize(self, key: str, obj: dict[str, Any]) -> None:
        finalizers = obj["metadata"].get("finalizers") or []
        if key == NS_KEY:
            self.terminate_namespace(obj)
        elif "orphan" in finalizers:
            for dep_key, dep in self.dependents.get(obj["metadata"]["uid"], []):
                self.orphan(dep_key, dep, obj["metadata"]["uid"])
            self.drop_finalizer(key, obj, "orphan")
        elif "foregroundDeletion" in finalizers:
            self.foreground(key, obj)

    def foreground(self, key: str, obj: dict[str, Any]) -> None:
        uid = obj["metadata"]["uid"]
        blocking = 0
        for dep_key, dep in self.dependents.get(uid, []):
            if self.current(dep_key, dep) is None:
                continue
            if not dep["metadata"].get("deletionTimestamp"):
                self.delete(dep_key, dep, "Foreground")
            if self.current(dep_key, dep) is not None and any(
                    r.get("uid") == uid and r.get("blockOwnerDeletion") for r in dep["metadata"]["ownerReferences"]):
                blocking += 1
        if not blocking:
            self.drop_finalizer(key, obj, "foregroundDeletion")

    def terminate_namespace(self, ns_obj: dict[str, Any]) -> None:
        ns = ns_obj["metadata"]["name"]
        remaining = 0
        for key in self.service.store.keys():
            if key == NS_KEY:
                continue
            for obj in self.service.store.list(key, ns):
                remaining += 1
                if not obj["metadata"].get("deletionTimestamp"):
                    self.delete(key, obj, "Background")
        if not remaining and self.current(NS_KEY, ns_obj) is not None:
            if not ns_obj["metadata"].get("finalizers"):
                self.service.finish_delete(self.type_of(NS_KEY), ns_obj)

    def current(self, key: str, obj: dict[str, Any]) -> dict[str, Any] | None:
        m = obj["metadata"]
        return self.service.store.get(key, m.get("namespace", ""), m["name"])

    def type_of(self, key: str):
        return self.service.registry.by_key(key)

    def delete(self, key: str, obj: dict[str, Any], policy: str) -> None:
        rt = self.type_of(key)
        if rt is None:
            return
        m = obj["metadata"]
        try:
            self.service.delete(rt, m.get("namespace", ""), m["name"], {"propagationPolicy": policy})
        except ApiError as exc:
            if exc.code != 404:
                log.warning("gc could not delete %s %s: %s", key, m["name"], exc)

    def orphan(self, key: str, obj: dict[str, Any], owner_uid: str) -> None:
        live = self.current(key, obj)
        rt = self.type_of(key)
        if live is None or rt is None:
            return
        new = copy.deepcopy(live)
        refs = [r for r in new["metadata"].get("ownerReferences") or [] if r.get("uid") != owner_uid]
        if refs:
            new["metadata"]["ownerReferences"] = refs
        else:
            new["metadata"].pop("ownerReferences", None)
        self.service.commit(rt, live, new, GC)

    def drop_finalizer(self, key: str, obj: dict[str, Any], finalizer: str) -> None:
        live = self.current(key, obj)
        rt = self.type_of(key)
        if live is None or rt is None:
            return
        new = copy.deepcopy(live)
        new["metadata"]["finalizers"] = [f for f in live["metadata"].get("finalizers") or [] if f != finalizer]
        if not new["metadata"]["finalizers"]:
            new["metadata"].pop("finalizers")
        self.service.commit(rt, live, new, GC)
