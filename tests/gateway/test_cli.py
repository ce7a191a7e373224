"""`specfleet gateway run` as an operator of a cluster runs it: against an API server from a kubeconfig
(here the emulator), ready once it follows the cluster, exits 0 on SIGTERM; bad flags are refused.
And how it reaches an API server: kubeconfig contexts, or a pod's service account."""
from __future__ import annotations

import base64
import json
import signal
import subprocess
import urllib.request

import pytest
import yaml

from specfleet.cluster.apiserver.kubeconfig import write_kubeconfig
from specfleet.cluster.apiserver.server import ApiServer, ServerConfig
from specfleet.cluster.gateway.connect import from_kubeconfig, in_cluster
from testkit import BIN, free_port, service_account_kubeconfigs, wait_for


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_gateway_run_follows_the_cluster_of_a_kubeconfig_and_exits_0_on_sigterm(tmp_path):
    server = ApiServer(ServerConfig(host="127.0.0.1", port=0)).start()
    port = free_port()
    kubeconfig = service_account_kubeconfigs(server, tmp_path)["gateway"]     # manifests/' RBAC
    proc = subprocess.Popen([str(BIN / "specfleet"), "gateway", "run", "--host", "127.0.0.1", "--port", str(port),
                             "--kubeconfig", str(kubeconfig), "--namespace", "default"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: _get(f"http://127.0.0.1:{port}/ready")[0] == 200, timeout=30)
        assert _get(f"http://127.0.0.1:{port}/v1/models") == (200, {"object": "list", "data": []})
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.stop()


@pytest.mark.parametrize("args, message", [
    (["--api-key-secret", "no-namespace"], "NAMESPACE/NAME"),
    (["--api-key-file", "/nonexistent/keys"], "No such file"),
    (["--max-held", "-1"], "hold bounds"),
])
def test_gateway_run_refuses_bad_flags_with_a_message(tmp_path, args, message):
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:1")
    proc = subprocess.run([str(BIN / "specfleet"), "gateway", "run", "--kubeconfig", str(kubeconfig), *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr


def test_a_kubeconfig_gives_the_current_context_s_server_and_token(tmp_path):
    config = {"current-context": "b", "contexts": [{"name": "a", "context": {"cluster": "x", "user": "u"}},
                                                    {"name": "b", "context": {"cluster": "y", "user": "u"}}],
              "clusters": [{"name": "x", "cluster": {"server": "http://x:1"}},
                           {"name": "y", "cluster": {"server": "https://y:6443", "insecure-skip-tls-verify": True}}],
              "users": [{"name": "u", "user": {"token": "t0k"}}]}
    (tmp_path / "kc").write_text(yaml.safe_dump(config))
    connection = from_kubeconfig(tmp_path / "kc")
    assert (connection.url, connection.token) == ("https://y:6443", "t0k") and connection.ssl_context is not None
    config["current-context"] = "missing"
    (tmp_path / "kc").write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match="no context named 'missing'"):
        from_kubeconfig(tmp_path / "kc")


def test_in_a_pod_the_service_account_token_and_api_address_are_used(tmp_path):
    with pytest.raises(ValueError, match="not in a cluster"):
        in_cluster(tmp_path, {})
    (tmp_path / "token").write_text("sa-token\n")
    ca = _self_signed_ca(tmp_path)
    if ca is None:
        pytest.skip("openssl not available to make a CA")
    connection = in_cluster(tmp_path, {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"})
    assert (connection.url, connection.token) == ("https://10.0.0.1:443", "sa-token")


def _self_signed_ca(folder):
    try:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=ca", "-days", "1",
                        "-keyout", str(folder / "ca.key"), "-out", str(folder / "ca.crt")],
                       check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.CalledProcessError):
        return None
    return base64.b64encode((folder / "ca.crt").read_bytes())
