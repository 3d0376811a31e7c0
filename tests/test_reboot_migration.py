NUM_GPUS = 0

import pytest

import dynarl
from dynarl import ClusterConfig, RuntimeConfig
from dynarl.core.migration.p2p import MigrationFailed
from dynarl.core.migration.reboot import reboot_migrate
from conftest import assert_reaped
from workers import Counter

CONFIG = RuntimeConfig(launcher="local", cluster=ClusterConfig(devices_per_node=3))


async def test_reboot_moves_the_component_and_keeps_its_state():
    async with dynarl.Controller(CONFIG) as ctl:
        group = await ctl.spawn(Counter, name="tool", devices=[0])
        await group.call("add", 5)
        old_pid = (await group.call("where"))[0]["pid"]
        result = await reboot_migrate(ctl, group, [2], {})
        assert result.restarted_on == [2]
        where = (await result.group.call("where"))[0]
        assert where["devices"] == [2] and where["pid"] != old_pid
        assert_reaped([old_pid])
        assert await result.group.call("add", 1) == [6]


async def test_failed_restart_falls_back_to_the_original_devices():
    async with dynarl.Controller(CONFIG) as ctl:
        group = await ctl.spawn(Counter, name="tool", devices=[0], init={"fail_on_devices": [2]})
        await group.call("add", 3)
        result = await reboot_migrate(ctl, group, [2], {"fail_on_devices": [2]})
        assert result.restarted_on == [0]
        assert await result.group.call("add", 1) == [4]  # nothing lost
        with pytest.raises(MigrationFailed) as info:
            await reboot_migrate(ctl, result.group, [1], {"fail_on_devices": [0, 1]})
        assert "tool" not in ctl.groups
        assert info.value.saved_state == [{"count": 4}]


async def test_a_restore_that_fails_everywhere_leaves_no_group_behind():
    async with dynarl.Controller(CONFIG) as ctl:
        group = await ctl.spawn(Counter, name="tool", devices=[0])
        await group.call("add", 2)
        with pytest.raises(MigrationFailed) as info:
            await reboot_migrate(ctl, group, [1], {"fail_restore": True})
        assert "tool" not in ctl.groups and not ctl.pool.placed.get("tool")  # spawned, not restored: stopped
        assert info.value.saved_state == [{"count": 2}]
        again = await ctl.spawn(Counter, name="tool", devices=[2])  # the name is free again
        await again.call("reboot_restore", info.value.saved_state)
        assert await again.call("add", 1) == [3]
