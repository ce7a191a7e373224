"""Fetch a remote PEFT LoRA adapter (an https:// folder or an oci:// artifact) into a local cache folder.

`localize(source, options)` returns a folder the engine can load: a local path as given, or the cache folder
`<cache_dir>/<sha256 of the source>/` holding `adapter_config.json` and `adapter_model.safetensors`. A
complete cached copy is reused without any request (a tag is fetched once per cache: name a new tag or a
digest to change the adapter). A fetch downloads into a temporary folder next to it, checks the files (JSON
config of a LORA adapter, a readable safetensors header, sha256 of every OCI blob, a size cap) and renames
it into place, so a folder in the cache is always whole.

- `https://host/path` is a folder URL: GET `<url>/adapter_config.json` and `<url>/adapter_model.safetensors`.
- `oci://host[:port]/repo:tag` or `oci://host/repo@sha256:...` is an artifact pushed as files (`oras push
  ref adapter_config.json adapter_model.safetensors`): the distribution API's manifest, then each blob by
  digest, named by its `org.opencontainers.image.title` annotation; an anonymous bearer token is fetched
  when the registry answers 401.
- Plain `http://` (URL or registry) only for localhost or hosts listed in `insecure_registries`.

Errors: `FetchError` (a LoRAError: the source is wrong: 404, denied, not an adapter, bad digest, too big)
and its subclass `SourceUnavailable` (the remote cannot be reached, timed out or answered 5xx/429: retry).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from specfleet.engine.lora.adapter import CONFIG_FILE, WEIGHTS_FILE, LoRAError, read_config

FILES = (CONFIG_FILE, WEIGHTS_FILE)
REMOTE_SCHEMES = ("https", "http", "oci")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "[::1]")
TITLE = "org.opencontainers.image.title"
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json")
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json")
_OCI_REF = re.compile(r"^(?P<host>[\w.\-]+(?::\d+)?|\[[0-9a-fA-F:]+\](?::\d+)?)"
                      r"/(?P<repo>[a-z0-9]+(?:[._\-/][a-z0-9]+)*)"
                      r"(?::(?P<tag>[\w][\w.\-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")
_CHUNK = 1 << 20


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "specfleet" / "lora"


@dataclass(frozen=True)
class FetchOptions:
    cache_dir: Path = field(default_factory=default_cache_dir)
    insecure_registries: tuple[str, ...] = ()   # host or host:port reached over plain http
    max_bytes: int = 4 << 30                     # all files of one adapter together
    timeout_s: float = 30.0                      # connect, and each read
    deadline_s: float = 900.0                    # the whole fetch


class FetchError(LoRAError):
    """A remote adapter source that cannot be served as given; the message names the source and the reason."""


class SourceUnavailable(FetchError):
    """The remote could not be reached, timed out, or answered 5xx/429: the same load may work later."""


@dataclass(frozen=True)
class OCIRef:
    host: str
    repo: str
    reference: str                               # a tag or a sha256 digest

    @property
    def pinned(self) -> str | None:
        return self.reference if self.reference.startswith("sha256:") else None


def is_remote(source: str) -> bool:
    return "://" in source and source.split("://", 1)[0].lower() in REMOTE_SCHEMES


def localize(source: str, options: FetchOptions) -> str:
    """The local folder to load `source` from: itself when it is a path, else the fetched cache folder."""
    if "://" not in source:
        return source
    if not is_remote(source):
        raise FetchError(f"{source}: lora_path is a folder, an https:// folder URL or an oci:// reference; "
                         f"{source.split('://', 1)[0]}:// is not fetched")
    return str(fetch(source, options))


def cache_folder(source: str, cache_dir: Path) -> Path:
    return Path(cache_dir) / hashlib.sha256(source.encode()).hexdigest()[:32]


def is_complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in FILES)


def fetch(source: str, options: FetchOptions) -> Path:
    """`source` downloaded, checked and renamed into its cache folder (or the cached copy); raises FetchError."""
    target = cache_folder(source, options.cache_dir)
    if is_complete(target):
        return target
    try:
        Path(options.cache_dir).mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".fetch-", dir=options.cache_dir))
    except OSError as exc:
        raise FetchError(f"{source}: cannot write the LoRA cache {options.cache_dir}: {exc}") from None
    try:
        with Download(source, options) as download:
            download.into(staging)
        check_adapter(staging, source)
        publish(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def check_adapter(folder: Path, source: str) -> None:
    """The fetched files are a LORA adapter's config and a safetensors file (the engine checks the rest)."""
    from safetensors import safe_open

    try:
        read_config(folder)
    except LoRAError as exc:
        raise FetchError(str(exc).replace(str(folder), source)) from None
    try:
        with safe_open(str(folder / WEIGHTS_FILE), framework="pt") as f:
            f.keys()
    except Exception as exc:             # safetensors raises its own SafetensorError, or OSError
        raise FetchError(f"{source}: {WEIGHTS_FILE} is not a safetensors file ({exc})") from None


def publish(staging: Path, target: Path) -> None:
    """Rename `staging` to `target`; a complete copy another fetch put there first wins."""
    if target.exists() and not is_complete(target):
        shutil.rmtree(target, ignore_errors=True)
    try:
        os.rename(staging, target)
    except OSError:
        if not is_complete(target):
            raise


def parse_oci(source: str) -> OCIRef:
    rest = source.split("://", 1)[1]
    match = _OCI_REF.match(rest)
    if match is None:
        raise FetchError(f"{source}: not an OCI reference (oci://host[:port]/repo:tag or oci://host/repo@sha256:...)")
    return OCIRef(match["host"], match["repo"], match["digest"] or match["tag"] or "latest")


def insecure(host: str, options: FetchOptions) -> bool:
    """Plain http is allowed for localhost and the listed registries (host or host:port)."""
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    return name in LOCAL_HOSTS or host in options.insecure_registries or name in options.insecure_registries


class Download:
    """One fetch's HTTP session: the size budget, the deadline and the registry token live here."""

    def __init__(self, source: str, options: FetchOptions) -> None:
        self.source, self.options = source, options
        self.budget = options.max_bytes
        self.deadline = time.monotonic() + options.deadline_s
        self.client = httpx.Client(timeout=httpx.Timeout(options.timeout_s), follow_redirects=True,
                                   headers={"User-Agent": "specfleet-engine"})

    def __enter__(self) -> Download:
        return self

    def __exit__(self, *exc) -> None:
        self.client.close()

    def into(self, folder: Path) -> None:
        scheme = self.source.split("://", 1)[0].lower()
        if scheme == "oci":
            self.oci(parse_oci(self.source), folder)
        else:
            self.folder_url(scheme, folder)

    # -- https:// folder ------------------------------------------------------------------------------------
    def folder_url(self, scheme: str, folder: Path) -> None:
        host = urlsplit(self.source).netloc.rsplit("@", 1)[-1]
        if not host:
            raise FetchError(f"{self.source}: the URL has no host")
        if scheme == "http" and not insecure(host, self.options):
            raise FetchError(f"{self.source}: plain http is only fetched from localhost or a host listed in "
                             "--lora-insecure-registries; use https://")
        base = self.source.rstrip("/")
        for name in FILES:
            self.save(f"{base}/{name}", folder / name)

    # -- oci:// artifact ------------------------------------------------------------------------------------
    def oci(self, ref: OCIRef, folder: Path) -> None:
        scheme = "http" if insecure(ref.host, self.options) else "https"
        base = f"{scheme}://{ref.host}/v2/{ref.repo}"
        manifest = self.manifest(f"{base}/manifests/{ref.reference}", ref)
        titled = {layer.get("annotations", {}).get(TITLE): layer for layer in manifest.get("layers") or []}
        missing = [name for name in FILES if name not in titled]
        if missing:
            found = sorted(str(t) for t in titled if t)
            raise FetchError(f"{self.source} is not a PEFT adapter artifact: no layer titled {', '.join(missing)} "
                             f"(layer titles: {found or 'none'}; push the two files with `oras push`)")
        for name in FILES:
            layer = titled[name]
            digest, size = layer.get("digest", ""), layer.get("size")
            if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
                raise FetchError(f"{self.source}: layer {name} has digest {digest!r}; only sha256 is verified")
            self.fits(size if isinstance(size, int) else 0, name)
            got = self.save(f"{base}/blobs/{digest}", folder / name)
            if got != digest:
                raise FetchError(f"{self.source}: blob {name} does not match its digest: expected {digest}, "
                                 f"got {got}")

    def manifest(self, url: str, ref: OCIRef) -> dict:
        response = self.get(url, headers={"Accept": ", ".join(MANIFEST_TYPES + INDEX_TYPES)})
        body = response.content
        if ref.pinned and f"sha256:{hashlib.sha256(body).hexdigest()}" != ref.pinned:
            raise FetchError(f"{self.source}: the manifest does not match the digest {ref.pinned}")
        try:
            manifest = json.loads(body)
        except ValueError:
            raise FetchError(f"{self.source}: the registry's manifest is not JSON") from None
        kind = manifest.get("mediaType") or response.headers.get("content-type", "").split(";")[0]
        if kind in INDEX_TYPES:
            raise FetchError(f"{self.source} is an image index (several platforms), not an adapter artifact; "
                             "push the adapter files with `oras push`")
        if not isinstance(manifest.get("layers"), list):
            raise FetchError(f"{self.source}: the registry's manifest has no layers (media type {kind!r})")
        return manifest

    def token(self, challenge: str) -> None:
        """The anonymous bearer token flow: GET realm?service=..&scope=.. and send the token from now on."""
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        if not challenge.lower().startswith("bearer") or "realm" not in params:
            raise FetchError(f"{self.source}: the registry wants credentials ({challenge or 'no challenge'}); "
                             "only anonymous pulls are supported")
        query = {k: params[k] for k in ("service", "scope") if k in params}
        response = self.request(params["realm"], params=query)
        data = response.json() if response.status_code == 200 else {}
        token = data.get("token") or data.get("access_token")
        if not token:
            raise FetchError(f"{self.source}: the registry's token service refused an anonymous token "
                             f"(HTTP {response.status_code})")
        self.client.headers["Authorization"] = f"Bearer {token}"

    # -- HTTP -------------------------------------------------------------------------------------------------
    def request(self, url: str, headers: dict | None = None, params: dict | None = None) -> httpx.Response:
        try:
            return self.client.get(url, headers=headers, params=params)
        except httpx.TimeoutException:
            raise SourceUnavailable(f"{self.source}: {url} timed out after {self.options.timeout_s:g} s") from None
        except httpx.TransportError as exc:
            raise SourceUnavailable(f"{self.source}: cannot reach {url}: {exc or type(exc).__name__}") from None

    def get(self, url: str, headers: dict | None = None) -> httpx.Response:
        response = self.request(url, headers)
        if response.status_code == 401 and "Authorization" not in self.client.headers:
            self.token(response.headers.get("www-authenticate", ""))
            response = self.request(url, headers)
        self.check(response, url)
        return response

    def check(self, response: httpx.Response, url: str) -> None:
        code = response.status_code
        if code < 300:
            return
        error = SourceUnavailable if code >= 500 or code == 429 else FetchError
        raise error(f"{self.source}: GET {url} answered HTTP {code}")

    def save(self, url: str, file: Path) -> str:
        """Stream `url` into `file` within the size budget and the deadline; returns the sha256 digest."""
        digest = hashlib.sha256()
        try:
            with self.client.stream("GET", url) as response:
                if response.status_code == 401 and "Authorization" not in self.client.headers:
                    self.token(response.headers.get("www-authenticate", ""))
                    return self.save(url, file)
                self.check(response, url)
                with open(file, "wb") as out:
                    for chunk in response.iter_bytes(_CHUNK):
                        self.fits(len(chunk), file.name)
                        self.budget -= len(chunk)
                        if time.monotonic() > self.deadline:
                            raise SourceUnavailable(f"{self.source}: not fetched within {self.options.deadline_s:g} s")
                        digest.update(chunk)
                        out.write(chunk)
        except httpx.TimeoutException:
            raise SourceUnavailable(f"{self.source}: {url} timed out after {self.options.timeout_s:g} s") from None
        except httpx.TransportError as exc:
            raise SourceUnavailable(f"{self.source}: cannot reach {url}: {exc or type(exc).__name__}") from None
        return f"sha256:{digest.hexdigest()}"

    def fits(self, size: int, name: str) -> None:
        """`size` more bytes stay within the cap (an OCI layer's declared size is checked before its download)."""
        if size > self.budget:
            raise FetchError(f"{self.source}: {name} goes past the {self.options.max_bytes} byte cap on one "
                             "adapter's files")
