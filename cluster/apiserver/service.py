"""The API's semantics without HTTP: create, read, update, patch, delete, scale, with server-set metadata,
preconditions, status-subresource rules, generation, finalizers and managedFields."""
from __future__ import annotations

import base64
import copy
import datetime
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import yaml

from specfleet.cluster.apiserver import apply, builtin_rules, builtin_schema, crd, errors, patch, pods
from specfleet.cluster.apiserver.errors import ApiError, Cause
from specfleet.cluster.apiserver.meta import (SERVER_FIELDS, generated_name, meta, metadata_causes, name_causes,
                                              new_uid, now, parse_time)
from specfleet.cluster.apiserver.registry import Registry, ResourceType
from specfleet.cluster.apiserver.selectors import (field_label_allowed, fields_match, labels_match,
                                                     parse_field_selector, parse_label_selector, selector_string)
from specfleet.cluster.apiserver.store import Store

log = logging.getLogger(__name__)
CRD_KEY = "apiextensions.k8s.io/customresourcedefinitions"
NS_KEY = "/namespaces"
PATCH_TYPES = ("application/json-patch+json", "application/merge-patch+json",
               "application/strategic-merge-patch+json", "application/apply-patch+yaml")
FIELD_VALIDATION = ("Strict", "Warn", "Ignore")
EXPIRED_CONTINUE = ("The provided continue parameter is too old to display a consistent list result. You can start a "
                    "new list without the continue parameter, or use the continue token in this response to retrieve "
                    "the remainder of the results. Continuing with the provided token results in an inconsistent list "
                    "- objects that were created, modified, or deleted between the time the first chunk was returned "
                    "and now may show up in the list.")


@dataclass
class WriteOptions:
    manager: str = "unknown"
    dry_run: bool = False
    validation: str = "Warn"                 # fieldValidation: Strict | Warn (the server's default) | Ignore
    force: bool = False
    warnings: list[str] = field(default_factory=list)    # sent back as `Warning: 299 - "..."` headers


@dataclass
class Service:
    registry: Registry
    store: Store
    on_delete: list[Callable[[], None]] = field(default_factory=list)   # the garbage collector's trigger

    # ------------------------------------------------------------ helpers
    def served(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        """The stored object as this API version presents it (no conversion: same schema, new apiVersion)."""
        if obj.get("apiVersion") == rt.api_version:
            return obj
        return {**obj, "apiVersion": rt.api_version}

    def existing(self, rt: ResourceType, ns: str, name: str) -> dict[str, Any]:
        obj = self.store.get(rt.key, ns if rt.namespaced else "", name)
        if obj is None:
            raise errors.not_found(rt.plural, rt.group, name)
        return obj

    def get(self, rt: ResourceType, ns: str, name: str) -> dict[str, Any]:
        return self.served(rt, self.existing(rt, ns, name))

    def selector_filter(self, rt: ResourceType, label: str | None, fields: str | None):
        labels = parse_label_selector(label)
        allowed = (lambda p: field_label_allowed(rt.key, p)) if rt.builtin else (
            lambda p: p in ("metadata.name", "metadata.namespace") or "." + p in (rt.custom.selectable_fields or []))
        field_reqs = parse_field_selector(fields, allowed)
        return labels, field_reqs

    def list(self, rt: ResourceType, ns: str | None, label: str | None = None, fields: str | None = None,
             limit: int = 0, cont: str = "") -> dict[str, Any]:
        """One page of a list. Every page of a `limit`/`continue` sequence is cut from the snapshot the first
        page was served from, as etcd serves later pages at the first page's revision."""
        labels, field_reqs = self.selector_filter(rt, label, fields)
        scope = ns if rt.namespaced else None
        if cont:
            rv, start = decode_continue(cont)
            everything = self.store.snapshot_at(rt.key, scope, rv)
            if everything is None:
                raise ApiError(410, "Expired", EXPIRED_CONTINUE)
            everything = [o for o in everything if sort_key(o) > start]
        else:
            with self.store.lock:
                rv, everything = self.store.rv, self.store.list(rt.key, scope)
        items = [o for o in everything if labels_match(labels, o) and fields_match(field_reqs, o)]
        list_meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if limit and len(items) > limit:
            last = sort_key(items[limit - 1])
            if not cont:
                self.store.keep_snapshot(rt.key, scope, rv, everything)
            list_meta["continue"] = encode_continue(rv, last)
            list_meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        return {"kind": rt.list_kind, "apiVersion": rt.api_version, "metadata": list_meta,
                "items": [self.served(rt, o) for o in items]}

    # ------------------------------------------------------------ create
    def create(self, rt: ResourceType, ns: str, body: Any, opts: WriteOptions,
               managed: bool = False) -> dict[str, Any]:
        obj = self.check_body(rt, body)
        m = meta(obj)
        self.place(rt, ns, m)
        if not m.get("name") and m.get("generateName"):
            m["name"] = self.unique_name(rt, m)
        causes = name_causes(m.get("name", ""), label_only=rt.plural in ("namespaces", "services"))
        causes += metadata_causes(m)
        if causes:
            raise errors.invalid(rt.kind, rt.group, m.get("name", ""), causes)
        if self.store.get(rt.key, m.get("namespace", ""), m["name"]) is not None:
            raise errors.already_exists(rt.plural, rt.group, m["name"])
        for key in SERVER_FIELDS:
            m.pop(key, None)
        m.update({"uid": new_uid(), "creationTimestamp": now()})
        if rt.generation:
            m["generation"] = 1
        if rt.status:
            obj.pop("status", None)
        self.prepare_create(rt, obj, opts)
        if not managed:
            m.pop("managedFields", None)
            apply.record_update(rt, None, obj, opts.manager)
        if opts.dry_run:
            return obj
        self.store.put(rt.key, obj)
        self.after_write(rt, obj)
        return self.served(rt, obj)

    def check_body(self, rt: ResourceType, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise errors.bad_request("the body of the request was in an unknown format")
        if body.get("kind") not in (None, rt.kind):
            raise errors.bad_request(f'the API version in the data ({body.get("apiVersion")}) does not match '
                                     f"the expected API version ({rt.api_version})")
        obj = copy.deepcopy(body)
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        return obj

    def place(self, rt: ResourceType, ns: str, m: dict[str, Any]) -> None:
        """Namespace from the URL; the namespace must exist and must not be terminating."""
        if not rt.namespaced:
            m.pop("namespace", None)
            return
        if m.get("namespace") and m["namespace"] != ns:
            raise errors.bad_request("the namespace of the provided object does not match the namespace sent "
                                     "on the request")
        m["namespace"] = ns
        namespace = self.store.get(NS_KEY, "", ns)
        if namespace is None:
            raise errors.not_found("namespaces", "", ns)
        if (namespace.get("metadata") or {}).get("deletionTimestamp"):
            raise ApiError(403, "Forbidden", f"{rt.plural} \"{m.get('name', '')}\" is forbidden: unable to "
                           f"create new content in namespace {ns} because it is being terminated")

    def unique_name(self, rt: ResourceType, m: dict[str, Any]) -> str:
        for _ in range(20):
            name = generated_name(m["generateName"])
            if self.store.get(rt.key, m.get("namespace", ""), name) is None:
                return name
        raise errors.already_exists(rt.plural, rt.group, m["generateName"])

    def prepare_create(self, rt: ResourceType, obj: dict[str, Any], opts: WriteOptions) -> None:
        """Kind-specific defaults and validation on create."""
        if rt.key == CRD_KEY:
            crd.validate_crd(obj)
            obj["status"] = crd.established_status(obj)
        elif rt.key == NS_KEY:
            obj["spec"] = {"finalizers": ["kubernetes"]}
            obj["status"] = {"phase": "Active"}
            meta(obj).setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
        elif rt.key == "/pods":
            obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        elif rt.scale and rt.builtin:
            obj.setdefault("spec", {}).setdefault("replicas", 1)
        if rt.custom is not None:
            crd.process_custom_object(rt, obj, None, opts)
        else:
            builtin_schema.check(rt, obj, opts)
            self.check_builtin_rules(rt, obj)

    # ------------------------------------------------------------ update
    def replace(self, rt: ResourceType, ns: str, name: str, body: Any, opts: WriteOptions,
                subresource: str = "") -> dict[str, Any]:
        old = self.existing(rt, ns, name)
        new = self.check_body(rt, body)
        return self.commit(rt, old, new, opts, subresource, from_put=True)

    def commit(self, rt: ResourceType, old: dict[str, Any], new: dict[str, Any], opts: WriteOptions,
               subresource: str = "", managed: bool = False, from_put: bool = False) -> dict[str, Any]:
        """Validate and store an update of `old` to `new`, following the API server's rules."""
        m_old, m_new = old["metadata"], meta(new)
        self.check_identity(rt, m_old, m_new)
        if from_put and rt.custom is not None and not m_new.get("resourceVersion"):
            raise errors.invalid(rt.kind, rt.group, m_old["name"], [Cause(           # no unconditional CR update
                "FieldValueInvalid", "Invalid value: 0x0: must be specified for an update",
                "metadata.resourceVersion")])
        if from_put and m_new.get("resourceVersion") and m_new["resourceVersion"] != m_old["resourceVersion"]:
            raise errors.stale_update(rt.plural, rt.group, m_old["name"])
        if not from_put and m_new.get("resourceVersion", m_old["resourceVersion"]) != m_old["resourceVersion"]:
            raise errors.stale_update(rt.plural, rt.group, m_old["name"])
        new = self.scope(rt, old, new, subresource)
        m_new = new["metadata"]
        for key in SERVER_FIELDS:
            if key in m_old:
                m_new[key] = m_old[key]
            else:
                m_new.pop(key, None)
        self.check_finalizers(rt, m_old, m_new)
        causes = metadata_causes(m_new)
        if causes:
            raise errors.invalid(rt.kind, rt.group, m_old["name"], causes)
        if rt.custom is not None:
            crd.process_custom_object(rt, new, old, opts)
        else:
            builtin_schema.check(rt, new, opts)
            if subresource != "status":                 # the status strategy validates status alone
                self.check_builtin_rules(rt, new)
                if rt.key == pods.PODS_KEY and subresource != "binding":
                    pods.check_update(old, new)
        if rt.key == CRD_KEY:
            crd.validate_crd(new)
            new["status"] = crd.established_status(new)
        if rt.generation and spec_changed(rt, old, new):
            m_new["generation"] = int(m_old.get("generation", 1)) + 1
        if not managed:
            m_new["managedFields"] = copy.deepcopy(m_old.get("managedFields") or [])
            apply.record_update(rt, old, new, opts.manager, subresource)
        if same_content(old, new):
            return self.served(rt, old)
        if opts.dry_run:
            return self.served(rt, new)
        if (m_new.get("deletionTimestamp") and not m_new.get("finalizers") and rt.key != NS_KEY
                and not m_new.get("deletionGracePeriodSeconds")):     # a terminating pod waits for its kubelet
            return self.served(rt, self.finish_delete(rt, new))
        self.store.put(rt.key, new, old)
        self.after_write(rt, new)
        return self.served(rt, new)

    def check_identity(self, rt: ResourceType, m_old: dict[str, Any], m_new: dict[str, Any]) -> None:
        if m_new.get("name") and m_new["name"] != m_old["name"]:
            raise errors.bad_request(f"the name of the object ({m_new['name']}) does not match the name on the "
                                     f"URL ({m_old['name']})")
        if rt.namespaced and m_new.get("namespace") and m_new["namespace"] != m_old.get("namespace"):
            raise errors.bad_request("the namespace of the provided object does not match the namespace sent "
                                     "on the request")
        if m_new.get("uid") and m_new["uid"] != m_old["uid"]:
            raise errors.conflict(rt.plural, rt.group, m_old["name"], "Precondition failed: UID in precondition: "
                                  f"{m_new['uid']}, UID in object meta: {m_old['uid']}")
        m_new["name"] = m_old["name"]
        if rt.namespaced:
            m_new["namespace"] = m_old["namespace"]

    def scope(self, rt: ResourceType, old: dict[str, Any], new: dict[str, Any], subresource: str) -> dict[str, Any]:
        """Status writes change only status; main writes leave status alone when it is a subresource."""
        if subresource == "status":
            result = copy.deepcopy(old)
            result["metadata"]["resourceVersion"] = new["metadata"].get("resourceVersion",
                                                                        old["metadata"]["resourceVersion"])
            set_or_drop(result, "status", new.get("status"))
            if "managedFields" in new["metadata"]:             # server-side apply's bookkeeping for /status
                result["metadata"]["managedFields"] = new["metadata"]["managedFields"]
            return result
        if rt.status and subresource != "binding":        # a binding sets the PodScheduled condition too
            set_or_drop(new, "status", copy.deepcopy(old.get("status")))
        return new

    def check_builtin_rules(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        causes = builtin_rules.causes(rt, obj)
        if causes:
            raise errors.invalid(rt.kind, rt.group, obj["metadata"].get("name", ""), causes)

    def check_finalizers(self, rt: ResourceType, m_old: dict[str, Any], m_new: dict[str, Any]) -> None:
        if not m_old.get("deletionTimestamp"):
            return
        added = set(m_new.get("finalizers") or []) - set(m_old.get("finalizers") or [])
        if added:
            raise errors.invalid(rt.kind, rt.group, m_old["name"], [Cause(
                "FieldValueForbidden", "Forbidden: no new finalizers can be added if the object is being deleted, "
                f"found new finalizers {sorted(added)!r}", "metadata.finalizers")])

    # ------------------------------------------------------------ patch
    def patch(self, rt: ResourceType, ns: str, name: str, content_type: str, raw: bytes, opts: WriteOptions,
              subresource: str = "") -> dict[str, Any]:
        kind = content_type.split(";")[0].strip()
        if kind not in PATCH_TYPES:
            raise errors.unsupported_media(f"the body of the request was in an unknown format - accepted media "
                                           f"types include: {', '.join(PATCH_TYPES)}")
        if kind == "application/apply-patch+yaml":
            return self.apply(rt, ns, name, raw, opts, subresource)
        body = parse_json(raw)
        old = self.existing(rt, ns, name)
        if kind == "application/strategic-merge-patch+json" and not rt.builtin:
            raise errors.unsupported_media("the body of the request was in an unknown format - accepted media "
                                           "types include: application/json-patch+json, application/merge-patch+"
                                           "json, application/apply-patch+yaml")
        new = patched(kind, old, body, builtin_schema.kind_definition(rt))
        if not isinstance(new, dict):
            raise errors.bad_request("the patch produced something other than an object")
        new["apiVersion"], new["kind"] = rt.api_version, rt.kind
        return self.commit(rt, old, new, opts, subresource)

    def apply(self, rt: ResourceType, ns: str, name: str, raw: bytes, opts: WriteOptions,
              subresource: str = "") -> dict[str, Any]:
        try:
            applied = yaml.safe_load(raw.decode() or "{}")
        except yaml.YAMLError as exc:
            raise errors.bad_request(f"error decoding YAML: {exc}") from None
        if not isinstance(applied, dict) or applied.get("kind") != rt.kind or \
                applied.get("apiVersion") != rt.api_version:
            raise errors.bad_request(f"the apply configuration must have apiVersion {rt.api_version} and kind "
                                     f"{rt.kind}")
        if not opts.manager or opts.manager == "unknown":
            raise errors.bad_request("PATCH, application/apply-patch+yaml requires fieldManager to be set")
        m = meta(applied)
        if m.get("name", name) != name:
            raise errors.bad_request(f"the name of the object ({m.get('name')}) does not match the name on the "
                                     f"URL ({name})")
        m["name"] = name
        live = self.store.get(rt.key, ns if rt.namespaced else "", name)
        result = apply.server_side_apply(rt, live, applied, opts.manager, opts.force, subresource)
        if live is None:
            if subresource:
                raise errors.not_found(rt.plural, rt.group, name)
            return self.create(rt, ns, result, opts, managed=True)
        return self.commit(rt, live, result, opts, subresource, managed=True)

    # ------------------------------------------------------------ scale
    def get_scale(self, rt: ResourceType, ns: str, name: str) -> dict[str, Any]:
        obj = self.existing(rt, ns, name)
        spec = rt.scale
        status: dict[str, Any] = {"replicas": dig(obj, spec.status_replicas) or 0}
        if spec.selector:
            selector = dig(obj, spec.selector)
            value = selector_string(selector) if spec.selector_is_object else selector
            if value:
                status["selector"] = value
        m = obj["metadata"]
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {k: m[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                             if k in m},
                "spec": {"replicas": dig(obj, spec.spec_replicas) or 0}, "status": status}

    def update_scale(self, rt: ResourceType, ns: str, name: str, body: Any, opts: WriteOptions,
                     content_type: str = "") -> dict[str, Any]:
        old = self.existing(rt, ns, name)
        current = self.get_scale(rt, ns, name)
        if content_type:
            kind = content_type.split(";")[0].strip()
            body = patched("application/merge-patch+json" if "strategic" in kind else kind, current, body)
        rv = ((body or {}).get("metadata") or {}).get("resourceVersion")
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise errors.stale_update(rt.plural, rt.group, name)
        replicas = ((body or {}).get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            raise errors.invalid("Scale", "autoscaling", name, [Cause(
                "FieldValueInvalid", f"Invalid value: {replicas}: must be greater than or equal to 0",
                "spec.replicas")])
        new = copy.deepcopy(old)
        set_path(new, rt.scale.spec_replicas, replicas)
        self.commit(rt, old, new, opts)
        return self.get_scale(rt, ns, name)

    # ------------------------------------------------------------ pods/binding
    def bind(self, rt: ResourceType, ns: str, name: str, body: Any, opts: WriteOptions) -> dict[str, Any]:
        """POST pods/NAME/binding: assign the pod to the target node (201 Status), 409 if it is already."""
        target = pods.check_binding(body, name)
        old = self.existing(rt, ns, name)
        new = pods.bound(old, body, target["name"])
        self.commit(rt, old, new, opts, "binding")
        return dict(pods.BINDING_SUCCESS)

    # ------------------------------------------------------------ delete
    def delete(self, rt: ResourceType, ns: str, name: str, options: dict[str, Any] | None = None,
               dry_run: bool = False) -> dict[str, Any]:
        options = options or {}
        obj = self.existing(rt, ns, name)
        self.check_preconditions(rt, obj, options.get("preconditions") or {})
        if dry_run:
            return self.served(rt, obj)
        if rt.key == CRD_KEY:
            self.drop_custom_resources(obj)
        new = copy.deepcopy(obj)
        m = new["metadata"]
        pending_grace = int(m.get("deletionGracePeriodSeconds") or 0) if m.get("deletionTimestamp") else 0
        graceful = rt.key == pods.PODS_KEY and (pending_grace or not m.get("deletionTimestamp"))
        grace = pods.grace_period(obj, options) if graceful else 0
        if pending_grace and grace >= pending_grace:
            return self.served(rt, obj)                 # a second DELETE may only shorten the grace period
        finalizers = list(m.get("finalizers") or [])
        policy = options.get("propagationPolicy") or ("Orphan" if options.get("orphanDependents") else "Background")
        extra = {"Foreground": "foregroundDeletion", "Orphan": "orphan"}.get(policy)
        if extra and extra not in finalizers and not m.get("deletionTimestamp"):
            finalizers.append(extra)
        if rt.key == NS_KEY:
            new.setdefault("status", {})["phase"] = "Terminating"
            finalizers = finalizers or []
        if not finalizers and rt.key != NS_KEY and not grace:
            return self.served(rt, self.finish_delete(rt, obj))
        if finalizers:
            m["finalizers"] = finalizers
        if not m.get("deletionTimestamp") and int(m.get("generation") or 0) > 0:
            m["generation"] = int(m["generation"]) + 1          # controllers see that deletion started
        if pending_grace:                                       # shortened: the deadline moves with it
            m["deletionTimestamp"] = later(m["deletionTimestamp"], grace - pending_grace)
        m.setdefault("deletionTimestamp", later(now(), grace))
        m["deletionGracePeriodSeconds"] = grace
        if new != obj:
            self.store.put(rt.key, new, obj)
        self.trigger_gc()
        return self.served(rt, new)

    def check_preconditions(self, rt: ResourceType, obj: dict[str, Any], pre: dict[str, Any]) -> None:
        m = obj["metadata"]
        if pre.get("uid") and pre["uid"] != m["uid"]:
            raise errors.conflict(rt.plural, rt.group, m["name"], f"Precondition failed: UID in precondition: "
                                  f"{pre['uid']}, UID in object meta: {m['uid']}")
        if pre.get("resourceVersion") and pre["resourceVersion"] != m["resourceVersion"]:
            raise errors.conflict(rt.plural, rt.group, m["name"], "Precondition failed: ResourceVersion in "
                                  f"precondition: {pre['resourceVersion']}, ResourceVersion in object meta: "
                                  f"{m['resourceVersion']}")

    def finish_delete(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        final = self.store.remove(rt.key, obj)
        if rt.key == CRD_KEY:
            self.unregister(obj)
        self.trigger_gc()
        return final

    def delete_collection(self, rt: ResourceType, ns: str | None, label: str | None, fields: str | None,
                          options: dict[str, Any] | None) -> dict[str, Any]:
        listed = self.list(rt, ns, label, fields)
        for obj in listed["items"]:
            m = obj["metadata"]
            try:
                self.delete(rt, m.get("namespace", ""), m["name"], options)
            except ApiError as exc:
                if exc.code != 404:
                    raise
        return listed

    def trigger_gc(self) -> None:
        for hook in self.on_delete:
            hook()

    # ------------------------------------------------------------ CRDs
    def after_write(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        if rt.key == CRD_KEY:
            self.register(obj)
        if obj["metadata"].get("deletionTimestamp"):
            self.trigger_gc()

    def register(self, crd_obj: dict[str, Any]) -> None:
        spec = crd_obj["spec"]
        self.registry.remove_group_plural(spec["group"], spec["names"]["plural"])
        for rt in crd.resource_types(crd_obj):
            self.registry.add(rt)

    def unregister(self, crd_obj: dict[str, Any]) -> None:
        spec = crd_obj["spec"]
        self.registry.remove_group_plural(spec["group"], spec["names"]["plural"])

    def drop_custom_resources(self, crd_obj: dict[str, Any]) -> None:
        key = f"{crd_obj['spec']['group']}/{crd_obj['spec']['names']['plural']}"
        for obj in self.store.list(key):
            self.store.remove(key, obj)

    def restore_crds(self) -> None:
        for crd_obj in self.store.list(CRD_KEY):
            self.register(crd_obj)


# ---------------------------------------------------------------- small pure helpers
def parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw or b"null")
    except ValueError as exc:
        raise errors.bad_request(f"error decoding patch: {exc}") from None


def patched(kind: str, old: Any, body: Any, schema: dict[str, Any] | None = None) -> Any:
    if kind == "application/json-patch+json":
        return patch.json_patch(old, body)
    if kind == "application/merge-patch+json":
        return patch.merge_patch(old, body)
    return patch.strategic_merge(old, body, schema)


def strip_volatile(obj: dict[str, Any], keep_status: bool) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "apiVersion", "kind") and
            (keep_status or k != "status")}


def spec_changed(rt: ResourceType, old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Generation moves on changes outside metadata (and outside status when status is a subresource)."""
    return strip_volatile(old, not rt.status) != strip_volatile(new, not rt.status)


def same_content(old: dict[str, Any], new: dict[str, Any]) -> bool:
    def norm(o: dict[str, Any]) -> dict[str, Any]:
        m = {k: v for k, v in o["metadata"].items() if k not in ("resourceVersion", "managedFields")}
        return {**o, "metadata": m, "apiVersion": None}
    return norm(old) == norm(new) and managed_sets(old) == managed_sets(new)


def managed_sets(obj: dict[str, Any]) -> list:
    return [(e.get("manager"), e.get("operation"), e.get("subresource"), e.get("fieldsV1"))
            for e in obj["metadata"].get("managedFields") or []]


def later(timestamp: str, seconds: int) -> str:
    return (parse_time(timestamp) + datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_or_drop(obj: dict[str, Any], key: str, value: Any) -> None:
    if value is None:
        obj.pop(key, None)
    else:
        obj[key] = value


def dig(obj: Any, path: str) -> Any:
    for part in path.strip(".").split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    parts = path.strip(".").split(".")
    for part in parts[:-1]:
        obj = obj.setdefault(part, {})
    obj[parts[-1]] = value


def sort_key(obj: dict[str, Any]) -> list[str]:
    m = obj["metadata"]
    return [m.get("namespace", ""), m["name"]]


def encode_continue(rv: int, key: list[str]) -> str:
    return base64.urlsafe_b64encode(json.dumps({"rv": rv, "start": key}).encode()).decode()


def decode_continue(token: str) -> tuple[int, list[str]]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return int(data["rv"]), list(data["start"])
    except (ValueError, KeyError, TypeError):
        raise errors.bad_request("continue key is not valid: incorrect encoded start resourceVersion "
                                 "(version meta.k8s.io/v1)") from None
