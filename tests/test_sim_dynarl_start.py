NUM_GPUS = 0
"""dynarl in the simulator: the donor signal, the rollout borrowing the parked
components' devices at an iteration's start (Fig 13, scheduler.dynarl.lend), the
poll period at scale."""

import pytest

from dynarl.components.placement import policy as _policies  # noqa: F401  registers the policies first
from dynarl.components.placement.dynarl import decide_period_s
from dynarl.core.scheduler.policy import engine_low
from dynarl.core.scheduler.view import RolloutProgress, rollout_done
from dynarl.launch.sim.runner import run_policy
from dynarl.launch.sim.scenario import SimConfig, build_scenario


@pytest.mark.parametrize("utilization, peak, u_low, low", [
    (0.02, 0.02, 0.2, False),   # filling at the start: below U_low, but at its peak
    (0.10, 0.27, 0.2, True),    # draining, below U_low of capacity
    (0.25, 0.27, 0.2, False),   # draining, still above U_low
    (0.25, 0.27, 0.5, True),    # a high U_low fires right after the peak
    (0.005, 0.27, 0.01, True),
    (0.02, 0.27, 0.01, False),  # a tiny U_low waits for the last stragglers
    (0.0, 0.0, 0.2, True),      # never held a request
])
def test_engine_low(utilization, peak, u_low, low):
    assert engine_low(utilization, peak, u_low) is low


@pytest.mark.parametrize("active, finished_mean, prompts, done", [
    (0, 4096.0, 0, True),    # everything finished
    (3, 4096.0, 0, False),   # stragglers left
    (0, 0.0, 0, False),      # nothing finished yet: not started
    (0, 4096.0, 5, False),   # prompts still queued
])
def test_rollout_done(active, finished_mean, prompts, done):
    finished = 2 if finished_mean else 0
    progress = RolloutProgress(active=active, finished=finished, finished_tokens=int(finished * finished_mean))
    assert rollout_done(progress, prompts) is done


@pytest.mark.parametrize("engines, period", [(8, 1.0), (32, 1.0), (256, 1.0), (512, 2.0), (2048, 8.0)])
def test_decide_period_grows_past_the_polled_engines(engines, period):
    assert decide_period_s(engines) == period


def test_rollout_borrows_every_device_then_gives_them_back():
    scn = build_scenario(SimConfig(workload="math-1.5b", devices=16, prompts=16, iterations=2, warmup=1,
                                   policies=("dynarl",)))
    run = run_policy(scn, "dynarl")
    assert len(run.iterations) == 2  # the runner checked every sample reached the trainer exactly once
    for rec in run.iterations:
        held = {}  # time -> {component: devices} over the iteration's window
        for c, n, s, e in run.ownership:
            if rec.start <= s < rec.end:
                held.setdefault(s, {})[c] = n
        # at some point the rollout holds the whole cluster, inference and trainer parked
        assert {"rollout": 16} in held.values()
        # later the parked components hold devices again (returned home, then grown)
        assert any(h.get("trainer", 0) >= 1 and h.get("inference", 0) >= 1 for h in held.values())
        assert all(sum(h.values()) <= 16 for h in held.values())  # never more devices than exist
    assert len(run.migrations["switch"]) == 2  # one return home per iteration
