"""specfleet.cluster: the local fleet's control plane: the API emulator (`apiserver/`), the node agent
(`node_agent/`), the gateway, `specfleet up` (`fleet.py`) and the client they share (`api_client.py`)."""
