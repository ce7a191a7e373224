"""The operator and the gateway under manifests/' ServiceAccounts and RBAC, on the API emulator (docs/fleet.md).

`apply_rbac` applies the Namespace, ServiceAccounts, (Cluster)Roles and (Cluster)RoleBindings that
`kubectl apply -k manifests/` creates, read from the installed `specfleet.manifests` by following the
kustomizations' `resources` (`kustomize`): no kubectl binary is needed, so a wheel install does the same,
and tests/fleet/test_service_accounts.py checks that it yields what `kubectl kustomize manifests/` does.
`component_kubeconfigs` then asks the TokenRequest API for a token per component (`kubectl create token`),
for the ServiceAccount its Deployment names, and writes one kubeconfig per component (mode 0600).
"""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from importlib.abc import Traversable
from pathlib import Path

import yaml

from specfleet.cluster import manifest_commands, resources
from specfleet.cluster.apiserver.kubeconfig import TOKEN, write_kubeconfig

RBAC_KINDS = ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
# kind -> (API prefix, plural, namespaced): the kinds `up` applies itself
PATHS = {"Namespace": ("/api/v1", "namespaces", False), "ServiceAccount": ("/api/v1", "serviceaccounts", True),
         "Secret": ("/api/v1", "secrets", True),
         "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
         "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
         "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
         "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True)}
COMPONENTS = {"operator": manifest_commands.OPERATOR, "gateway": manifest_commands.GATEWAY}
TOKEN_SECONDS = 365 * 24 * 3600      # `kubectl create token --duration 8760h`: outlives any `up`
FIELD_MANAGER = "specfleet-up"
KUSTOMIZATION_FIELDS = {"apiVersion", "kind", "resources",
                        "images"}   # container images only: `up` runs this installation's `specfleet`


class RbacError(Exception):
    """The manifests could not be read, applied, or a token could not be had; one line."""


@dataclass(frozen=True)
class Identity:
    """A component's ServiceAccount and the kubeconfig that carries its token."""
    component: str
    namespace: str
    service_account: str
    kubeconfig: Path

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"


# -- manifests/ as kustomize builds it -----------------------------------------------------------------------
def kustomize(root: Traversable | None = None) -> list[dict]:
    """Every object the kustomization in `root` (default: the installed manifests) lists, depth first. Only
    `resources` is followed (and `images` passed over); any other kustomization field, one that could
    change the objects or the command lines, is refused rather than silently left out. A `../NAME` entry
    is the sibling data package `specfleet.NAME` (../crds: specfleet.crds)."""
    root = root or resources.package_root(manifest_commands.PACKAGE)
    kustomization = yaml.safe_load((root / "kustomization.yaml").read_text(encoding="utf-8")) or {}
    extra = set(kustomization) - KUSTOMIZATION_FIELDS
    if extra:
        raise RbacError(f"kustomization fields {sorted(extra)} are not read by `specfleet up`")
    objects: list[dict] = []
    for entry in kustomization.get("resources") or []:
        target = _resolve(root, entry)
        if target.is_dir():
            objects += kustomize(target)
        else:
            objects += [d for d in yaml.safe_load_all(target.read_text(encoding="utf-8")) if d]
    return objects


def _resolve(root: Traversable, entry: str) -> Traversable:
    if entry.startswith("../"):
        package, _, rest = entry[3:].partition("/")
        root, entry = resources.package_root(f"specfleet.{package}"), rest
    for part in [p for p in entry.split("/") if p and p != "."]:
        root = root / part
    return root


def rbac_objects(objects: list[dict] | None = None) -> list[dict]:
    """The Namespaces, ServiceAccounts and RBAC objects of manifests/, in the order they can be applied."""
    objects = kustomize() if objects is None else objects
    return sorted((o for o in objects if o.get("kind") in RBAC_KINDS), key=lambda o: RBAC_KINDS.index(o["kind"]))


# -- the API (admin credentials: `up` is the cluster's administrator) ----------------------------------------
def object_path(obj: dict) -> str:
    prefix, plural, namespaced = PATHS[obj["kind"]]
    meta = obj["metadata"]
    ns = f"/namespaces/{meta.get('namespace', 'default')}" if namespaced else ""
    return f"{prefix}{ns}/{plural}/{meta['name']}"


def call(url: str, method: str, path: str, body: dict | str | None = None, token: str = TOKEN,
         content_type: str = "application/json") -> dict:
    """One request; RbacError with the server's message on an error status or no answer."""
    data = None if body is None else (body if isinstance(body, str) else json.dumps(body)).encode()
    request = urllib.request.Request(url + path, data=data, method=method,
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": content_type,
                                              "User-Agent": FIELD_MANAGER})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read()
    except urllib.error.HTTPError as exc:
        raise RbacError(f"{method} {path}: {exc.code} {_message(exc.read())}") from None
    except OSError as exc:
        raise RbacError(f"{method} {path}: {exc}") from None
    return json.loads(text) if text else {}


def apply(url: str, obj: dict, token: str = TOKEN) -> dict:
    """Server-side apply (`kubectl apply --server-side --force-conflicts`): creates or updates."""
    return call(url, "PATCH", f"{object_path(obj)}?fieldManager={FIELD_MANAGER}&force=true", json.dumps(obj),
                token, "application/apply-patch+yaml")


def apply_rbac(url: str, token: str = TOKEN) -> list[dict]:
    """Apply manifests/' Namespace, ServiceAccounts and RBAC; returns what was applied."""
    objects = rbac_objects()
    for obj in objects:
        apply(url, obj, token)
    return objects


def request_token(url: str, namespace: str, service_account: str, seconds: int = TOKEN_SECONDS,
                  token: str = TOKEN) -> str:
    """A token for the ServiceAccount from the TokenRequest API (`kubectl create token`)."""
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": seconds}}
    answer = call(url, "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token", body, token)
    issued = (answer.get("status") or {}).get("token")
    if not issued:
        raise RbacError(f"no token in the TokenRequest answer for {namespace}/{service_account}")
    return issued


@dataclass(frozen=True)
class Endpoint:
    """Where the components reach the API: the emulator's HTTPS port and its certificate when it has one
    (as in a pod: TLS, a CA, a bearer token), else the URL `up` itself uses."""
    url: str
    ca_data: bytes | None = None

    @classmethod
    def of(cls, server) -> "Endpoint":
        """The endpoint of an `ApiServer` (`secure_url` and `certificate`, else `url`)."""
        if getattr(server, "secure_url", None) and getattr(server, "certificate", None):
            return cls(server.secure_url, server.certificate.pem)
        return cls(server.url)


def write_private_kubeconfig(path: Path, endpoint: Endpoint, token: str, user: str, namespace: str = "default") -> Path:
    """A kubeconfig only its owner can read (created 0600 before the token is written into it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    os.chmod(path, 0o600)
    return write_kubeconfig(path, endpoint.url, token, user, namespace, ca_data=endpoint.ca_data)


def component_kubeconfigs(url: str, folder: Path, endpoint: Endpoint | None = None,
                          token: str = TOKEN) -> dict[str, Identity]:
    """Apply manifests/' RBAC through `url` (as the admin), then a kubeconfig per component
    (`<folder>/<component>.kubeconfig`, for `endpoint`, default `url`) holding a token for the ServiceAccount
    its Deployment names, with that account's namespace as the default one, as in its pod."""
    endpoint = endpoint or Endpoint(url)
    apply_rbac(url, token)
    identities = {}
    for component, relative in COMPONENTS.items():
        workload = manifest_commands.workload(relative)
        identity = Identity(component, workload.namespace, workload.service_account,
                            folder / f"{component}.kubeconfig")
        issued = request_token(url, identity.namespace, identity.service_account, token=token)
        write_private_kubeconfig(identity.kubeconfig, endpoint, issued, identity.username, identity.namespace)
        identities[component] = identity
    return identities


def _message(raw: bytes) -> str:
    try:
        return json.loads(raw).get("message") or raw.decode(errors="replace")
    except ValueError:
        return raw.decode(errors="replace")[:200]
