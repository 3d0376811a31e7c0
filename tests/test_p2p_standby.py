NUM_GPUS = 0
"""P2P migration with warm standby ranks (core/migration/standby.py): the new
ranks are adopted, not spawned; the old ones are parked, not stopped; the state
still moves bitwise; a rolled-back migration stops the adopted ranks and keeps
training on the old ones; and every process is reaped at shutdown."""

import asyncio

import pytest

import dynarl
from dynarl import ClusterConfig, RuntimeConfig
from dynarl.core.migration.p2p import MigrationFailed, p2p_migrate
from dynarl.core.migration.standby import StandbyPool
from conftest import assert_reaped
from reshard_workers import ReshardTrainer, make_batch
from test_p2p_migration import assert_bitwise_equal, gathered, trained


async def test_standby_ranks_are_adopted_and_parked_and_the_state_moves_bitwise():
    config = RuntimeConfig(launcher="local", cluster=ClusterConfig(devices_per_node=3))
    async with dynarl.Controller(config) as ctl:
        group = await trained(ctl, 2)
        pool = StandbyPool(ctl, ReshardTrainer, "trainer", {}, warm=ReshardTrainer.reshard_warm)
        await pool.fill([0, 1, 2])
        warm, old = set(pool.group.pids), set(group.pids)
        everyone = warm | old
        before = await gathered(group)
        loop = asyncio.get_running_loop()
        begun = loop.time()
        out = await p2p_migrate(ctl, group, [0, 1, 2], {}, standby=pool)
        out_s = loop.time() - begun
        assert set(out.group.pids) == warm  # adopted, no process started
        assert sorted(pool.devices()) == [0, 1]  # the old ranks are parked, alive
        assert set(pool.group.pids) == old and group.name not in ctl.groups and group.world_size == 0
        assert_bitwise_equal(before, await gathered(out.group))
        begun = loop.time()
        back = await p2p_migrate(ctl, out.group, [0, 1], {}, standby=pool)
        back_s = loop.time() - begun
        assert set(back.group.pids) == old  # the parked ranks came back
        assert sorted(pool.devices()) == [0, 1, 2]
        assert_bitwise_equal(before, await gathered(back.group))
        await back.group.scatter(ReshardTrainer.train, [[make_batch(9)]] * 2)  # and trains on
        assert {g for g in ctl.groups} == {back.group.name, pool.name}
        # (how long a warm move takes is printed, not bounded: a loaded machine stretches
        # it; that no process starts is what the pids above show)
        print(f"standby p2p 2->3 {out_s:.3f} s {out.phases}, 3->2 {back_s:.3f} s {back.phases}")
    assert_reaped(everyone)


async def test_a_failed_migration_stops_the_adopted_ranks_and_keeps_the_old_ones():
    config = RuntimeConfig(launcher="local", cluster=ClusterConfig(devices_per_node=4))
    async with dynarl.Controller(config) as ctl:
        group = await trained(ctl, 2)
        pool = StandbyPool(ctl, ReshardTrainer, "trainer", {"fail": "confirm"})  # these never confirm
        await pool.fill([2, 3])
        adopted = set(pool.group.pids)
        before = await gathered(group)
        with pytest.raises(MigrationFailed, match="rolled back"):
            await p2p_migrate(ctl, group, [2, 3], {}, standby=pool, timeout_s=4.0)
        assert_reaped(adopted)  # possibly broken: stopped, not parked
        assert pool.devices() == [] and set(ctl.groups) == {"trainer", pool.name}
        assert_bitwise_equal(before, await gathered(group))
        await group.scatter(ReshardTrainer.train, [[make_batch(7)]] * 2)  # training continues on the old ranks
        assert (await gathered(group))[2] == {before[2].pop() + 1}


async def test_pool_accounting():
    config = RuntimeConfig(launcher="inproc", cluster=ClusterConfig(devices_per_node=3))  # bookkeeping only
    async with dynarl.Controller(config) as ctl:
        pool = StandbyPool(ctl, ReshardTrainer, "trainer", {})
        await pool.fill([0, 0, 2])
        assert sorted(pool.devices()) == [0, 0, 2] and pool.has([0, 0]) and not pool.has([1])
        await pool.fill([0, 1])  # tops up what is missing only
        assert sorted(pool.devices()) == [0, 0, 1, 2]
        with pytest.raises(LookupError):
            pool.adopt([1, 1], "t")
        g = pool.adopt([2, 0], "t")
        assert g.devices == [2, 0] and ctl.pool.placed["t"] == [2, 0]
        assert sorted(ctl.pool.placed[pool.name]) == [0, 1]
        assert await pool.park(g, [0]) == [2]
        assert g.devices == [0] and sorted(pool.devices()) == [0, 1, 2]
        assert await pool.park(g) == [0]  # the whole group: it is gone as a group
        assert g.stopped and "t" not in ctl.groups and "t" not in ctl.pool.placed
        handles = list(pool.group.handles)
    assert all(h.stopped for h in handles)  # shutdown stops the parked ranks with everything else
