"""An InferenceService's LoRA adapters, live: what each engine pod loads and unloads, and what status says.

Pure. `desired(spec)` resolves each declared adapter to what the engine loads: a folder relative to the model
volume (the engine's working directory when LoRA is on, `render._working_dir`), an https:// or oci:// source
as written (the engine fetches it, and reports it back as the `root` of its `/v1/models` card), or the reason
it cannot be served here (an hf:// source, a PVC other than the model's). `loaded_from_models` reads a pod's
`/v1/models`; `actions` diffs the two into unloads and loads; `outcome_of` classifies the engine's answer
to one of them; `report` folds the pods' results into `status.adapters`; `problems` lists what the
Degraded condition says; `events` says what changed. `control/adapter_sync.py` is the I/O around it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from specfleet.operator.api import Adapter, InferenceServiceSpec, parse_source

OK, GONE, BUSY, DISABLED, FAILED = "ok", "gone", "busy", "disabled", "failed"
FETCHED = ("https", "http", "oci")         # sources the engine downloads (engine/lora/fetch.py)


@dataclass(frozen=True)
class Desired:
    """One declared adapter as the engine is to load it: `path` (relative to the model volume, or the remote
    source the engine fetches), or `error`."""

    name: str
    path: str | None
    error: str | None = None


@dataclass(frozen=True)
class Actions:
    """What one pod needs: unloads first (removed, moved or unservable adapters), then loads."""

    unload: tuple[str, ...] = ()
    load: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class PodResult:
    """One pod after a sync: the declared adapters it serves at their declared folder, the load errors, and
    what was done (for the Event)."""

    loaded: frozenset[str] = frozenset()
    errors: Mapping[str, str] = field(default_factory=dict)
    done: tuple[str, ...] = ()


def desired(spec: InferenceServiceSpec) -> list[Desired]:
    return [resolve(a, spec.model.source) for a in spec.adapters]


def resolve(adapter: Adapter, model_source: str) -> Desired:
    """What the engine loads `adapter` from: a folder relative to the model volume, or a source it fetches
    itself (https://, http://, oci://: the pod needs egress to it); or why it cannot."""
    src, model = adapter.source, parse_source(model_source)
    scheme = src.split("://", 1)[0] if "://" in src else ""
    if scheme in FETCHED:
        return Desired(adapter.name, src)
    if scheme and scheme != "pvc":
        return Desired(adapter.name, None, f"unsupported source {src!r}: {scheme}:// adapters are not fetched; "
                                           "use oci://, https:// or a folder on the model's volume")
    if model.kind not in ("pvc", "hostpath"):
        return Desired(adapter.name, None, f"unsupported source {src!r}: the model ({model_source}) has no volume "
                                           "for adapter folders; serve it from pvc:// or hostpath:")
    if scheme:
        claim, _, path = src.removeprefix("pvc://").partition("/")
        if model.kind != "pvc" or claim != model.location:
            mounted = f"only the model's claim {model.location!r} is mounted" if model.kind == "pvc" else \
                "the model comes from a hostPath, no claim is mounted"
            return Desired(adapter.name, None, f"unsupported source {src!r}: {mounted}")
        return Desired(adapter.name, path.strip("/"))
    return Desired(adapter.name, src.strip("/"))


def loaded_from_models(body: Mapping) -> dict[str, str]:
    """`{adapter: folder}` from a pod's `/v1/models` (adapters are the cards with a `parent`)."""
    return {m["id"]: m.get("root") or "" for m in body.get("data") or [] if m.get("parent")}


def actions(want: Sequence[Desired], loaded: Mapping[str, str]) -> Actions:
    """Unload what is loaded but not declared at that folder; load what is declared and not loaded there."""
    paths = {d.name: d.path for d in want if d.path is not None}
    unload = tuple(name for name, path in sorted(loaded.items()) if paths.get(name) != path)
    load = tuple((name, path) for name, path in paths.items() if loaded.get(name) != path)
    return Actions(unload, load)


def outcome_of(status_code: int, body: Mapping | None) -> tuple[str, str]:
    """The engine's answer to a load or unload: (OK | GONE | BUSY | DISABLED | FAILED, message). 409 (requests
    in flight) is BUSY: tried again next time, nothing lost. 404 on unload is GONE: already done."""
    error = (body or {}).get("error") or {}
    message = str(error.get("message") or f"HTTP {status_code}")
    if status_code < 300:
        return OK, ""
    if status_code == 409:
        return BUSY, message
    if status_code == 404:
        return GONE, message
    if error.get("code") == "lora_disabled":
        return DISABLED, message            # a pod started before LoRA was on (a rollout under way)
    return FAILED, message


def report(want: Sequence[Desired], pods: Mapping[str, PodResult]) -> list[dict]:
    """`status.adapters`: per declared adapter the ready pods serving it and its last error, if any."""
    entries = []
    for d in want:
        entry = {"name": d.name, "readyPods": sum(d.name in r.loaded for r in pods.values())}
        failed = sorted((pod, r.errors[d.name]) for pod, r in pods.items() if d.name in r.errors)
        error = d.error or (f"pod {failed[0][0]}: {failed[0][1]}" if failed else None)
        if error:
            entry["lastError"] = error
        entries.append(entry)
    return entries


def problems(want: Sequence[Desired], entries: Sequence[Mapping]) -> list[str]:
    """What the Degraded condition lists: every declared adapter that is unservable or failed to load."""
    declared = {d.name for d in want if d.error is None}
    errors = [f"adapter {d.name}: {d.error}" for d in want if d.error]
    return errors + [f"adapter {e['name']}: {e['lastError']}" for e in entries
                     if e.get("lastError") and e.get("name") in declared]


def events(old: Sequence[Mapping], new: Sequence[Mapping], pods: Mapping[str, PodResult]) -> list[tuple[str, str, str]]:
    """A Warning for each adapter whose error is new, a Normal event for what was loaded or unloaded."""
    before = {e.get("name"): e.get("lastError") for e in old}
    out = [("Warning", "AdapterFailed", f"adapter {e['name']}: {e['lastError']}") for e in new
           if e.get("lastError") and before.get(e["name"]) != e["lastError"]]
    done = [f"{pod}: {', '.join(r.done)}" for pod, r in sorted(pods.items()) if r.done]
    return out + ([("Normal", "AdaptersSynced", "; ".join(done))] if done else [])
