"""Discrete-time fleet simulator: request arrivals (open-loop scenarios or a closed-loop client trace),
per-replica continuous batching at the step times of an engine profile (the truth, never the controller's
roofline), speculation with an acceptance process, pod start-up delay, driving the same pure autoscaler
and speculation controller the operator runs (`specfleet simulate`, `replay.replay`)."""
