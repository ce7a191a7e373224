"""How the gateway reaches the API server: in-cluster (service account) or a kubeconfig.

In a pod: `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`, the mounted token and CA.
Elsewhere: the kubeconfig's current context (server, CA file or data, bearer token or client
certificate, insecure-skip-tls-verify), which covers `specfleet up`'s kubeconfig and a kind/minikube one.
"""
from __future__ import annotations

import base64
import os
import ssl
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass
class Connection:
    url: str
    token: str | None = None
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False)


def in_cluster(root: Path = SERVICE_ACCOUNT, environ=os.environ) -> Connection:
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host or not (root / "token").exists():
        raise ValueError("not in a cluster: KUBERNETES_SERVICE_HOST or the service account token is missing")
    context = ssl.create_default_context(cafile=str(root / "ca.crt"))
    host = f"[{host}]" if ":" in host else host
    return Connection(f"https://{host}:{port}", (root / "token").read_text().strip(), context)


def from_kubeconfig(path: str | Path) -> Connection:
    config = yaml.safe_load(Path(path).read_text())
    context = _named(config, "contexts", config.get("current-context"))["context"]
    cluster = _named(config, "clusters", context["cluster"])["cluster"]
    user = _named(config, "users", context.get("user"))["user"] if context.get("user") else {}
    server = cluster["server"]
    if not server.startswith("https://"):
        return Connection(server, user.get("token"))
    if cluster.get("insecure-skip-tls-verify"):
        tls = ssl.create_default_context()
        tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
    else:
        ca = cluster.get("certificate-authority-data")
        tls = ssl.create_default_context(cafile=cluster.get("certificate-authority"),
                                         cadata=base64.b64decode(ca).decode() if ca else None)
    cert, key = _material(user, "client-certificate"), _material(user, "client-key")
    if cert and key:
        tls.load_cert_chain(cert, key)
    return Connection(server, user.get("token"), tls)


def connect(kubeconfig: str | None) -> Connection:
    """The kubeconfig when given (or $KUBECONFIG), else in-cluster."""
    path = kubeconfig or os.environ.get("KUBECONFIG")
    return from_kubeconfig(path) if path else in_cluster()


def _named(config: dict, section: str, name: str | None) -> dict:
    for item in config.get(section) or []:
        if item.get("name") == name:
            return item
    raise ValueError(f"kubeconfig: no {section[:-1]} named {name!r}")


def _material(user: dict, key: str) -> str | None:
    """A file path for a PEM given as a path or inline (`<key>-data`, written to a private temp file)."""
    if user.get(key):
        return user[key]
    data = user.get(f"{key}-data")
    if not data:
        return None
    handle, name = tempfile.mkstemp(prefix="specfleet-gateway-", suffix=".pem")
    with os.fdopen(handle, "wb") as out:
        out.write(base64.b64decode(data))
    return name
