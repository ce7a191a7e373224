"""specfleet.cluster: the local fleet's control plane: the API emulator (`apiserver/`), the node agent
(`node_agent/`), the gateway, `specfleet up` (`fleet.py`), the client they share (`api_client.py`), and the
load generator that drives a server or the fleet (`loadgen.py`: `specfleet bench serve`, the serving benchmarks)."""
