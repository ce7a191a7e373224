"""Triton kernels for the paged KV cache: the attention backend engine pods run on CUDA.

`paged_attention.py` (attention read through the block table), `reshape_and_cache.py` (the KV write) and
`backend.py` (`TritonPagedAttention`, which the engine installs); `lora.py` is the multi-LoRA op that
`engine/lora/layers.py` runs for CUDA tensors. Under `TRITON_INTERPRET=1` (set before
this package is first imported) the same kernels run on CPU tensors, which is how the tests check them.
"""
