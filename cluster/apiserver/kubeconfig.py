"""Writing a kubeconfig that points kubectl, the `kubernetes` client and kopf at the emulator."""
from __future__ import annotations

from pathlib import Path

import yaml

CONTEXT = "specfleet"
TOKEN = "specfleet-emulator-token"


def kubeconfig(url: str, namespace: str = "default") -> dict:
    return {"apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": CONTEXT, "cluster": {"server": url}}],
            "users": [{"name": f"{CONTEXT}-admin", "user": {"token": TOKEN}}],
            "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": f"{CONTEXT}-admin",
                                                         "namespace": namespace}}],
            "current-context": CONTEXT}


def write_kubeconfig(path: str | Path, url: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(kubeconfig(url), sort_keys=False))
    return path
