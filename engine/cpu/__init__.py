"""The CPU backend: a C++ paged-attention kernel, oneDNN-packed linear layers, allocator tuning.

`attention.py` builds and wraps `paged_attention.cpp`, `linear.py` packs the linears, `tuning.py` tunes
the allocator, and `backend.prepare_model(model, backend)` is what the engine calls for a CPU model.
"""
