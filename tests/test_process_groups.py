NUM_GPUS = 0

import asyncio
import os

import pytest

import dynarl
from dynarl import ClusterConfig, RuntimeConfig
from dynarl.transport.errors import RemoteError
from workers import Collective


async def test_100mb_tensor_over_a_runtime_gloo_group_between_two_groups():
    numel = 100 * (1 << 20) // 4
    async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
        sender = await ctl.spawn(Collective, name="trainer", num_ranks=1)
        receiver = await ctl.spawn(Collective, name="rollout", num_ranks=1)
        await ctl.process_group("sync", [sender, receiver])
        received, sent = await asyncio.gather(receiver.call(Collective.recv_big, "sync", 0, numel),
                                              sender.call(Collective.send_big, "sync", 1, numel, 3))
        assert received == sent


async def test_group_rebuilt_with_a_different_member_set_in_the_same_processes():
    config = RuntimeConfig(launcher="local", cluster=ClusterConfig(devices_per_node=3))
    async with dynarl.Controller(config) as ctl:
        group = await ctl.spawn(Collective, num_ranks=3)
        pids_before = group.pids
        pg = await ctl.process_group("dp", [group])
        assert pg.generation == 1
        assert await group.call(Collective.all_reduce, "dp", 1) == [[3.0] * 4] * 3
        # 3 -> 2 ranks, renumbered: old rank 2 becomes rank 0, old rank 0 becomes rank 1.
        pg = await ctl.process_group("dp", [(group, 2), (group, 0)])
        assert pg.generation == 2
        assert await group.on([2, 0]).call(Collective.group_rank, "dp") == [[0, 2], [1, 2]]
        assert await group.on([2, 0]).call(Collective.all_reduce, "dp", 5) == [[10.0] * 4] * 2
        # back to all three
        await ctl.process_group("dp", [group])
        assert await group.call(Collective.all_reduce, "dp", 2) == [[6.0] * 4] * 3
        assert group.pids == pids_before


def _tcp_listeners(pid: int, ports: bool = False) -> list:
    """The local addresses `pid` listens on over TCP (from /proc: ss -ltn's view);
    `ports`: (address, port) pairs."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in list(f)[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    address, port = cols[1].split(":")
                    found.append((address, int(port, 16)) if ports else address)
    return found


async def test_a_single_host_jobs_sockets_listen_on_loopback_only():
    """Each group's TCPStore (hosted by its first member) and the controller's router
    listen on 127.0.0.1, never on every interface (TCPStore's own default)."""
    loopback = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1 as /proc prints them
    async with dynarl.Controller(RuntimeConfig(launcher="local", cluster=ClusterConfig(devices_per_node=2))) as ctl:
        group = await ctl.spawn(Collective, num_ranks=2)
        await ctl.process_group("dp", [group])
        assert await group.call(Collective.all_reduce, "dp", 1) == [[2.0] * 4] * 2
        hosting = _tcp_listeners(group.pids[0])
        assert hosting, "the group's store is not listening"
        for pid in [os.getpid(), *group.pids]:
            assert set(_tcp_listeners(pid)) <= loopback, (pid, _tcp_listeners(pid))


async def test_an_outsider_gets_nothing_from_a_groups_store():
    """A TCPStore serves any client that reaches its port (another user of the host)
    and lists its keys to it: the names it lists are hashes, the values ciphertext
    under a key drawn from the job secret, and a value it moves is refused by the
    members (transport/sealed_store.py), while the group goes on working."""
    import datetime
    import re
    import torch.distributed as dist
    async with dynarl.Controller(RuntimeConfig(launcher="local", cluster=ClusterConfig(devices_per_node=2))) as ctl:
        group = await ctl.spawn(Collective, num_ranks=2)
        pg = await ctl.process_group("dp", [group])
        assert await group.call(Collective.all_reduce, "dp", 1) == [[2.0] * 4] * 2
        host, port = pg.store
        assert ("0100007F", port) in _tcp_listeners(group.pids[0], ports=True)
        addresses = await group.call(Collective.store_value, "dp", "0/0")  # gloo's rendezvous, as members read it
        assert len(addresses[0]) > 8 and addresses[0] == addresses[1]
        outsider = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=5))
        names = outsider.list_keys()
        assert len(names) >= 2  # gloo's rendezvous keys, one per rank
        assert all(re.fullmatch("[0-9a-f]{32}", name) for name in names), names
        values = [outsider.get(name) for name in names]
        assert not any(addresses[0] in value or b"dynarl" in value for value in values)
        assert await group.call(Collective.all_reduce, "dp", 3) == [[6.0] * 4] * 2
        for name, value in zip(names, values[1:] + values[:1]):  # each key gets another's sealed value
            outsider.set(name, value)
        with pytest.raises(RemoteError, match="StoreTampered"):
            await group.call(Collective.store_value, "dp", "0/1")