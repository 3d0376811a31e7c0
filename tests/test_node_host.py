NUM_GPUS = 0
"""Where a node's sockets are reached and bound under the agent launcher (pure)."""

import pytest

from dynarl.launch.node_host import advertised_host, bind_host_for, ip_towards
from dynarl.transport.endpoints import with_host

ROUTE = lambda master: "10.0.0.7"  # this node's address on the route to node 0


@pytest.mark.parametrize("bind_host, node, master, override, expected", [
    ("127.0.0.1", 0, "127.0.0.1", None, "127.0.0.1"),       # one host
    ("127.0.0.1", 3, "127.0.0.1", None, "127.0.0.1"),
    ("0.0.0.0", 0, "node-a", None, "node-a"),               # node 0 as the agents reached its store
    ("0.0.0.0", 2, "node-a", None, "10.0.0.7"),             # node k: its own address, never the wildcard
    ("10.0.0.1", 0, "node-a", None, "10.0.0.1"),            # node 0's own address given
    ("10.0.0.1", 1, "node-a", None, "10.0.0.7"),            # ... is not node 1's
    ("0.0.0.0", 1, "node-a", "192.168.5.5", "192.168.5.5"),  # DYNARL_NODE_HOST wins
])
def test_advertised_host(bind_host, node, master, override, expected):
    assert advertised_host(bind_host, node, master_addr=master, override=override, route_ip=ROUTE) == expected


def test_a_wildcard_without_master_addr_is_an_error():
    with pytest.raises(ValueError, match="DYNARL_NODE_HOST"):
        advertised_host("0.0.0.0", 0, master_addr=None, route_ip=ROUTE)


@pytest.mark.parametrize("advertised, bind", [
    ("127.0.0.1", "127.0.0.1"), ("10.0.0.7", "10.0.0.7"), ("node-a", "0.0.0.0"), ("::1", "::1"),
])
def test_bind_host_for(advertised, bind):
    assert bind_host_for(advertised) == bind


def test_with_host_replaces_a_wildcard_endpoint():
    assert with_host("tcp://0.0.0.0:5555", "node-a") == "tcp://node-a:5555"
    assert with_host("tcp://0.0.0.0:5555", "fd00::1") == "tcp://[fd00::1]:5555"


def test_ip_towards_loopback():
    assert ip_towards("127.0.0.1") == "127.0.0.1"
