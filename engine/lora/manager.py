"""LoRAManager: which adapter sits in which slot, loaded on demand, and which adapters stay on CPU.

`register` validates a request's adapter (loading it from disk into the CPU cache) when the request
arrives, so a bad adapter fails the request, not a later step. `activate` runs before each step: every
adapter of the step's rows gets a slot, a free one or the least recently used one that no running
sequence needs (the scheduler admits at most `max_loras` distinct adapters among running sequences, so
one always exists). At most `max_cpu_loras` adapters stay on CPU (LRU); an evicted one is read again from
its folder when it next needs a slot. `unregister` forgets an adapter (its slot and CPU copy); its int id is
retired, never to name another adapter, since prefix-cache blocks stay keyed by it.
"""
from __future__ import annotations

from collections import OrderedDict

from specfleet.engine.lora.adapter import LoRAAdapter, LoRAError, load_adapter
from specfleet.engine.lora.layers import LoRASlots
from specfleet.engine.lora.request import LoRARequest
from specfleet.engine.model.llama import LlamaShape


class LoRAManager:
    def __init__(self, slots: LoRASlots, shape: LlamaShape, max_lora_rank: int, max_cpu_loras: int,
                 base_names: tuple[str, ...] = ()) -> None:
        self.slots = slots
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
            adapter = self._load(self.requests[lora_id])
        self._cache(lora_id, adapter)
        return adapter

    def _cache(self, lora_id: int, adapter: LoRAAdapter) -> None:
        self.cpu[lora_id] = adapter
        self.cpu.move_to_end(lora_id)
        while len(self.cpu) > self.max_cpu_loras:
            self.cpu.popitem(last=False)

    def _load(self, request: LoRARequest) -> LoRAAdapter:
        return load_adapter(request.lora_path, self.shape, self.max_lora_rank, self.base_names)
