NUM_GPUS = 0

import pytest

import dynarl
from dynarl import ClusterConfig, RuntimeConfig
from dynarl.core.migration.p2p import MigrationFailed
from dynarl.core.migration.workload import assign, workload_migrate
from conftest import assert_reaped
from workload_workers import EngineWorker, requests


@pytest.mark.parametrize("weights,loads,expected", [
    pytest.param([5, 1, 1], {0: 0.0, 1: 0.0}, [0, 1, 1], id="heaviest-first-then-balance"),
    pytest.param([1, 1], {0: 10.0, 2: 0.0}, [2, 2], id="to-the-idle-rank"),
    pytest.param([], {0: 0.0}, [], id="nothing-to-move"),
    pytest.param([2, 2], {3: 1.0, 1: 1.0}, [1, 3], id="ties-lowest-position"),
])
def test_assign_table(weights, loads, expected):
    assert assign(weights, loads) == expected


async def reference_tokens():
    async with dynarl.Controller(RuntimeConfig(launcher="inproc")) as ctl:
        solo = await ctl.spawn(EngineWorker, num_ranks=1)
        await solo.call(EngineWorker.submit, requests("a", 6) + requests("b", 6))
        return (await solo.call(EngineWorker.drain))[0]


async def test_released_rank_work_finishes_on_the_kept_rank_with_the_same_tokens():
    expected = await reference_tokens()
    config = RuntimeConfig(launcher="local", cluster=ClusterConfig(devices_per_node=2))
    async with dynarl.Controller(config) as ctl:
        group = await ctl.spawn(EngineWorker, name="rollout", num_ranks=2)
        await group.scatter(EngineWorker.submit, [[requests("a", 6)], [requests("b", 6)]])
        await group.call(EngineWorker.run_steps, 6)  # mid-generation: some done, some running, some waiting
        released_pid = group.pids[1]
        finished_before = (await group.on([1]).call(EngineWorker.finished))[0]  # already sent downstream
        result = await workload_migrate(ctl, group, [1])
        assert result.moved > 0 and result.freed_devices == [1]
        assert group.world_size == 1 and ctl.pool.placed["rollout"] == [0]
        assert_reaped([released_pid])
        finished_after = (await group.call(EngineWorker.drain))[0]
    # Ledger: every request finished exactly once, on one rank or the other ...
    ids = list(finished_before) + list(finished_after)
    assert sorted(ids) == sorted(expected) and len(ids) == len(set(ids))
    # ... with the tokens an uninterrupted run produces, also for the continued ones.
    for rid, tokens in {**finished_before, **finished_after}.items():
        assert tokens == expected[rid], rid
    assert any(rid.startswith("b") for rid in finished_after)  # some of rank 1's work moved


async def test_failed_handover_gives_the_work_back():
    config = RuntimeConfig(launcher="inproc")
    async with dynarl.Controller(config) as ctl:
        group = await ctl.spawn(EngineWorker, name="rollout", devices=[0, 1], init={"fail_import": True})
        await group.scatter(EngineWorker.submit, [[requests("a", 4)], [requests("b", 4)]])
        await group.call(EngineWorker.run_steps, 3)
        with pytest.raises(MigrationFailed, match="rolled back"):
            await workload_migrate(ctl, group, [1])
        assert group.world_size == 2
        assert await group.call(EngineWorker.is_held) == [False, False]  # the kept rank is let go: it may finish
        results = await group.call(EngineWorker.drain)
    assert sorted(results[1]) == [f"b{i}" for i in range(4)]  # rank 1 finished its own work


async def test_a_failed_export_lets_the_kept_rank_go():
    """The kept rank was held open by workload_load; an export that fails must not leave
    it waiting for an import forever."""
    async with dynarl.Controller(RuntimeConfig(launcher="inproc")) as ctl:
        group = await ctl.spawn(EngineWorker, name="rollout", devices=[0, 1], init={"fail_export": True})
        await group.scatter(EngineWorker.submit, [[requests("a", 4)], [requests("b", 4)]])
        await group.call(EngineWorker.run_steps, 3)
        with pytest.raises(MigrationFailed, match="rolled back"):
            await workload_migrate(ctl, group, [1])
        assert group.world_size == 2
        assert await group.call(EngineWorker.is_held) == [False, False]
        results = await group.call(EngineWorker.drain)
    assert sorted(results[0]) == [f"a{i}" for i in range(4)] and sorted(results[1]) == [f"b{i}" for i in range(4)]



# --- rollback with several ranks: each item runs exactly once ----------------------------

async def _ledger_after(init: dict, release: list[int], ranks: int = 3) -> tuple[dict, list[list[str]], bool]:
    """Runs a failing migration over `ranks` engines; returns every request's tokens
    (finished on any rank, before or after), and the requests finished per rank."""
    config = RuntimeConfig(launcher="inproc", cluster=ClusterConfig(devices_per_node=ranks))
    async with dynarl.Controller(config) as ctl:
        group = await ctl.spawn(EngineWorker, name="rollout", devices=list(range(ranks)), init=init)
        await group.scatter(EngineWorker.submit, [[requests(chr(ord("a") + r), 4)] for r in range(ranks)])
        await group.call(EngineWorker.run_steps, 3)
        before = await group.call(EngineWorker.finished)
        with pytest.raises(MigrationFailed, match="rolled back"):
            await workload_migrate(ctl, group, release)
        assert group.world_size == ranks
        held = await group.call(EngineWorker.is_held)
        after = await group.call(EngineWorker.drain)
    per_rank = [sorted(set(a) | set(b)) for a, b in zip(before, after)]
    return {rid: t for part in after for rid, t in part.items()}, per_rank, any(held)


@pytest.mark.parametrize("init, release, note", [
    ({"fail_export": [2]}, [1, 2], "rank 2's export fails: rank 1's exported requests go back to it"),
    ({"fail_import": [0]}, [2], "rank 1 imports, rank 0 refuses: rank 1's share stays, the rest goes back"),
    ({"fail_load": [1]}, [2], "a kept rank's load fails: nothing moves, rank 0 is let go"),
])
async def test_a_failed_migration_runs_every_request_exactly_once(init, release, note):
    finished, per_rank, held = await _ledger_after(init, release)
    every = sorted(rid for part in per_rank for rid in part)
    assert every == sorted(f"{p}{i}" for p in "abc" for i in range(4)), note  # each once, none lost
    assert len(every) == len(set(every)), note
    assert not held, note
