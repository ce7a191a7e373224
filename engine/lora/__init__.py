"""Multi-LoRA serving: PEFT adapters loaded into a fixed number of slots and applied per row in one forward.

`request.py` names an adapter (vLLM's `LoRARequest`), `adapter.py` reads and validates a PEFT folder,
`layers.py` holds the slot tensors and the batched LoRA op, `manager.py` decides which adapter sits in
which slot (on demand, LRU) and keeps recently used adapters on CPU; `fetch.py` downloads an https:// or
oci:// adapter into a local cache folder (the server fetches before it loads).
"""
