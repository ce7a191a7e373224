"""The server's LoRA adapters: which model names are adapters, their int ids, and who is using them.

`parse_lora_module` reads one `--lora-modules` value (`name=path` or vLLM's JSON form; the path may be an
https:// or oci:// source, fetched into `fetch.cache_dir` first: `engine/lora/fetch.py`). `LoRARegistry`
lives on the event loop: a request's `model` resolves to the base model (None) or to an adapter, whose
in-flight count the request holds until it ends; `reserve`/`commit` load an adapter under a name,
`remove` unloads one. Int ids only grow: an unloaded adapter's id never names another one, so blocks its
requests left in the prefix cache can never serve the new adapter. An adapter with requests in flight is
not unloaded (409), so the engine never loses an adapter under a running sequence.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from specfleet.engine.lora.fetch import FetchOptions
from specfleet.engine.lora.request import LoRARequest
from specfleet.engine.server.openai_protocol import OpenAIError, bad_request


@dataclass(frozen=True)
class LoRAModule:
    """One adapter to serve from start-up."""
    name: str
    path: str
    base_model_name: str | None = None        # shown as `parent` in /v1/models (default: the served model)


def parse_lora_module(text: str) -> LoRAModule:
    """`name=path` or `{"name": ..., "path": ..., "base_model_name": ...}`; raises ValueError."""
    text = text.strip()
    if text.startswith("{"):
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--lora-modules {text!r} is not valid JSON: {exc}") from None
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not isinstance(spec.get("path"), str):
            raise ValueError(f"--lora-modules {text!r}: the JSON form needs string fields 'name' and 'path'")
        unknown = set(spec) - {"name", "path", "base_model_name"}
        if unknown:
            raise ValueError(f"--lora-modules {text!r}: unknown field(s) {sorted(unknown)}")
        name, path, base = spec["name"].strip(), spec["path"].strip(), spec.get("base_model_name")
    else:
        name, sep, path = (part.strip() for part in text.partition("="))
        base = None
        if not sep:
            raise ValueError(f"--lora-modules takes name=path (or JSON), got {text!r}")
    if not name or not path:
        raise ValueError(f"--lora-modules {text!r}: the name and the path must not be empty")
    return LoRAModule(name, path, base)


@dataclass
class ServedLoRA:
    request: LoRARequest                      # its lora_path is the local folder (a fetched source's cache copy)
    parent: str
    in_flight: int = 0                        # HTTP requests holding it (added to the engine, not yet ended)
    source: str | None = None                 # the https:// or oci:// source it was fetched from

    @property
    def root(self) -> str:
        """What /v1/models shows as `root`: the path or URL the adapter was loaded from, as given."""
        return self.source or str(self.request.lora_path)


@dataclass
class LoRARegistry:
    base_name: str
    enabled: bool = False
    adapters: dict[str, ServedLoRA] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)        # names being loaded
    next_id: int = 1
    fetch: FetchOptions = field(default_factory=FetchOptions)     # where https:// and oci:// sources go

    def resolve(self, model: str | None) -> ServedLoRA | None:
        """The adapter a request's `model` names; None for the base model; 404 for anything else."""
        if model is None or model == self.base_name:
            return None
        served = self.adapters.get(model)
        if served is None:
            raise OpenAIError(404, f"The model `{model}` does not exist.", "invalid_request_error", "model",
                              "model_not_found")
        return served

    def acquire(self, served: ServedLoRA | None) -> None:
        if served is not None:
            served.in_flight += 1

    def release(self, served: ServedLoRA | None) -> None:
        if served is not None:
            served.in_flight -= 1

    def reserve(self, name: str, path: str) -> LoRARequest:
        """A fresh id for loading `path` as `name`; 400 if the name is taken or LoRA is off."""
        if not self.enabled:
            raise bad_request("this server runs without LoRA: start it with --enable-lora", code="lora_disabled")
        if name == self.base_name:
            raise bad_request(f"`{name}` is the base model's name", "lora_name", "invalid_lora_name")
        if name in self.adapters or name in self.pending:
            raise bad_request(f"The lora adapter '{name}' has already been loaded.", "lora_name",
                              "lora_adapter_already_loaded")
        self.pending.add(name)
        request = LoRARequest(name, self.next_id, path)
        self.next_id += 1
        return request

    def commit(self, request: LoRARequest, parent: str | None = None, source: str | None = None) -> ServedLoRA:
        self.pending.discard(request.lora_name)
        served = ServedLoRA(request, parent or self.base_name, source=source)
        self.adapters[request.lora_name] = served
        return served

    def abandon(self, request: LoRARequest) -> None:
        """A reserved load failed: free the name (the id stays used)."""
        self.pending.discard(request.lora_name)

    def remove(self, name: str) -> ServedLoRA:
        """Take `name` out of service; 404 if unknown, 409 while requests use it."""
        served = self.adapters.get(name)
        if served is None:
            raise OpenAIError(404, f"The lora adapter '{name}' cannot be found.", "invalid_request_error",
                              "lora_name", "lora_adapter_not_found")
        if served.in_flight:
            raise OpenAIError(409, f"The lora adapter '{name}' has {served.in_flight} request(s) in flight; "
                              "unload it once they have finished", "conflict_error", "lora_name",
                              "lora_adapter_in_use")
        return self.adapters.pop(name)

    def restore(self, served: ServedLoRA) -> None:
        self.adapters[served.request.lora_name] = served
