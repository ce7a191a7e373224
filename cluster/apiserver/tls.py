"""The serving certificate of the emulator's HTTPS port: a self-signed ECDSA certificate for 127.0.0.1 and
localhost (and the bind address), made by the `openssl` command at start and trusted by the kubeconfig
(`certificate-authority-data`).

HTTPS matters because kubectl (client-go) sends credentials only over TLS: against a plain-HTTP server it
is always anonymous, so ServiceAccount tokens can only be used by kubectl on the HTTPS port.
"""
from __future__ import annotations

import ipaddress
import logging
import shutil
import ssl
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Certificate:
    folder: Path
    cert: Path
    key: Path

    @property
    def pem(self) -> bytes:
        return self.cert.read_bytes()

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        return context

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def self_signed(host: str = "127.0.0.1") -> Certificate | None:
    """A fresh certificate in a private temp folder; None (and a warning) when `openssl` cannot make one."""
    names = {"IP:127.0.0.1", "DNS:localhost", _san(host)}
    folder = Path(tempfile.mkdtemp(prefix="specfleet-apiserver-tls-"))
    cert = Certificate(folder, folder / "tls.crt", folder / "tls.key")
    command = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
               "-subj", "/CN=specfleet-apiserver", "-days", "3650", "-keyout", str(cert.key), "-out", str(cert.cert),
               "-addext", "subjectAltName=" + ",".join(sorted(names)),
               "-addext", "basicConstraints=critical,CA:TRUE",
               "-addext", "keyUsage=critical,digitalSignature,keyCertSign", "-addext", "extendedKeyUsage=serverAuth"]
    try:
        subprocess.run(command, check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("no HTTPS port: openssl could not make a certificate (%s)", exc)
        cert.remove()
        return None
    return cert


def _san(host: str) -> str:
    try:
        ipaddress.ip_address(host)
        return f"IP:{host}"
    except ValueError:
        return f"DNS:{host}"
