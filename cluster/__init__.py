"""specfleet.cluster: a Kubernetes API emulator (and, later, the local fleet's control plane)."""
