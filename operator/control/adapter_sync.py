"""The I/O of live adapter sync: each ready engine pod of a service loads and unloads its LoRA adapters
through the engine's admin API until it serves exactly `spec.adapters` (the pure part is `adapters.py`).

Per pod: `GET /v1/models` (what it serves), then `POST /v1/unload_lora_adapter` and
`POST /v1/load_lora_adapter` with the `<name>-admin` Secret's bearer token (read only when a pod needs a
change). An unload the engine refuses with 409 (requests in flight) is left for the next run; nothing is
aborted. Runs after each control
interval (the scheduler's `after_interval` hook) and before each reconcile of a spec change, one run per
service at a time; its status (`adapters`, `adapterCount`, Degraded) and Events are returned, merged into
the outcome it was given, for `handlers.publish`, the one status writer. Never raises: a pod that cannot
be reached is skipped (the next run tries again).
"""
from __future__ import annotations

import asyncio
import logging

import httpx

from specfleet.operator import adapters, api, status
from specfleet.operator.control import discovery
from specfleet.operator.control.discovery import EnginePod
from specfleet.operator.control.runner import ControlOutcome, admin_token, now_iso

log = logging.getLogger("specfleet.operator.adapters")
LOAD_TIMEOUT_S = 300.0         # a load may download an oci:// or https:// adapter, then checks it between steps
LIST_TIMEOUT_S = 5.0


class AdapterSync:
    """Adapter sync for every service (shared through kopf's memo); `run` is one service's pass."""

    def __init__(self, kube, http: httpx.AsyncClient | None = None):
        self.kube, self.http = kube, http
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    async def run(self, body: dict, pods: list[EnginePod],
                  outcome: ControlOutcome | None = None) -> ControlOutcome | None:
        """Sync the service's ready pods; `outcome` (a control step's, or None) with the adapter status
        and Events merged in. Services that never declared adapters cost a dict lookup."""
        spec_raw, old = body.get("spec") or {}, body.get("status") or {}
        if not (spec_raw.get("adapters") or spec_raw.get("lora") or "adapters" in old or "adapterCount" in old):
            return outcome
        try:
            spec = api.parse_spec(spec_raw)
        except api.SpecError:
            return outcome                    # the reconcile reports it
        if spec.plan_only:
            return outcome
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        try:
            async with self._locks.setdefault(key, asyncio.Lock()):
                synced = await self._sync(key, spec, old, discovery.endpoints(pods), outcome)
        except Exception:  # noqa: BLE001  (the next interval tries again)
            log.exception("adapter sync of %s/%s failed", *key)
            return outcome
        return synced

    def forget(self, key: tuple[str, str]) -> None:
        self._locks.pop(key, None)

    async def _sync(self, key, spec: api.InferenceServiceSpec, old: dict, endpoints: dict[str, str],
                    outcome: ControlOutcome | None) -> ControlOutcome:
        want = adapters.desired(spec) if spec.lora_limits is not None else []
        results: dict[str, adapters.PodResult] = {}
        if endpoints and spec.lora_limits is not None:
            listed = await asyncio.gather(*(self._list(url) for url in endpoints.values()))
            loaded = {pod: served for pod, served in zip(endpoints, listed) if served is not None}
            busy = any(adapters.actions(want, served) != adapters.Actions() for served in loaded.values())
            token = await asyncio.to_thread(admin_token, self.kube, *key) if busy else None   # the Secret: on need
            found = await asyncio.gather(*(self._pod(endpoints[pod], want, served, token)
                                           for pod, served in loaded.items()))
            results = {pod: r for pod, r in zip(loaded, found) if r is not None}
        entries = adapters.report(want, results)
        patch: dict = {"adapters": entries, "adapterCount": len(want)}
        if not spec.adapters and spec.lora is None:            # LoRA off: clear what an earlier sync wrote
            patch = {k: None for k in ("adapters", "adapterCount") if k in old}
        base = outcome.status if outcome is not None else {}
        conditions = base.get("conditions", old.get("conditions") or [])
        condition = status.adapter_degraded(conditions, adapters.problems(want, entries))
        if condition is not None:
            patch["conditions"] = status.merge_conditions(conditions, [condition], now_iso(), None)
        events = adapters.events(old.get("adapters") or [], entries, results)
        if outcome is None:
            return ControlOutcome(patch, events)
        return ControlOutcome({**outcome.status, **patch}, outcome.events + events)

    async def _list(self, url: str) -> dict[str, str] | None:
        """The adapters a pod serves; None when it cannot be asked (it is skipped this time)."""
        try:
            response = await self._request("GET", url + "/v1/models", None, None, LIST_TIMEOUT_S)
            response.raise_for_status()
            return adapters.loaded_from_models(response.json())
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("adapter sync: %s not reachable: %s", url, exc)
            return None

    async def _pod(self, url: str, want: list[adapters.Desired], loaded: dict[str, str],
                   token: str | None) -> adapters.PodResult | None:
        """Bring one pod to the declared set; None when it stopped answering."""
        try:
            return await self._apply(url, want, loaded, token)
        except httpx.HTTPError as exc:
            log.warning("adapter sync: %s not reachable: %s", url, exc)
            return None

    async def _apply(self, url: str, want, loaded: dict[str, str], token: str | None) -> adapters.PodResult:
        todo, done, errors, busy = adapters.actions(want, loaded), [], {}, set()
        for name in todo.unload:
            result, message = await self._call(url, "unload_lora_adapter", {"lora_name": name}, token)
            if result in (adapters.OK, adapters.GONE):
                loaded.pop(name, None)
                done.append(f"unloaded {name}")
            else:                             # BUSY: requests in flight, next time; else keep the old one
                busy.add(name)
                log.info("adapter sync: %s kept %s for now (%s)", url, name, message)
        for name, path in todo.load:
            if name in busy:
                continue
            result, message = await self._call(url, "load_lora_adapter", {"lora_name": name, "lora_path": path},
                                               token)
            if result == adapters.OK:
                loaded[name] = path
                done.append(f"loaded {name}")
            elif result == adapters.DISABLED:
                break                         # an old pod without --enable-lora: its replacement will load
            else:
                errors[name] = message
        paths = {d.name: d.path for d in want}
        ok = frozenset(n for n, p in loaded.items() if paths.get(n) == p)
        return adapters.PodResult(ok, errors, tuple(done))

    async def _call(self, url: str, verb: str, body: dict, token: str | None) -> tuple[str, str]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        response = await self._request("POST", f"{url}/v1/{verb}", body, headers, LOAD_TIMEOUT_S)
        try:
            payload = response.json()
        except ValueError:
            payload = None
        return adapters.outcome_of(response.status_code, payload if isinstance(payload, dict) else None)

    async def _request(self, method: str, url: str, body: dict | None, headers: dict | None,
                       timeout: float) -> httpx.Response:
        if self.http is not None:
            return await self.http.request(method, url, json=body, headers=headers, timeout=timeout)
        async with httpx.AsyncClient() as client:
            return await client.request(method, url, json=body, headers=headers, timeout=timeout)
