"""The control loop (DESIGN.md section 5): metrics windows, calibration, and the pure autoscaling and
speculation policies, plus `loop.py`, the I/O shell the kopf timer calls.

Everything but `loop.py` is pure: no Kubernetes, no HTTP, no clock; the fleet simulator
(`specfleet.operator.simulator`) drives the same functions.
"""
