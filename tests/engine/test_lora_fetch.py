"""Fetching remote LoRA adapters (`engine/lora/fetch.py`) from real servers: a folder over HTTP, a real
distribution registry with an `oras push`ed artifact, and a registry stand-in that asks for a token and
serves a blob that does not match its digest."""
from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from lora_kit import build_adapter
from remote_kit import ADAPTER_FILES, push, registry, serving_folder
from testkit import free_port

from specfleet.engine.lora.fetch import (FetchError, FetchOptions, OCIRef, SourceUnavailable, cache_folder, fetch,
                                         insecure, localize, parse_oci)


@pytest.fixture(scope="module")
def adapter(tiny_llama, tmp_path_factory) -> Path:
    """A real PEFT folder (it also holds peft's README.md, which a fetch must not need)."""
    return Path(build_adapter(tiny_llama, tmp_path_factory.mktemp("adapter") / "qv", 2, r=4, lora_alpha=8,
                              target_modules=["q_proj", "v_proj"]))


@pytest.fixture
def options(tmp_path) -> FetchOptions:
    return FetchOptions(cache_dir=tmp_path / "cache")


def same_files(a: Path, b: Path) -> bool:
    return all((a / name).read_bytes() == (b / name).read_bytes() for name in ADAPTER_FILES)


def leftovers(options: FetchOptions) -> list[str]:
    return sorted(p.name for p in options.cache_dir.iterdir()) if options.cache_dir.exists() else []


def test_a_folder_url_is_fetched_once_into_its_cache_folder_and_then_reused_without_a_request(adapter, options):
    with serving_folder(adapter.parent) as web:
        source = f"{web.url}/qv/"
        got = fetch(source, options)
        assert got == cache_folder(source, options.cache_dir) and same_files(got, adapter)
        assert web.paths == ["/qv/adapter_config.json", "/qv/adapter_model.safetensors"]
        assert localize(source, options) == str(got) and len(web.paths) == 2          # cached: no request
    assert fetch(source, options) == got                                             # server gone: still served
    assert leftovers(options) == [got.name]                                          # no staging folder left
    assert localize("adapters/qv", options) == "adapters/qv"                         # a folder passes through


@pytest.mark.parametrize("case, error, message", [
    ("missing", FetchError, "answered HTTP 404"),
    ("not-peft", FetchError, "/adapter_config.json is not valid JSON"),
    ("not-lora", FetchError, "holds a PREFIX_TUNING adapter; only LORA adapters are served"),
    ("not-safetensors", FetchError, "adapter_model.safetensors is not a safetensors file"),
    ("too-big", FetchError, "goes past the 1000 byte cap"),
    ("down", SourceUnavailable, "cannot reach"),
    ("plain-http-elsewhere", FetchError, "plain http is only fetched from localhost"),
    ("hf", FetchError, "hf:// is not fetched"),
])
def test_a_bad_source_is_refused_with_its_reason_and_leaves_nothing_in_the_cache(adapter, tmp_path, options, case,
                                                                                error, message):
    root = tmp_path / "web"
    (root / "not-peft").mkdir(parents=True)
    (root / "not-peft/adapter_model.safetensors").write_bytes((adapter / "adapter_model.safetensors").read_bytes())
    (root / "not-peft/adapter_config.json").write_text("<html>a web page, not an adapter</html>")
    for name, config, weights in (("not-lora", {"peft_type": "PREFIX_TUNING", "r": 4}, None),
                                  ("not-safetensors", {"r": 4}, b"not a tensor file")):
        (root / name).mkdir()
        (root / name / "adapter_config.json").write_text(json.dumps(config))
        (root / name / "adapter_model.safetensors").write_bytes(weights or b"")
    if case == "too-big":
        options = FetchOptions(cache_dir=options.cache_dir, max_bytes=1000)
    with serving_folder(root) as web:
        source = {"missing": f"{web.url}/nothing", "not-peft": f"{web.url}/not-peft",
                  "not-lora": f"{web.url}/not-lora", "not-safetensors": f"{web.url}/not-safetensors",
                  "too-big": f"{web.url}/not-lora", "down": f"http://127.0.0.1:{free_port()}/qv",
                  "plain-http-elsewhere": "http://example.invalid/qv", "hf": "hf://org/qv"}[case]
        if case == "too-big":
            (root / "not-lora/adapter_model.safetensors").write_bytes(b"x" * 2000)
        with pytest.raises(error, match=re.escape(message)) as raised:
            localize(source, options)
    assert type(raised.value) is error and source in str(raised.value)
    assert leftovers(options) == []                                   # no cache folder, no staging folder


def test_oci_references_parse_and_only_local_or_listed_registries_get_plain_http():
    digest = "sha256:" + "ab" * 32
    assert parse_oci("oci://reg.io:5000/team/sql:v1.2") == OCIRef("reg.io:5000", "team/sql", "v1.2")
    assert parse_oci("oci://reg.io/sql").reference == "latest"
    assert parse_oci(f"oci://reg.io/sql@{digest}").pinned == digest
    for bad in ("oci://reg.io", "oci://reg.io/Sql:1", "oci://reg.io/sql@md5:00"):
        with pytest.raises(FetchError, match="not an OCI reference"):
            parse_oci(bad)
    assert insecure("localhost:5000", FetchOptions()) and insecure("127.0.0.1", FetchOptions())
    assert not insecure("reg.io:5000", FetchOptions())
    assert insecure("reg.io:5000", FetchOptions(insecure_registries=("reg.io:5000",)))
    assert insecure("reg.io:5000", FetchOptions(insecure_registries=("reg.io",)))              # any port
    assert not insecure("reg.io:5000", FetchOptions(insecure_registries=("reg.io:6000",)))


def manifest_digest(host: str, repo: str, tag: str) -> str:
    response = httpx.head(f"http://{host}/v2/{repo}/manifests/{tag}",
                          headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
    return response.headers["docker-content-digest"]


def test_an_oras_artifact_on_a_real_registry_is_fetched_by_tag_and_by_digest(adapter, tmp_path, options):
    with registry(tmp_path / "registry") as host:
        push(f"{host}/adapters/qv:v1", [adapter / name for name in (*ADAPTER_FILES, "README.md")])
        push(f"{host}/adapters/half:v1", [adapter / "adapter_config.json"])
        by_tag = fetch(f"oci://{host}/adapters/qv:v1", options)
        assert same_files(by_tag, adapter) and sorted(p.name for p in by_tag.iterdir()) == sorted(ADAPTER_FILES)
        digest = manifest_digest(host, "adapters/qv", "v1")
        assert same_files(fetch(f"oci://{host}/adapters/qv@{digest}", options), adapter)
        with pytest.raises(FetchError, match="no layer titled adapter_model.safetensors"):
            fetch(f"oci://{host}/adapters/half:v1", options)
        with pytest.raises(FetchError, match="answered HTTP 404"):
            fetch(f"oci://{host}/adapters/qv@sha256:{'0' * 64}", options)
        with pytest.raises(FetchError, match="answered HTTP 404"):
            fetch(f"oci://{host}/adapters/qv:v2", options)
    assert fetch(f"oci://{host}/adapters/qv:v1", options) == by_tag                # registry gone: the cache serves


class LyingRegistry(BaseHTTPRequestHandler):
    """Asks for an anonymous bearer token (WWW-Authenticate), then serves a manifest whose weights blob is not
    the content its digest names (a corrupt mirror)."""

    blobs: dict[str, bytes] = {}
    manifest: bytes = b""
    tokens: list[str] = []

    def do_GET(self) -> None:
        host = self.headers["Host"]
        if self.path.startswith("/token?"):
            self.tokens.append(self.path)
            return self.send(200, json.dumps({"token": "t0k"}).encode())
        if self.headers.get("Authorization") != "Bearer t0k":
            return self.send(401, b"", {"WWW-Authenticate": f'Bearer realm="http://{host}/token",'
                                                           'service="fake",scope="repository:lie:pull"'})
        if self.path == "/v2/lie/manifests/v1":
            return self.send(200, self.manifest, {"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
        digest = self.path.rsplit("/", 1)[-1]
        self.send(200, self.blobs[digest]) if digest in self.blobs else self.send(404, b"")

    def send(self, code: int, body: bytes, headers: dict | None = None) -> None:
        self.send_response(code)
        for key, value in {**(headers or {}), "Content-Length": str(len(body))}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_a_blob_that_does_not_match_its_digest_is_refused_after_the_token_flow(adapter, options):
    config, weights = ((adapter / name).read_bytes() for name in ADAPTER_FILES)
    digests = [f"sha256:{hashlib.sha256(data).hexdigest()}" for data in (config, weights)]
    LyingRegistry.blobs = {digests[0]: config, digests[1]: weights[:-1] + b"!"}
    LyingRegistry.manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": d, "size": len(data),
                    "annotations": {"org.opencontainers.image.title": name}}
                   for d, data, name in zip(digests, (config, weights), ADAPTER_FILES)]}).encode()
    server = ThreadingHTTPServer(("127.0.0.1", 0), LyingRegistry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(FetchError, match=f"blob adapter_model.safetensors does not match its digest: "
                                             f"expected {digests[1]}"):
            fetch(f"oci://127.0.0.1:{server.server_address[1]}/lie:v1", options)
    finally:
        server.shutdown()
        server.server_close()
    assert LyingRegistry.tokens == ["/token?service=fake&scope=repository%3Alie%3Apull"]
    assert leftovers(options) == []
