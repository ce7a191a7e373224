"""Writing a kubeconfig that points kubectl, the `kubernetes` client and kopf at the emulator.

The default user is the emulator's admin (`TOKEN`, in `system:masters`); pass a ServiceAccount's token (from
`ApiServer.issue_token` or `kubectl create token`) and a user name to act as that account under RBAC.
`ApiServer.write_kubeconfig` fills in the HTTPS URL and certificate; kubectl sends a token only over HTTPS.
"""
from __future__ import annotations

import base64
from pathlib import Path

import yaml

CONTEXT = "specfleet"
TOKEN = "specfleet-emulator-token"
ADMIN_USER = f"{CONTEXT}-admin"


def kubeconfig(url: str, namespace: str = "default", token: str = TOKEN, user: str = ADMIN_USER,
               ca_data: bytes | None = None) -> dict:
    cluster = {"server": url, **({"certificate-authority-data": base64.b64encode(ca_data).decode()} if ca_data else {})}
    return {"apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": CONTEXT, "cluster": cluster}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": user, "namespace": namespace}}],
            "current-context": CONTEXT}


def write_kubeconfig(path: str | Path, url: str, token: str = TOKEN, user: str = ADMIN_USER,
                     namespace: str = "default", ca_data: bytes | None = None) -> Path:
    """`ca_data`: the PEM certificate an `https://` server is trusted by (`ApiServer.certificate.pem`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(kubeconfig(url, namespace, token, user, ca_data), sort_keys=False))
    return path
