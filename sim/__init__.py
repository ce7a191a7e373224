"""Discrete-time fleet simulator: request arrivals (open-loop scenarios or a closed-loop client trace),
per-replica continuous batching at the step times of an engine profile (the truth, never the controller's
roofline), speculation with an acceptance process, pod start-up delay, driving the same pure autoscaler
and speculation controller the operator runs (`specfleet simulate`, `replay.replay`).

A sibling of the operator, not a part of it: it imports the operator's pure layers (planner, capacity,
cost, control's controllers); nothing in `specfleet.operator` imports it (tests/packaging/test_import_graph.py)."""
