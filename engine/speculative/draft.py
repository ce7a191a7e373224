"""Draft-model proposer: a smaller model with the same tokenizer, its own paged KV cache, k steps.

Each sequence has a shadow `Sequence` in the draft's own block pool. A proposal first feeds the draft
whatever tokens it has not seen (the prompt on first use, then the tokens accepted since), then
decodes k tokens one step at a time, batched over all proposing sequences. After verification the
shadow keeps the KV of the accepted prefix only (`rollback`), exactly like the target's block manager.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from specfleet.engine.kv.block_manager import BlockManager
from specfleet.engine.backends import prepare_backend
from specfleet.engine.model.loader import load_model
from specfleet.engine.model_runner import ModelRunner
from specfleet.engine.sampler import SamplingTensors, probabilities, sample
from specfleet.engine.scheduler import SchedulerOutput
from specfleet.engine.sequence import Sequence


class DraftProposer:
    def __init__(self, model: str, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device,
                 target_vocab_size: int, max_positions: int, backend: str = "auto") -> None:
        loaded = load_model(model, dtype, device, max_positions)
        prepare_backend(loaded.model, backend, device)
        if loaded.model.shape.vocab_size != target_vocab_size:
            raise ValueError(f"draft model {model!r} has a vocabulary of {loaded.model.shape.vocab_size} tokens, "
                             f"the target {target_vocab_size}: they must share a tokenizer")
        self.vocab_size = target_vocab_size
        self.runner = ModelRunner(loaded.model, num_blocks, block_size, dtype, device)
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching=False, watermark=0.0)
        self.shadows: dict[str, Sequence] = {}

    def propose(self, seqs: list[Sequence], k: int) -> list[tuple[list[int], torch.Tensor | None]]:
        """Per sequence: k draft tokens and their draft probabilities [k, V] (or nothing if no room)."""
        shadows = [self._shadow_for(seq, k) for seq in seqs]
        live = [(i, s) for i, s in enumerate(shadows) if s is not None]
        results: list[tuple[list[int], torch.Tensor | None]] = [([], None)] * len(seqs)
        if not live:
            return results
        by_shadow = {id(shadow): i for i, shadow in live}
        tokens: dict[int, list[int]] = {i: [] for i, _ in live}
        probs: dict[int, list[torch.Tensor]] = {i: [] for i, _ in live}
        for _ in range(k):
            batch = SchedulerOutput()
            for _, shadow in live:
                batch.add(shadow, shadow.num_tokens - shadow.num_computed_tokens)
            logits, rows = self.runner.execute(batch)            # rows come grouped, not in batch order
            owners = [by_shadow[id(r.seq)] for r in rows]
            tensors = SamplingTensors.build([seqs[i].params for i in owners], self.vocab_size, logits.device)
            q = probabilities(logits, tensors)
            drawn = sample(q, [seqs[i].generator for i in owners]).tolist()
            for row, owner, tok, q_row in zip(rows, owners, drawn, q):
                row.seq.num_computed_tokens = row.seq.num_tokens
                row.seq.token_ids.append(tok)
                tokens[owner].append(tok)
                probs[owner].append(q_row)
        for i, _ in live:
            results[i] = (tokens[i], torch.stack(probs[i]))
        return results

    def _shadow_for(self, seq: Sequence, k: int) -> Sequence | None:
        shadow = self.shadows.get(seq.request_id)
        if shadow is None:
            shadow = self.shadows[seq.request_id] = Sequence(seq.request_id, [], 0, seq.params)
        shadow.token_ids = list(seq.token_ids)
        needed = shadow.num_tokens - shadow.num_computed_tokens + k - 1
        if not self.blocks.can_append(shadow, needed):
            return None
        self.blocks.append(shadow, needed)
        return shadow

    def rollback(self, seq: Sequence, num_accepted: int, k: int, num_tokens_before: int) -> None:
        """Keep draft KV for the prompt and the accepted drafts only."""
        shadow = self.shadows.get(seq.request_id)
        if shadow is None:
            return
        shadow.num_computed_tokens = min(shadow.num_computed_tokens, num_tokens_before + num_accepted)
        del shadow.token_ids[shadow.num_computed_tokens:]
        self.blocks.trim(shadow)

    def release(self, request_id: str) -> None:
        shadow = self.shadows.pop(request_id, None)
        if shadow is not None:
            self.blocks.free(shadow)


def make_truncated_draft(source: str | Path, target: str | Path, num_layers: int) -> Path:
    """Self-speculation draft: the first `num_layers` layers of a model, with its embeddings and head."""
    from safetensors.torch import load_file, save_file

    source, target = Path(source), Path(target)
    target.mkdir(parents=True, exist_ok=True)
    config = json.loads((source / "config.json").read_text())
    config["num_hidden_layers"] = num_layers
    (target / "config.json").write_text(json.dumps(config, indent=2))
    tensors = {}
    for file in sorted(source.glob("*.safetensors")):
        for name, tensor in load_file(str(file)).items():
            if ".layers." not in name or int(name.split(".layers.")[1].split(".")[0]) < num_layers:
                tensors[name] = tensor
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    for extra in source.iterdir():
        if extra.suffix != ".safetensors" and extra.name != "config.json" and extra.is_file():
            shutil.copy(extra, target / extra.name)
    return target
