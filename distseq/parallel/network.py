"""The network under the group: which host each rank talks from (the start-up line of a
multi-node run), which collective failures are a peer lost rather than a bug, and which nodes
no longer answer."""

from __future__ import annotations

import fcntl
import os
import socket
import struct
from dataclasses import dataclass

import torch.distributed as dist

from distseq.parallel.collectives import all_gather_objects


def _interface(address: str) -> str:
    """The name of this host's interface that has ``address`` (SIOCGIFADDR per interface)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                request = struct.pack("256s", name.encode()[:15])
                found = socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFADDR, request)[20:24])
            except OSError:  # no IPv4 address on it
                continue
            if found == address:
                return name
    return "an interface this host does not list"


_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


@dataclass(frozen=True)
class Node:
    """One host of the group, as its ranks see it."""

    host: str
    address: str  # of its route to the group's store
    interface: str  # that address's
    told: str  # "GLOO_SOCKET_IFNAME=..., NCCL_SOCKET_IFNAME=..." as set there
    ranks: tuple[int, ...]

    def __str__(self) -> str:
        told = f", {self.told}" if self.told else ""
        r = self.ranks
        ranks = f"ranks {r[0]}-{r[-1]}" if len(r) > 1 else f"rank {r[0]}"
        return f"{self.host} {self.address} ({self.interface}{told}; {ranks})"


def nodes() -> list[Node]:
    """Every node of the group (a collective): where its ranks talk from; [] without a group."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))  # UDP: no packet
        address = s.getsockname()[0]
    told = [
        f"{k}={os.environ[k]}"
        for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
        if k in os.environ
    ]
    me = (socket.gethostname(), address, _interface(address), ", ".join(told))
    ranks: dict[tuple[str, str, str, str], list[int]] = {}
    for rank, node in enumerate(all_gather_objects([me])):
        ranks.setdefault(node, []).append(rank)
    return [Node(*node, tuple(r)) for node, r in ranks.items()]


def nodes_line(found: list[Node]) -> str:
    """The start-up line naming each node and where it talks from; "" on one node. A wrong
    address or interface is how a multi-node run hangs (docs/launching.md)."""
    if len(found) < 2:
        return ""
    store = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    return f"{len(found)} nodes, store {store}: " + ", ".join(map(str, found))


def is_collective_failure(error: BaseException) -> bool:
    """A collective that timed out or lost its peer (gloo, NCCL), as opposed to a bug."""
    text = str(error)
    # gloo's words for a peer gone, as they have changed: "Application timeout caused pair
    # closure" came from an all-reduce while a link was down (seen once in CI, in a save).
    lost = (
        "Timed out",
        "timed out",
        "Application timeout",
        "Connection closed by peer",
        "Connection reset by peer",
    )
    return isinstance(error, dist.DistError) or (
        isinstance(error, RuntimeError) and any(word in text for word in lost)
    )


def unreachable(found: list[Node], seconds: float = 3.0) -> list[Node]:
    """The other nodes that do not answer a TCP connection from here within ``seconds``: a
    closed port answers at once (refused), a host or link that is gone does not."""
    here = socket.gethostname()
    lost = []
    for node in found:
        if node.host == here:
            continue
        try:
            socket.create_connection((node.address, 9), timeout=seconds).close()
        except ConnectionRefusedError:
            continue  # it answered
        except OSError:
            lost.append(node)
    return lost
