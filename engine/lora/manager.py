"""LoRAManager: which adapter sits in which slot, loaded on demand, and which adapters stay on CPU.

`register` validates a request's adapter (loading it from disk into the CPU cache) when the request
arrives, so a bad adapter fails the request, not a later step. `activate` runs before each step: every
adapter of the step's rows gets a slot, a free one or the least recently used one that no running
sequence needs (the scheduler admits at most `max_loras` distinct adapters among running sequences, so
one always exists). At most `max_cpu_loras` adapters stay on CPU (LRU), but the adapters of requests in
the engine (`in_use`) are never dropped: a request's adapter is on CPU from `register` until it ends, so
`activate` never reads the disk and a folder deleted meanwhile cannot fail a step. An adapter dropped
from CPU is read again from its folder when a new request names it; if that fails, that request is
refused (`LoRAUnavailable`). `unregister` forgets an adapter (its slot and CPU copy); its int id is
retired, never to name another adapter, since prefix-cache blocks stay keyed by it.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from specfleet.engine.lora.adapter import LoRAAdapter, LoRAError, load_adapter
from specfleet.engine.lora.layers import LoRASlots
from specfleet.engine.lora.request import LoRARequest
from specfleet.engine.model.llama import LlamaShape


class LoRAUnavailable(LoRAError):
    """A served adapter that was dropped from the CPU cache and can no longer be read from its folder."""


class LoRAManager:
    def __init__(self, slots: LoRASlots, shape: LlamaShape, max_lora_rank: int, max_cpu_loras: int,
                 base_names: tuple[str, ...] = (), in_use: Callable[[], set[int]] = set) -> None:
        self.slots = slots
        self.in_use = in_use                                    # ids of adapters that requests in the engine use
        self.shape = shape
        self.max_lora_rank = max_lora_rank
        self.max_cpu_loras = max_cpu_loras
        self.base_names = base_names
        self.requests: dict[int, LoRARequest] = {}              # int id -> the request that named it first
        self.cpu: OrderedDict[int, LoRAAdapter] = OrderedDict()  # LRU: oldest first
        self.slot_of: OrderedDict[int, int] = OrderedDict()      # int id -> slot, LRU: oldest first
        self.free_slots = list(range(slots.batch.num_slots))
        self.retired: set[int] = set()                          # ids of unregistered adapters

    @property
    def num_slots(self) -> int:
        return self.slots.batch.num_slots

    def register(self, request: LoRARequest) -> int:
        """Validate (and cache) the request's adapter; returns its int id. Raises LoRAError."""
        if request.lora_int_id in self.retired:
            raise LoRAError(f"lora_int_id {request.lora_int_id} belonged to an unloaded adapter; an id is never "
                            "reused (the prefix cache still holds blocks keyed by it)")
        known = self.requests.get(request.lora_int_id)
        if known is not None:
            if (known.lora_name, known.lora_path) != (request.lora_name, request.lora_path):
                raise LoRAError(f"lora_int_id {request.lora_int_id} already names adapter {known.lora_name!r} "
                                f"at {known.lora_path}; each adapter needs its own id")
            self._adapter(request.lora_int_id)               # on CPU before the request joins the engine
            return request.lora_int_id
        self._cache(request.lora_int_id, self._load(request))
        self.requests[request.lora_int_id] = request
        return request.lora_int_id

    def unregister(self, lora_id: int) -> bool:
        """Forget adapter `lora_id` (no sequence may use it any more); False if it is not registered."""
        if self.requests.pop(lora_id, None) is None:
            return False
        self.retired.add(lora_id)
        self.cpu.pop(lora_id, None)
        slot = self.slot_of.pop(lora_id, None)
        if slot is not None:
            self.free_slots.append(slot)
        return True

    def activate(self, needed: set[int], keep: set[int]) -> dict[int, int]:
        """Slot of each adapter in `needed` (loaded where missing); slots of `keep` (adapters of running
        sequences) are not evicted."""
        for lora_id in needed:
            if lora_id in self.slot_of:
                self.slot_of.move_to_end(lora_id)
            else:
                slot = self._take_slot(needed | keep)
                self.slots.write(slot, self._adapter(lora_id))
                self.slot_of[lora_id] = slot
        return {lora_id: self.slot_of[lora_id] for lora_id in needed}

    def _take_slot(self, keep: set[int]) -> int:
        if self.free_slots:
            return self.free_slots.pop(0)
        victim = next((lora_id for lora_id in self.slot_of if lora_id not in keep), None)
        if victim is None:
            raise RuntimeError(f"all {self.num_slots} LoRA slots are held by running sequences")
        return self.slot_of.pop(victim)

    def _adapter(self, lora_id: int) -> LoRAAdapter:
        adapter = self.cpu.get(lora_id)
        if adapter is None:
            adapter = self._reload(self.requests[lora_id])
        self._cache(lora_id, adapter)
        return adapter

    def _reload(self, request: LoRARequest) -> LoRAAdapter:
        try:
            return self._load(request)
        except (LoRAError, OSError) as exc:
            raise LoRAUnavailable(f"LoRA adapter {request.lora_name!r} was dropped from the CPU cache "
                                  f"(max_cpu_loras={self.max_cpu_loras}) and cannot be read again: {exc}") from None

    def _cache(self, lora_id: int, adapter: LoRAAdapter) -> None:
        """Keep `adapter` on CPU; drop the least recently used ones beyond `max_cpu_loras`, except those in use."""
        self.cpu[lora_id] = adapter
        self.cpu.move_to_end(lora_id)
        excess = len(self.cpu) - self.max_cpu_loras
        if excess > 0:
            pinned = self.in_use() | {lora_id}
            for victim in [i for i in self.cpu if i not in pinned][:excess]:
                del self.cpu[victim]

    def _load(self, request: LoRARequest) -> LoRAAdapter:
        return load_adapter(request.lora_path, self.shape, self.max_lora_rank, self.base_names)
