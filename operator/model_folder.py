"""A model folder's architecture from its `config.json` (Hugging Face layout), for `hostpath:` models.

The planner needs a model's shape; the catalog knows common models by name, and a CR may declare
`model.architecture` by hand. A `hostpath:` folder the operator (or `specfleet plan`) can read already
says it in `config.json`, so `with_folder_architecture` fills it in from there. The only I/O is reading
that file; the planner stays pure and names the file when it could not be read.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from specfleet.operator.api import Architecture, InferenceServiceSpec, parse_source
from specfleet.operator.catalogs import ModelCatalog

CONFIG = "config.json"


def with_folder_architecture(spec: InferenceServiceSpec, models: ModelCatalog) -> InferenceServiceSpec:
    """`spec` with `model.architecture` read from a `hostpath:` folder the catalog does not know (unchanged
    when declared, known, another source kind, or unreadable)."""
    model = spec.model
    if model.architecture is not None or models.lookup(model) is not None:
        return spec
    source = parse_source(model.source)
    if source.kind != "hostpath":
        return spec
    arch = read_architecture(Path(source.location))
    return spec if arch is None else replace(spec, model=replace(model, architecture=arch))


def read_architecture(folder: Path) -> Architecture | None:
    """The architecture in `folder/config.json`; None when it is missing, unreadable or incomplete."""
    try:
        config = json.loads((folder / CONFIG).read_text())
        return architecture(config)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def architecture(config: dict) -> Architecture:
    """A Llama-family `config.json` -> Architecture; the parameter count is computed from the shape."""
    config = config.get("text_config", config)
    layers, hidden = int(config["num_hidden_layers"]), int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads", heads))
    head_dim = int(config.get("head_dim") or hidden // heads)
    intermediate, vocab = int(config["intermediate_size"]), int(config["vocab_size"])
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    per_layer = attention + 3 * hidden * intermediate + 2 * hidden
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings", False) else 2)
    return Architecture(num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_kv_heads=kv_heads,
                        head_dim=head_dim, intermediate_size=intermediate, vocab_size=vocab,
                        parameters=layers * per_layer + embeddings + hidden)
