"""A Kubernetes API emulator: the operator's test bed and the local fleet's control plane.

`running_apiserver(kubeconfig_path, port=0, state_file=None)` runs it in a background thread;
`specfleet cluster apiserver` runs it in the foreground. See docs/apiserver.md.
"""
from specfleet.cluster.apiserver.server import ApiServer, ServerConfig, running_apiserver

__all__ = ["ApiServer", "ServerConfig", "running_apiserver"]
