"""Discrete-time fleet simulator: request arrivals, per-replica continuous batching with the
performance model, speculation with an acceptance process, pod start-up delay, driving the same pure
autoscaler and speculation controller the operator runs (`specfleet simulate`)."""
