"""Speculative decoding: proposers (n-gram, draft model), lossless verification, live control."""
