"""Groups whose members share devices (transport/device_group.py): the broadcast plan as
a table, and real gloo groups in threads where collectives run only between devices."""
import threading

import pytest
import torch
import torch.distributed as dist

from dynarl.transport.device_group import SharedDevice, SharedDeviceGroup, WrongDevice, plan_broadcast
from dynarl.transport.process_group import host_store, join_group, leave_group


@pytest.mark.parametrize("devices, root, leaders, root_leader, followers", [
    # all distinct: everyone leads, nobody follows
    ([0, 1, 2], 0, (0, 1, 2), 0, {}),
    # the weight sync of a temporal placement: trainer 0, rollout 0/1, inference 0/1 on devices 0, 1
    ([0, 0, 1, 0, 1], 0, (0, 2), 0, {0: (1, 3), 2: (4,)}),
    # a root that is not its device's leader hands up; its leader then serves the others, not it
    ([0, 0, 1], 1, (0, 2), 0, {}),
    ([0, 0, 0, 1], 2, (0, 3), 0, {0: (1,)}),
    # members without a device lead themselves
    ([None, 0, 0, None], 1, (0, 1, 3), 1, {1: (2,)}),
    # one device for all
    ([5, 5, 5], 0, (0,), 0, {0: (1, 2)}),
])
def test_broadcast_plan(devices, root, leaders, root_leader, followers):
    plan = plan_broadcast(devices, root)
    assert (plan.leaders, plan.root_leader, plan.followers) == (leaders, root_leader, followers)


def _run_group(devices, body, timeout_s=20.0):
    """Each rank of a gloo group over `devices` runs body(rank, group) in its own thread;
    returns the results by rank, raising the first error."""
    store = host_store("127.0.0.1")
    results, errors = {}, []

    def rank_main(rank):
        member = None
        try:
            member = join_group("t", "dynarl/t/0/x", rank, len(devices), "127.0.0.1", store.port, "gloo", timeout_s,
                                store=store if rank == 0 else None, devices=devices, secret=b"k" * 32)
            results[rank] = body(rank, member.group)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            if member is not None:
                leave_group(member)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(len(devices))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 10)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    if errors:
        raise errors[0]
    return [results[r] for r in range(len(devices))]


@pytest.mark.parametrize("root", [0, 1, 2])
def test_broadcast_reaches_every_member(root):
    def body(rank, group):
        assert isinstance(group, SharedDeviceGroup)
        t = torch.arange(6, dtype=torch.bfloat16) * (10 if rank == root else 0)
        dist.broadcast(t, group_src=root, group=group)
        dist.broadcast(t, group_src=root, group=group)  # a second call keeps its own keys
        return t.tolist()

    assert _run_group([0, 0, 1, 0], body) == [[0.0, 10.0, 20.0, 30.0, 40.0, 50.0]] * 4


def test_a_hand_off_larger_than_a_store_value_arrives_whole():
    """The TCPStore refuses a value over 8 MiB: a 20 MiB tensor handed to a rank on the
    same device goes in pieces (a weight-sync bucket of a real model on a CPU host)."""
    n = 5 * (1 << 20) + 3  # 20 MiB of float32 and a tail
    sent = torch.arange(n, dtype=torch.float32)

    def body(rank, group):
        t = sent.clone() if rank == 0 else torch.zeros(n)
        dist.broadcast(t, group_src=0, group=group)
        return bool(torch.equal(t, sent))

    assert _run_group([0, 0], body, timeout_s=60.0) == [True, True]


def test_point_to_point_within_and_across_devices():
    def body(rank, group):
        got = torch.zeros(4)
        if rank == 0:
            works = [dist.isend(torch.full((4,), 1.0), group_dst=1, group=group, tag=3),  # same device
                     dist.isend(torch.full((4,), 2.0), group_dst=2, group=group, tag=3)]  # across
            for w in works:
                w.wait()
            return None
        work = dist.irecv(got, group_src=0, group=group, tag=3)
        work.wait()
        return got.tolist()

    assert _run_group([0, 0, 1], body) == [None, [1.0] * 4, [2.0] * 4]


def test_barrier_and_refused_reductions():
    def body(rank, group):
        group.barrier().wait()
        with pytest.raises(SharedDevice, match="share devices"):
            dist.all_reduce(torch.ones(2), group=group)
        with pytest.raises(WrongDevice):
            group._check(torch.ones(1, device="meta"))
        return True

    assert _run_group([3, 3], body) == [True, True]


def test_distinct_devices_keep_the_plain_group():
    def body(rank, group):
        t = torch.ones(2) * (rank + 1)
        dist.all_reduce(t, group=group)
        return (type(group).__name__, t.tolist())

    assert _run_group([0, 1], body) == [("ProcessGroup", [3.0, 3.0])] * 2


def test_a_group_without_a_timeout_is_refused():
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        join_group("t", "p", 0, 1, "127.0.0.1", 0, "gloo", 0, secret=b"k" * 32)


def test_post_all_exchanges_every_pair_at_once():
    """Each rank sends to and receives from every other, all posted in one batch: local
    hand-offs within device 0, the backend between devices; nothing deadlocks."""
    from dynarl.transport.device_group import post_all

    def body(rank, group):
        got = {peer: torch.zeros(3) for peer in range(3) if peer != rank}
        ops = []
        for peer in got:
            ops.append(dist.P2POp(dist.isend, torch.full((3,), 10.0 * rank + peer), group=group, tag=7,
                                  group_peer=peer))
            ops.append(dist.P2POp(dist.irecv, got[peer], group=group, tag=7, group_peer=peer))
        for work in post_all(ops):
            work.wait()
        return {peer: t.tolist() for peer, t in got.items()}

    out = _run_group([0, 0, 1], body)
    for rank, got in enumerate(out):
        assert got == {peer: [10.0 * peer + rank] * 3 for peer in range(3) if peer != rank}
