"""Which address a node's sockets advertise, and which they bind, under the agent
launcher (several hosts, or several agents on one).

Peers on other nodes connect to the advertised address: it must name this node as
they can reach it, never a wildcard (a peer connecting to 0.0.0.0 reaches itself).
`runtime.bind_host` says what the job binds on node 0 (the controller); the others
find their own address on the route to node 0, which is how their peers reach them.
"""
from __future__ import annotations

import ipaddress
import socket

from dynarl.transport.endpoints import LOOPBACK

WILDCARDS = frozenset({"0.0.0.0", "*", "::", "[::]", ""})


def advertised_host(bind_host: str, node: int, *, master_addr: str | None, override: str | None = None,
                    route_ip=None) -> str:
    """The host others use to reach this node's sockets.

    override (DYNARL_NODE_HOST): wins, for nodes with several networks. One host
    (bind_host on loopback): loopback. Node 0: bind_host, or with a wildcard the
    address the agents reached its store at (MASTER_ADDR). Node k: its own address on
    the route to node 0 (`route_ip(master_addr)`)."""
    if override:
        return override
    if bind_host in LOOPBACK:
        return bind_host
    if node == 0:
        if bind_host not in WILDCARDS:
            return bind_host
        if not master_addr:
            raise ValueError("runtime.bind_host is a wildcard but MASTER_ADDR is not set: "
                             "set DYNARL_NODE_HOST to this node's address")
        return master_addr
    if not master_addr:
        raise ValueError("MASTER_ADDR is not set: set DYNARL_NODE_HOST to this node's address")
    return (route_ip or ip_towards)(master_addr)


def bind_host_for(advertised: str) -> str:
    """What a worker's sockets bind for an advertised host: that address when it is an
    IP literal (only that network), else every interface (a name may resolve to any)."""
    try:
        ipaddress.ip_address(advertised.strip("[]"))
    except ValueError:
        return "0.0.0.0"
    return advertised


def ip_towards(peer: str) -> str:
    """This host's address on the route to `peer` (a UDP connect sends nothing)."""
    family = socket.AF_INET6 if ":" in peer else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((peer, 9))
        return s.getsockname()[0]
