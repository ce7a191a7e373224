"""The local node agent (docs/fleet.md): `agent.NodeAgent` runs the Deployment controller
(`controller.py`), the scheduler (`scheduling.py`) and the kubelet (`kubelet.py`, `volumes.py`,
`addresses.py`, `vllm_peer.py` for `vllm serve` containers) of the one node `specfleet up` has."""
