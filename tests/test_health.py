NUM_GPUS = 0
"""Fleet health (core/health.py): the pure state of a rank, and the controller's view
of a live one that is paused (suspect before it would be lost) and comes back."""
import asyncio
import os
import signal

import pytest

import dynarl
from dynarl import RuntimeConfig
from dynarl.core.health import HealthLimits, rank_health
from conftest import assert_reaped
from workers import Echo

LIMITS = HealthLimits(suspect_after_s=1.5, lost_after_s=5.0, lag_suspect_s=0.5, hang_after_s=300.0)


@pytest.mark.parametrize("kw, state", [
    pytest.param(dict(silent_s=0.2, loop_lag_s=0.0), "healthy", id="beating"),
    pytest.param(dict(silent_s=2.0, loop_lag_s=0.0), "suspect", id="silent-past-three-beats"),
    pytest.param(dict(silent_s=0.2, loop_lag_s=1.0), "suspect", id="loop-lagging"),
    pytest.param(dict(silent_s=5.1, loop_lag_s=0.0), "lost", id="silent-past-the-timeout"),
    pytest.param(dict(silent_s=0.2, loop_lag_s=301.0), "lost", id="loop-blocked-past-the-hang-bound"),
    pytest.param(dict(silent_s=0.0, loop_lag_s=0.0, gone=True), "lost", id="known-gone"),
    pytest.param(dict(silent_s=0.2, loop_lag_s=0.0, weights=3, current=4), "stale", id="older-weights"),
    pytest.param(dict(silent_s=0.2, loop_lag_s=0.0, weights=4, current=4), "healthy", id="the-steps-weights"),
    pytest.param(dict(silent_s=2.0, loop_lag_s=0.0, weights=3, current=4), "suspect", id="suspect-before-stale"),
    pytest.param(dict(silent_s=0.2, loop_lag_s=0.0, weights=None, current=4), "healthy", id="no-weights"),
])
def test_rank_health_table(kw, state):
    assert rank_health(limits=LIMITS, **{"gone": False, **kw}) == state


def test_limits_from_the_runtime_config():
    limits = HealthLimits.of(heartbeat_interval_s=0.5, heartbeat_timeout_s=5.0, hang_timeout_s=300.0)
    assert limits == HealthLimits(suspect_after_s=1.5, lost_after_s=5.0, lag_suspect_s=0.5, hang_after_s=300.0)
    assert HealthLimits.of(0.5, 1.0, 300.0).suspect_after_s == 1.0  # never later than the loss


async def until_state(ctl, name, state, weights=None, timeout_s=60.0):
    """Polls the fleet until the rank `name` is in `state` (a loaded machine delays
    heartbeats and lags loops: a look at one moment may catch a suspect)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while ctl.fleet(weights)[name] != state:
        assert loop.time() < deadline, ctl.fleet(weights)[name]
        await asyncio.sleep(0.1)


async def test_a_paused_worker_is_suspect_then_healthy_again():
    # lost only after 20 s of silence: far past any pause a loaded machine adds
    config = RuntimeConfig(launcher="local", heartbeat_interval_s=0.2, heartbeat_timeout_s=20.0)
    async with dynarl.Controller(config) as ctl:
        group = await ctl.spawn(Echo, num_ranks=2)
        pid = (await group.on([1]).call(Echo.hello, 0))[0]["pid"]
        name = group.handles[1].name
        await until_state(ctl, name, "healthy")
        os.kill(pid, signal.SIGSTOP)
        try:
            await until_state(ctl, name, "suspect", timeout_s=15.0)  # after 0.6 s of silence
            assert group.handles[1].lost is None
        finally:
            os.kill(pid, signal.SIGCONT)
        await until_state(ctl, name, "healthy", timeout_s=15.0)
        assert group.handles[1].lost is None
        assert await group.on([1]).call(Echo.hello, 1)  # it serves again
        group.handles[0].weight_version = 3
        await until_state(ctl, group.handles[0].name, "stale", weights=4)
    assert_reaped([pid])
