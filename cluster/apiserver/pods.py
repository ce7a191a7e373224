"""What kube-apiserver does for Pods beyond generic objects: the `pods/binding` subresource, the spec fields an
update may change (`ValidatePodUpdate`), and the grace period of a pod's deletion (`CheckGracefulDelete`)."""
from __future__ import annotations

import copy
from typing import Any

from specfleet.cluster.apiserver import errors
from specfleet.cluster.apiserver.errors import Cause
from specfleet.cluster.apiserver.meta import now

PODS_KEY = "/pods"
DEFAULT_GRACE_S = 30                   # the default of spec.terminationGracePeriodSeconds
IMMUTABLE_SPEC = ("pod updates may not change fields other than `spec.containers[*].image`,"
                  "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions "
                  "to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was "
                  "previously negative)")
BINDING_SUCCESS = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


# ---------------------------------------------------------------- binding
def check_binding(body: Any, name: str) -> dict[str, Any]:
    """A Binding's own rules (`ValidatePodBinding`, and the name on the URL): returns the target node."""
    if not isinstance(body, dict) or body.get("kind") not in (None, "Binding"):
        raise errors.bad_request("the body of the request was in an unknown format")
    meta = body.get("metadata") or {}
    if meta.get("name") != name:
        raise errors.bad_request("name in URL does not match name in Binding object")
    target = body.get("target") if isinstance(body.get("target"), dict) else {}
    causes = []
    if target.get("kind") not in (None, "", "Node"):
        causes.append(Cause("FieldValueNotSupported", f'Unsupported value: "{target["kind"]}": supported values: '
                            '"Node", "<empty>"', "target.kind"))
    if not target.get("name"):
        causes.append(Cause("FieldValueRequired", "Required value", "target.name"))
    if causes:
        raise errors.invalid("Binding", "", name, causes)
    return target


def bound(pod: dict[str, Any], binding: dict[str, Any], node: str) -> dict[str, Any]:
    """The pod once assigned to `node` (`setPodNodeAndMetadata`); 409 when that cannot be."""
    m, name = pod["metadata"], pod["metadata"]["name"]
    wanted = binding.get("metadata") or {}
    if m.get("deletionTimestamp"):
        raise binding_conflict(name, f"pod {name} is being deleted, cannot be assigned to a host")
    if wanted.get("uid") and wanted["uid"] != m["uid"]:
        raise binding_conflict(name, f"Precondition failed: UID in precondition: {wanted['uid']}, UID in object "
                                     f"meta: {m['uid']}")
    if pod["spec"].get("nodeName"):
        raise binding_conflict(name, f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"')
    new = copy.deepcopy(pod)
    new["spec"]["nodeName"] = node
    if wanted.get("annotations"):
        new["metadata"].setdefault("annotations", {}).update(wanted["annotations"])
    status = new.setdefault("status", {})
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
    status["conditions"] = [*conditions, {"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                                          "lastTransitionTime": now()}]
    return new


def binding_conflict(name: str, why: str) -> errors.ApiError:
    return errors.conflict("pods/binding", "", name, why)


# ---------------------------------------------------------------- updates
def check_update(old: dict[str, Any], new: dict[str, Any]) -> None:
    """422 when an update changes a spec field a running pod cannot change."""
    before, after = old.get("spec") or {}, new.get("spec") or {}
    if munged(before, after) != before:
        raise errors.invalid("Pod", "", old["metadata"]["name"], [
            Cause("FieldValueForbidden", f"Forbidden: {IMMUTABLE_SPEC}", "spec")])


def munged(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """`after` with every change a pod update may make undone: equal to `before` exactly when nothing else moved."""
    out = copy.deepcopy(after)
    for key in ("containers", "initContainers"):
        old_list, new_list = before.get(key) or [], out.get(key) or []
        if len(old_list) == len(new_list):
            for old_c, new_c in zip(old_list, new_list):
                set_or_drop(new_c, "image", old_c.get("image"))
    set_or_drop(out, "activeDeadlineSeconds", before.get("activeDeadlineSeconds"))
    old_grace, new_grace = before.get("terminationGracePeriodSeconds"), out.get("terminationGracePeriodSeconds")
    if isinstance(old_grace, int) and old_grace < 0 and new_grace == 1:
        out["terminationGracePeriodSeconds"] = old_grace
    old_tol, new_tol = before.get("tolerations") or [], out.get("tolerations") or []
    if all(t in new_tol for t in old_tol):
        set_or_drop(out, "tolerations", before.get("tolerations"))
    return out


def set_or_drop(obj: dict[str, Any], key: str, value: Any) -> None:
    if value is None:
        obj.pop(key, None)
    else:
        obj[key] = value


# ---------------------------------------------------------------- deletion
def grace_period(pod: dict[str, Any], options: dict[str, Any]) -> int:
    """Seconds the kubelet gets to stop the pod: the DELETE's, else the spec's (default 30); 0 (delete at once)
    for a pod no node runs — unbound, or already Succeeded/Failed."""
    asked = options.get("gracePeriodSeconds")
    if asked is not None:
        try:
            period = int(asked)
        except (TypeError, ValueError):
            raise errors.bad_request(f"gracePeriodSeconds: invalid value {asked!r}") from None
    else:
        period = int(pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_S))
    if not pod["spec"].get("nodeName") or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return 0
    return max(period, 1) if period < 0 else period
