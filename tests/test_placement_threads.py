"""components/placement/threads.py: a CPU rank's torch threads, as a table."""
import pytest

from dynarl.components.placement.threads import rank_threads


@pytest.mark.parametrize("cores, devices_per_node, ranks_on_node, time_shared, threads", [
    (2, 2, 2, True, 1),     # the default job: two rollout (or trainer) ranks take turns with the others
    (2, 2, 1, True, 2),     # one trainer rank has both cores while it trains
    (2, 2, 1, False, 1),    # spatial: its own device's core only, the others run beside it
    (16, 4, 1, False, 4),
    (16, 4, 3, True, 5),
    (2, 4, 4, True, 1),     # fewer cores than ranks: one thread each, never 0
    (3, 4, 1, False, 1),
])
def test_rank_threads(cores, devices_per_node, ranks_on_node, time_shared, threads):
    assert rank_threads(cores, devices_per_node, ranks_on_node, time_shared) == threads


def test_rank_threads_refuses_an_empty_node():
    with pytest.raises(ValueError, match="must be >= 1"):
        rank_threads(0, 2, 1, True)


async def test_a_groups_threads_reach_its_ranks_and_its_standby_pool():
    import dynarl
    from dynarl import RuntimeConfig
    from dynarl.core.migration.standby import StandbyPool
    from workers import Consumer

    async with dynarl.Controller(RuntimeConfig(launcher="inproc", worker_threads=None)) as ctl:
        group = await ctl.spawn(Consumer, name="trainer", num_ranks=1, threads=2)
        other = await ctl.spawn(Consumer, name="reward", num_ranks=1)
        pool = StandbyPool(ctl, Consumer, "trainer", {})
        await pool.fill([0])
        assert [h.spec.threads for h in group.handles + pool.group.handles] == [2, 2]
        assert [h.spec.threads for h in other.handles] == [1] and other.threads == 1
