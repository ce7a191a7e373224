"""Paged KV-cache bookkeeping (`block_manager.py`): blocks, refcounts, prefix hashes; no tensors here."""
