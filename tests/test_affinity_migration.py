NUM_GPUS = 0

import dynarl
from dynarl import RuntimeConfig
from dynarl.core.data_router import DataRouter, ItemStatus, WorkerState
from dynarl.core.migration.workload import workload_migrate
from workload_workers import EngineWorker, requests


def live_workers(group, loads):
    return {h.spec.worker_id: WorkerState(load) for h, load in zip(group.handles, loads)}


async def test_follow_up_turns_fall_back_after_their_engine_is_migrated_away():
    router = DataRouter()
    async with dynarl.Controller(RuntimeConfig(launcher="inproc")) as ctl:
        group = await ctl.spawn(EngineWorker, name="rollout", devices=[0, 1])
        ids = [h.spec.worker_id for h in group.handles]
        # Episode A lives on engine 1 (its first turn ran there, 180 context tokens cached).
        episode = ItemStatus(affinity="prefer", last_worker=ids[1], cached_prefix=180)
        assert router.distribute(episode, live_workers(group, [0.5, 0.1])).worker == ids[1]
        episode.cached_prefix = 180
        await group.scatter(EngineWorker.submit, [[requests("a", 2)], [requests("b", 2)]])
        await workload_migrate(ctl, group, [1])  # the scheduler takes engine 1 away
        workers = {**live_workers(group, [0.5]), ids[1]: WorkerState(0.0, alive=False)}
        route = router.distribute(episode, workers)
        assert route.worker == ids[0] and route.reason == "fallback-gone"
        assert route.reprefill_tokens == 180 and router.reprefill_tokens == 180
        # The next turn stays on its new home: no further re-prefill.
        episode.cached_prefix = 220
        again = router.distribute(episode, workers)
        assert again.worker == ids[0] and again.reprefill_tokens == 0
