"""Pod IPs on the loopback network: each local pod gets its own 127.0.0.N, as a CNI gives each pod its own IP.

Linux routes all of 127.0.0.0/8 to `lo`, so any such address can be bound without setup. With one address
per pod every engine listens on its Deployment's container port (8000) and `status.podIP:containerPort`
reaches it, exactly as on a cluster. 127.0.0.1 stays the node's (API emulator, gateway). An address is
taken only if every container port of the pod can be bound there (another fleet on this machine may hold
it), and given back when the pod's processes have exited.
"""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field

NODE_IP = "127.0.0.1"
FIRST = ipaddress.IPv4Address("127.0.0.2")
TRIES = 4096      # a port held on 0.0.0.0 is taken on every address: give up instead of trying 16 million


class AddressesExhausted(Exception):
    """No loopback address is left whose ports are free."""


def container_ports(pod_spec: dict) -> list[int]:
    """The TCP container ports of every container of a pod spec."""
    return [int(port["containerPort"]) for container in pod_spec.get("containers") or []
            for port in container.get("ports") or [] if port.get("protocol", "TCP") == "TCP"]


def bindable(ip: str, ports: list[int]) -> bool:
    for port in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # TIME_WAIT leftovers are not "in use"
            try:
                s.bind((ip, port))
            except OSError:
                return False
    return True


@dataclass
class PodAddresses:
    """Allocates one loopback address per pod (by pod uid), lowest free first."""

    by_pod: dict[str, str] = field(default_factory=dict)

    def allocate(self, uid: str, ports: list[int]) -> str:
        if uid in self.by_pod:
            return self.by_pod[uid]
        taken = set(self.by_pod.values())
        for offset in range(TRIES):
            ip = str(FIRST + offset)
            if ip not in taken and not ip.endswith((".0", ".255")) and bindable(ip, ports):
                self.by_pod[uid] = ip
                return ip
        raise AddressesExhausted(f"the ports {ports} are taken on {TRIES} loopback addresses from {FIRST} "
                                 f"(does a process listen on 0.0.0.0?)")

    def release(self, uid: str) -> None:
        self.by_pod.pop(uid, None)
