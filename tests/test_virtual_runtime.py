NUM_GPUS = 0

import asyncio
import random
import time

import dynarl
from dynarl import RuntimeConfig


class Timed(dynarl.Worker):
    """Sleeps on the loop clock, like an emulated engine."""

    async def work(self, seed, steps):
        rng = random.Random(seed * 1000 + self.rank)
        loop = asyncio.get_running_loop()
        log = []
        for i in range(steps):
            await asyncio.sleep(rng.uniform(0.5, 30.0))
            log.append((round(loop.time(), 9), self.rank, i))
        return log


def simulate(seed):
    async def workflow(ctl):
        group = await ctl.spawn(Timed, num_ranks=64)
        logs = await group.call(Timed.work, seed, 20)
        return sorted(e for log in logs for e in log), asyncio.get_running_loop().time()
    config = RuntimeConfig(launcher="inproc", cluster=dynarl.ClusterConfig(devices_per_node=64))
    return dynarl.run(workflow, config, virtual_time=True)


def test_inproc_run_in_virtual_time_is_fast_and_deterministic():
    start = time.perf_counter()
    events_a, end_a = simulate(seed=1)
    wall = time.perf_counter() - start
    events_b, end_b = simulate(seed=1)
    events_c, _ = simulate(seed=2)
    assert len(events_a) == 64 * 20
    assert end_a > 200        # hundreds of simulated seconds ...
    assert wall < end_a / 10  # ... never waited for in real time
    assert (events_a, end_a) == (events_b, end_b)
    assert events_a != events_c
