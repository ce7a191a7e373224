"""HTTP routing: Kubernetes URL layout -> service calls, query parameters -> options, errors -> Status."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from specfleet.cluster.apiserver import errors, openapi, protobuf, table
from specfleet.cluster.apiserver.auth import (ANONYMOUS, SA_KEY, USER, TokenAuthority, self_subject_review,
                                              token_request)
from specfleet.cluster.apiserver.authz import Authorizer
from specfleet.cluster.apiserver.errors import ApiError, Cause, bad_request, method_not_allowed, unsupported_media
from specfleet.cluster.apiserver.pods import PODS_KEY
from specfleet.cluster.apiserver.registry import Registry, ResourceType
from specfleet.cluster.apiserver.service import FIELD_VALIDATION, Service, WriteOptions
from specfleet.cluster.apiserver.watch import WatchRequest, serve_watch

log = logging.getLogger(__name__)
VERSION = {"major": "1", "minor": "37", "gitVersion": "v1.37.0-specfleet", "gitCommit": "emulator",
           "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z", "goVersion": "python",
           "compiler": "cpython", "platform": "linux/amd64"}
SUBRESOURCE_METHODS = ("GET", "PUT", "PATCH")
POST_ONLY = ("binding", "token")           # pods/binding, serviceaccounts/token
NOT_FOUND = ApiError(404, "NotFound", "the server could not find the requested resource")


def reply(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(body, separators=(",", ":")).encode(), status=status,
                        content_type="application/json")


@web.middleware
async def status_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return reply(exc.status(), exc.code)
    except web.HTTPException:
        raise
    except Exception as exc:                                    # an emulator bug: say so like k8s would
        log.exception("internal error on %s %s", request.method, request.path)
        return reply(ApiError(500, "InternalError", f"Internal error occurred: {exc}").status(), 500)


@dataclass
class Target:
    """What a resource URL addresses."""
    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None
    watch: bool


def parse_target(registry: Registry, group: str, version: str, tail: str) -> Target:
    segs = [s for s in tail.split("/") if s]
    watch = bool(segs) and segs[0] == "watch"
    segs = segs[1:] if watch else segs
    ns = None
    if len(segs) >= 3 and segs[0] == "namespaces" and not (len(segs) == 3 and segs[2] in ("status", "finalize")):
        ns, segs = segs[1], segs[2:]
    if not segs or len(segs) > 3:
        raise NOT_FOUND
    rt = registry.get(group, version, segs[0])
    if rt is None or (ns is not None and not rt.namespaced):
        raise NOT_FOUND
    name = segs[1] if len(segs) > 1 else None
    sub = segs[2] if len(segs) > 2 else None
    if sub and not ((sub == "status" and rt.status) or (sub == "scale" and rt.scale) or
                    (sub == "finalize" and rt.plural == "namespaces") or
                    (sub == "binding" and rt.key == PODS_KEY) or (sub == "token" and rt.key == SA_KEY)):
        raise NOT_FOUND
    if rt.namespaced and name is not None and ns is None:
        raise NOT_FOUND
    return Target(rt, ns, name, "status" if sub == "finalize" else sub, watch)


def write_options(request: web.Request) -> WriteOptions:
    q = request.query
    agent = request.headers.get("User-Agent", "unknown").split("/")[0] or "unknown"
    validation = q.get("fieldValidation") or "Warn"
    if validation not in FIELD_VALIDATION:
        raise bad_request(f"fieldValidation: Unsupported value: {json.dumps(validation)}: supported values: "
                          + ", ".join(f'"{v}"' for v in ("Ignore", "Strict", "Warn")))
    manager = q.get("fieldManager") or agent
    if len(manager) > 128:
        kind = {"POST": "CreateOptions", "PUT": "UpdateOptions"}.get(request.method, "PatchOptions")
        raise errors.invalid(kind, "meta.k8s.io", "", [
            Cause("FieldValueTooLong", "Too long: may not be more than 128 bytes", "fieldManager")])
    return WriteOptions(manager=manager, dry_run="All" in q.getall("dryRun", []), validation=validation,
                        force=q.get("force") == "true")


def check_patch_options(request: web.Request, content_type: str) -> None:
    """ValidatePatchOptions: apply needs a field manager; `force` belongs to apply alone (422 otherwise)."""
    apply = content_type.split(";")[0].strip() == "application/apply-patch+yaml"
    if apply and not request.query.get("fieldManager"):
        raise errors.invalid("PatchOptions", "meta.k8s.io", "", [
            Cause("FieldValueRequired", "Required value: is required for apply patch", "fieldManager")])
    if not apply and "force" in request.query:
        raise errors.invalid("PatchOptions", "meta.k8s.io", "", [
            Cause("FieldValueForbidden", "Forbidden: may not be specified for non-apply patch", "force")])


def with_warnings(response: web.Response, opts: WriteOptions) -> web.Response:
    for text in dict.fromkeys(opts.warnings):
        response.headers.add("Warning", f"299 - {json.dumps(text)}")
    return response


def wants_table(request: web.Request) -> bool:
    """The client's first choice is a Table (kubectl get), not the object itself."""
    return "as=Table" in request.headers.get("Accept", "").split(",")[0]


async def json_body(request: web.Request) -> Any:
    ctype = request.content_type
    if "protobuf" in ctype:
        raise unsupported_media("protobuf is not supported by this emulator; send application/json")
    raw = await request.read()
    try:
        return json.loads(raw or b"{}")
    except ValueError as exc:
        raise bad_request(f"error decoding body: {exc}") from None


async def review_body(request: web.Request, kind: str) -> Any:
    """A TokenRequest or SelfSubjectAccessReview body: JSON, or the protobuf kubectl sends for these two."""
    if not protobuf.is_protobuf(request.content_type):
        return await json_body(request)
    try:
        return protobuf.review_body(await request.read(), kind)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"error decoding body: {exc}") from None


def delete_options(request: web.Request, body: Any) -> dict[str, Any]:
    options = dict(body) if isinstance(body, dict) else {}
    for key in ("propagationPolicy", "gracePeriodSeconds", "orphanDependents"):
        if key in request.query:
            options[key] = request.query[key]
    if options.get("orphanDependents") in ("true", True):
        options["orphanDependents"] = True
    return options


@dataclass
class Api:
    """The aiohttp handlers, bound to one service."""
    service: Service
    bookmark_interval: float = 10.0
    tokens: TokenAuthority | None = None
    authorizer: Authorizer | None = None

    @property
    def registry(self) -> Registry:
        return self.service.registry

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/version", self.version), web.get("/healthz", self.ok), web.get("/livez", self.ok),
                web.get("/readyz", self.ok), web.get("/api", self.core_versions),
                web.get("/api/{version}", self.core_resources), web.get("/apis", self.groups),
                web.get("/apis/{group}", self.group), web.get("/apis/{group}/{version}", self.group_resources),
                web.get("/openapi/v3", self.openapi_index), web.get("/openapi/v3/{path:.+}", self.openapi_doc),
                web.post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", self.access_review),
                web.post("/apis/authentication.k8s.io/v1/selfsubjectreviews", self.whoami),
                web.route("*", "/api/{version}/{tail:.+}", self.core_resource),
                web.route("*", "/apis/{group}/{version}/{tail:.+}", self.group_resource)]

    async def version(self, _: web.Request) -> web.Response:
        return reply(VERSION)

    async def ok(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def core_versions(self, _: web.Request) -> web.Response:
        return reply(self.registry.api_versions())

    async def core_resources(self, request: web.Request) -> web.Response:
        return reply(self.registry.resource_list("", request.match_info["version"]) or raise_(NOT_FOUND))

    async def groups(self, _: web.Request) -> web.Response:
        return reply(self.registry.api_group_list())

    async def group(self, request: web.Request) -> web.Response:
        return reply(self.registry.api_group(request.match_info["group"]) or raise_(NOT_FOUND))

    async def group_resources(self, request: web.Request) -> web.Response:
        info = request.match_info
        return reply(self.registry.resource_list(info["group"], info["version"]) or raise_(NOT_FOUND))

    async def openapi_index(self, _: web.Request) -> web.Response:
        return reply(openapi.index(self.registry))

    async def openapi_doc(self, request: web.Request) -> web.Response:
        parts = request.match_info["path"].split("/")
        group, version = ("", parts[1]) if parts[0] == "api" and len(parts) == 2 else (
            (parts[1], parts[2]) if parts[0] == "apis" and len(parts) == 3 else (None, None))
        doc = openapi.document(self.registry, group, version) if version else None
        return reply(doc or raise_(NOT_FOUND))

    async def access_review(self, request: web.Request) -> web.Response:
        if self.authorizer is None:
            raise NOT_FOUND
        body = await review_body(request, "SelfSubjectAccessReview")
        review = self.authorizer.access_review(request.get(USER, ANONYMOUS), body)
        return reply(review, 201)

    async def whoami(self, request: web.Request) -> web.Response:
        return reply(self_subject_review(request.get(USER, ANONYMOUS)), 201)

    async def core_resource(self, request: web.Request) -> web.StreamResponse:
        return await self.resource(request, "", request.match_info["version"])

    async def group_resource(self, request: web.Request) -> web.StreamResponse:
        return await self.resource(request, request.match_info["group"], request.match_info["version"])

    async def resource(self, request: web.Request, group: str, version: str) -> web.StreamResponse:
        target = parse_target(self.registry, group, version, request.match_info["tail"])
        handler = {"GET": self.read, "POST": self.create, "PUT": self.replace, "PATCH": self.patch,
                   "DELETE": self.delete}.get(request.method)
        allowed = ("POST",) if target.subresource in POST_ONLY else SUBRESOURCE_METHODS
        if handler is None or (target.subresource and request.method not in allowed):
            raise method_not_allowed()              # e.g. DELETE .../status: a real server has no such route
        return await handler(request, target)

    # ------------------------------------------------------------ verbs
    async def read(self, request: web.Request, t: Target) -> web.StreamResponse:
        q, svc = request.query, self.service
        if t.name is None:
            if t.watch or q.get("watch") in ("true", "1"):
                req = WatchRequest.parse(t.rt, t.namespace, q, wants_table(request))
                return await serve_watch(request, svc, req, self.bookmark_interval)
            return self.listing(request, t)
        if t.subresource == "scale":
            return reply(svc.get_scale(t.rt, t.namespace or "", t.name))
        obj = svc.get(t.rt, t.namespace or "", t.name)
        if wants_table(request):
            return reply(table.table(t.rt, [obj], include=q.get("includeObject", "Metadata")))
        return reply(obj)

    def listing(self, request: web.Request, t: Target) -> web.Response:
        q = request.query
        check_list_version(q, self.service.store.rv)
        try:
            limit = int(q.get("limit") or 0)
        except ValueError:
            raise bad_request("limit must be an integer") from None
        listed = self.service.list(t.rt, t.namespace, q.get("labelSelector"), q.get("fieldSelector"), limit,
                                   q.get("continue", ""))
        if wants_table(request):
            return reply(table.table(t.rt, listed["items"], listed["metadata"], q.get("includeObject", "Metadata")))
        return reply(listed)

    async def create(self, request: web.Request, t: Target) -> web.Response:
        if t.subresource == "binding":
            body, opts = await json_body(request), write_options(request)
            return reply(self.service.bind(t.rt, t.namespace or "", t.name or "", body, opts), 201)
        if t.subresource == "token":
            if self.tokens is None:
                raise NOT_FOUND
            body = await review_body(request, "TokenRequest")
            return reply(token_request(self.tokens, t.namespace or "", t.name or "", body), 201)
        if t.name is not None:
            raise method_not_allowed()
        body, opts = await json_body(request), write_options(request)
        return with_warnings(reply(self.service.create(t.rt, t.namespace or "", body, opts), 201), opts)

    async def replace(self, request: web.Request, t: Target) -> web.Response:
        if t.name is None:
            raise method_not_allowed()
        body, opts = await json_body(request), write_options(request)
        if t.subresource == "scale":
            return reply(self.service.update_scale(t.rt, t.namespace or "", t.name, body, opts))
        obj = self.service.replace(t.rt, t.namespace or "", t.name, body, opts, t.subresource or "")
        return with_warnings(reply(obj), opts)

    async def patch(self, request: web.Request, t: Target) -> web.Response:
        if t.name is None:
            raise method_not_allowed()
        raw, opts, ns = await request.read(), write_options(request), t.namespace or ""
        ctype = request.headers.get("Content-Type", "")
        check_patch_options(request, ctype)
        if t.subresource == "scale":
            body = json.loads(raw or b"{}")
            return reply(self.service.update_scale(t.rt, ns, t.name, body, opts, ctype))
        existed = self.service.store.get(t.rt.key, ns if t.rt.namespaced else "", t.name) is not None
        obj = self.service.patch(t.rt, ns, t.name, ctype, raw, opts, t.subresource or "")
        return with_warnings(reply(obj, 200 if existed else 201), opts)

    async def delete(self, request: web.Request, t: Target) -> web.Response:
        raw = await request.read()
        body = json.loads(raw) if raw.strip() else {}
        options = delete_options(request, body)
        dry_run = "All" in request.query.getall("dryRun", []) or "All" in (options.get("dryRun") or [])
        if t.name is None:
            q = request.query
            listed = self.service.delete_collection(t.rt, t.namespace, q.get("labelSelector"),
                                                    q.get("fieldSelector"), options)
            return reply(listed)
        obj = self.service.delete(t.rt, t.namespace or "", t.name, options, dry_run)
        kept = self.service.store.get(t.rt.key, (obj["metadata"].get("namespace") or ""), t.name)
        # a pod left to its kubelet's graceful stop is 200, as on a real server; pending finalizers are 202
        pending = kept is not None and (t.rt.key != PODS_KEY or bool(kept["metadata"].get("finalizers")))
        return reply(obj, 202 if pending and not dry_run else 200)


def check_list_version(q: Any, current: int) -> None:
    """resourceVersionMatch=Exact can only be served for the current version (no history of lists)."""
    rv = q.get("resourceVersion")
    if q.get("resourceVersionMatch") == "Exact" and rv and rv != str(current):
        raise ApiError(410, "Expired", f"The resourceVersion for the provided list is too old: {rv}")


def raise_(exc: Exception) -> Any:
    raise exc
