"""Pod IPs on the loopback network: each local pod gets its own 127.0.0.N, as a CNI gives each pod its own IP.

Linux routes all of 127.0.0.0/8 to `lo`, so any such address can be bound without setup. With one address
per pod every engine listens on its Deployment's container port (8000) and `status.podIP:containerPort`
reaches it, exactly as on a cluster. 127.0.0.1 stays the node's (API emulator, gateway). An address is
taken only if every container port of the pod can be bound there and no other fleet on this machine has
claimed it, and given back when the pod's processes have exited. The claim is an exclusive `flock` on a
file named for the address in a folder all fleets share: a port that is free now may be bound a minute
later by a server that is still loading (vLLM listens ~45 s after it starts), and without the claim
another fleet would take the address meanwhile, its engine answering this pod's probes. The kernel drops
the lock when its holder exits, so a crashed fleet leaves no claim behind.
"""
from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

NODE_IP = "127.0.0.1"
FIRST = ipaddress.IPv4Address("127.0.0.2")
TRIES = 4096      # a port held on 0.0.0.0 is taken on every address: give up instead of trying 16 million
CLAIMS = Path(tempfile.gettempdir()) / "specfleet-pod-addresses"
UNLOCKED = -1     # the claims folder is unusable here: the address goes by its ports alone


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


def claim(ip: str) -> int | None:
    """Lock the address for this pool: the descriptor holding the lock, None while another holds it."""
    try:
        CLAIMS.mkdir(mode=0o1777, exist_ok=True)
        fd = os.open(CLAIMS / ip, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return UNLOCKED
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


@dataclass
class PodAddresses:
    """Allocates one loopback address per pod (by pod uid), lowest free first."""

    by_pod: dict[str, str] = field(default_factory=dict)
    claims: dict[str, int] = field(default_factory=dict)     # pod uid -> the descriptor of its claim

    def allocate(self, uid: str, ports: list[int]) -> str:
        if uid in self.by_pod:
            return self.by_pod[uid]
        taken = set(self.by_pod.values())
        for offset in range(TRIES):
            ip = str(FIRST + offset)
            if ip in taken or ip.endswith((".0", ".255")) or not bindable(ip, ports):
                continue
            fd = claim(ip)
            if fd is not None:
                self.by_pod[uid], self.claims[uid] = ip, fd
                return ip
        raise AddressesExhausted(f"the ports {ports} are taken on {TRIES} loopback addresses from {FIRST} "
                                 f"(does a process listen on 0.0.0.0?)")

    def release(self, uid: str) -> None:
        self.by_pod.pop(uid, None)
        fd = self.claims.pop(uid, UNLOCKED)
        if fd != UNLOCKED:
            os.close(fd)
