NUM_GPUS = 0

import asyncio

import dynarl
from dynarl import ClusterConfig, RuntimeConfig
from workers import Collective


async def test_100mb_tensor_over_a_runtime_gloo_group_between_two_groups():
    numel = 100 * (1 << 20) // 4
    async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
        sender = await ctl.spawn(Collective, name="trainer", num_ranks=1)
        receiver = await ctl.spawn(Collective, name="rollout", num_ranks=1)
        await ctl.process_group("sync", [sender, receiver])
        received, sent = await asyncio.gather(receiver.call("recv_big", "sync", 0, numel),
                                              sender.call("send_big", "sync", 1, numel, 3))
        assert received == sent


async def test_group_rebuilt_with_a_different_member_set_in_the_same_processes():
    config = RuntimeConfig(launcher="local", cluster=ClusterConfig(devices_per_node=3))
    async with dynarl.Controller(config) as ctl:
        group = await ctl.spawn(Collective, num_ranks=3)
        pids_before = group.pids
        pg = await ctl.process_group("dp", [group])
        assert pg.generation == 1
        assert await group.call("all_reduce", "dp", 1) == [[3.0] * 4] * 3
        # 3 -> 2 ranks, renumbered: old rank 2 becomes rank 0, old rank 0 becomes rank 1.
        pg = await ctl.process_group("dp", [(group, 2), (group, 0)])
        assert pg.generation == 2
        assert await group.call("group_rank", "dp", ranks=[2, 0]) == [[0, 2], [1, 2]]
        assert await group.call("all_reduce", "dp", 5, ranks=[2, 0]) == [[10.0] * 4] * 2
        # back to all three
        await ctl.process_group("dp", [group])
        assert await group.call("all_reduce", "dp", 2) == [[6.0] * 4] * 3
        assert group.pids == pids_before
