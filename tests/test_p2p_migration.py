NUM_GPUS = 0

import pytest
import torch

import dynarl
from dynarl import ClusterConfig, RuntimeConfig
from dynarl.core.migration.p2p import MigrationFailed, p2p_migrate
from dynarl.core.migration.reshard_records import BoxDigest
from conftest import assert_reaped
from reshard_workers import ReshardTrainer, make_batch



async def trained(ctl, ranks, steps=2):
    group = await ctl.spawn(ReshardTrainer, name="trainer", num_ranks=ranks)
    dp = "trainer_dp" if ranks > 1 else None
    if dp:
        await ctl.process_group(dp, [group])
    await group.call(ReshardTrainer.start, dp)
    for step in range(steps):
        shards = [[make_batch(step)]] * ranks  # each rank's part: here every rank gets the same rows
        await group.scatter(ReshardTrainer.train, shards)
    return group


async def gathered(group):
    """The full state (weights, both moments), each tensor joined from the ranks' dim-0
    rows in rank order (FSDP2's Shard(0)), the optimizer counters and the steps."""
    parts = await group.call(ReshardTrainer.full_state)
    keys = [k for k in parts[0].state if "/" in k]
    state = {k: torch.cat([p.state[k] for p in parts]) for k in keys}
    return state, {int(p.state["adam_step"]) for p in parts}, {p.step for p in parts}


def assert_bitwise_equal(a, b):
    (sa, adam_a, steps_a), (sb, adam_b, steps_b) = a, b
    assert steps_a == steps_b and adam_a == adam_b
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


async def test_dp2_to_1_to_2_and_uneven_2_to_3_keep_state_bitwise():
    config = RuntimeConfig(launcher="local", cluster=ClusterConfig(devices_per_node=3))
    async with dynarl.Controller(config) as ctl:
        group = await trained(ctl, 2)
        before = await gathered(group)
        old_pids = group.pids
        result = await p2p_migrate(ctl, group, [2], {})
        weights = sum(t.numel() for k, t in before[0].items() if k.startswith("param/"))
        assert result.group.world_size == 1 and result.elements_moved == 3 * weights  # weights, 2 moments
        assert set(result.phases) == {"create", "plan", "transfer", "install", "destroy"}
        assert_bitwise_equal(before, await gathered(result.group))
        assert_reaped(old_pids)  # destroyed only after the switch
        assert "trainer_dp" not in ctl.process_groups.active  # no group outlives its members
        back = await p2p_migrate(ctl, result.group, [0, 1], {})
        assert_bitwise_equal(before, await gathered(back.group))
        three = await p2p_migrate(ctl, back.group, [0, 1, 2], {})
        assert_bitwise_equal(before, await gathered(three.group))
        assert sorted(ctl.process_groups.active) == [three.dp_group]  # back's DP group went with back
        # and it trains on: the next step runs in the 3-rank DP group
        await three.group.scatter(ReshardTrainer.train, [[make_batch(9)]] * 3)


@pytest.mark.parametrize("fault", ["create", "transfer", "confirm"])
async def test_a_fault_in_any_phase_rolls_back_and_training_continues(fault):
    config = RuntimeConfig(launcher="local", cluster=ClusterConfig(devices_per_node=4))
    async with dynarl.Controller(config) as ctl:
        group = await trained(ctl, 2)
        before = await gathered(group)
        import dynarl.core.migration.p2p as p2p
        timeout = 4.0 if fault == "confirm" else 60.0
        with pytest.raises(MigrationFailed, match="rolled back"):
            await p2p.p2p_migrate(ctl, group, [2, 3], {"fail": fault}, timeout_s=timeout)
        assert set(ctl.groups) == {"trainer"}  # the new ranks are gone
        assert_bitwise_equal(before, await gathered(group))  # nothing lost
        await group.scatter(ReshardTrainer.train, [[make_batch(7)]] * 2)  # training continues on the old ranks
        after = await gathered(group)
        assert after[2] == {before[2].pop() + 1}


@pytest.mark.parametrize("new_scalars,fails", [({"adam_step": 3}, False), ({"adam_step": 2}, True), ({}, True)])
def test_confirmation_compares_the_optimizer_counters(new_scalars, fails):
    from dynarl.core.migration.p2p import _check_confirmations

    old = [BoxDigest(owned=6, step=3, sums={"param": 1.5}, scalars={"adam_step": 3})]
    new = [BoxDigest(owned=6, step=3, sums={"param": 1.5}, scalars=new_scalars)]
    if fails:
        with pytest.raises(MigrationFailed, match="optimizer counters"):
            _check_confirmations(new, 6, 3, old)
    else:
        _check_confirmations(new, 6, 3, old)
