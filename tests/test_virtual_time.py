NUM_GPUS = 0

import asyncio
import random
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from dynarl.core.virtual_time import (
    EventLog,
    VirtualTimeDeadlock,
    VirtualTimeLoop,
    new_virtual_loop,
    run_virtual,
)


def simulate(seed: int, horizon: float, num_timers: int = 1000) -> EventLog:
    """num_timers tasks sleep seeded random intervals until `horizon`, logging each wake."""

    async def main():
        rng = random.Random(seed)
        log = EventLog()
        loop = asyncio.get_running_loop()

        async def worker(i):
            while True:
                await asyncio.sleep(rng.uniform(100.0, 300.0))
                if loop.time() > horizon:
                    return
                log.record(i)

        async with asyncio.TaskGroup() as tg:
            for i in range(num_timers):
                tg.create_task(worker(i))
        return log

    return run_virtual(main())


def test_ten_thousand_seconds_of_thousand_timers_is_fast_and_deterministic():
    started = time.perf_counter()
    first = simulate(seed=0, horizon=10_000.0)
    assert time.perf_counter() - started < 600  # far under the 10,000 s it would take in real time
    times = [t for t, _ in first.events]
    assert len(times) > 30_000 and times == sorted(times) and times[-1] > 9_900
    assert simulate(seed=0, horizon=10_000.0) == first


def test_different_seed_gives_different_log():
    assert simulate(seed=0, horizon=1_000.0) != simulate(seed=1, horizon=1_000.0)


@pytest.mark.parametrize("start", [0.0, 123.456])
def test_long_sleep_is_instant_and_exact(start):
    async def main():
        loop = asyncio.get_running_loop()
        assert loop.time() == start
        await asyncio.sleep(3600)
        after_hour = loop.time()
        # Beyond asyncio's one-day cap on a single select timeout.
        await asyncio.sleep(3 * 86_400)
        return after_hour, loop.time()

    wall = time.perf_counter()
    after_hour, after_days = run_virtual(main(), start=start)
    assert time.perf_counter() - wall < 60  # not the hour it would take in real time
    assert after_hour == start + 3600
    assert after_days == pytest.approx(start + 3600 + 3 * 86_400, abs=1e-9)


def test_timers_fire_in_order_at_exact_times():
    delays = [0.3, 1e-6, 2.5, 0.1, 1e-6 + 1e-7, 1000.0, 0.2]

    async def main():
        loop = asyncio.get_running_loop()
        fired = []
        await asyncio.sleep(0.7)  # a non-round base time exposes float drift
        now = loop.time()
        for delay in delays:
            loop.call_later(delay, lambda d=delay: fired.append((loop.time(), d)))
        loop.call_at(now + 50.0, lambda: fired.append((loop.time(), "at")))
        await asyncio.sleep(2000)
        expected = sorted([(now + d, d) for d in delays] + [(now + 50.0, "at")],
                          key=lambda pair: pair[0])
        return fired, expected

    fired, expected = run_virtual(main())
    assert fired == expected  # exact float equality, not approx


def test_timeout_and_wait_for_fire_at_right_virtual_time():
    async def main():
        loop = asyncio.get_running_loop()
        log = EventLog()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(5):
                await asyncio.sleep(100)
        log.record("timeout")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.sleep(100), timeout=7)
        log.record("wait_for")
        async with asyncio.timeout(10):  # does not fire: the body finishes first
            await asyncio.sleep(9)
        log.record("in time")
        assert await asyncio.wait_for(asyncio.sleep(1, result="ok"), timeout=2) == "ok"
        log.record("wait_for ok")
        return log.events, loop

    events, loop = run_virtual(main())
    assert events == [(5, "timeout"), (12, "wait_for"), (21, "in time"), (22, "wait_for ok")]
    assert loop.is_closed()


def test_thread_wakes_loop_that_has_no_timers():
    async def main():
        loop = asyncio.get_running_loop()
        woken = loop.create_future()

        def wake_later():
            time.sleep(0.05)  # real time: the loop must block, not spin or jump
            loop.call_soon_threadsafe(woken.set_result, "woken")

        threading.Thread(target=wake_later).start()
        return await woken, loop.time()

    assert run_virtual(main(), stall_timeout=60.0) == ("woken", 0.0)


def test_executor_work_takes_no_virtual_time():
    # Documented limit: threads run in real time the virtual clock never sees.
    async def main():
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, time.sleep, 0.05)
        return loop.time()

    assert run_virtual(main()) == 0.0


def test_deadlock_raises_instead_of_hanging():
    async def main():
        await asyncio.Event().wait()  # nobody will ever set it

    wall = time.perf_counter()
    with pytest.raises(VirtualTimeDeadlock, match="no timer pending"):
        run_virtual(main(), stall_timeout=0.1)
    assert time.perf_counter() - wall < 60  # raised after the stall timeout, not never


def test_stall_guard_is_off_on_bare_loop_and_on_in_factory():
    for loop, guarded in [(VirtualTimeLoop(), False), (new_virtual_loop(start=5.0), True)]:
        try:
            assert (loop.stall_timeout is not None) == guarded
            assert loop.time() == (5.0 if guarded else 0.0)
        finally:
            loop.close()


def test_runner_loop_factory_runs_in_virtual_time():
    with asyncio.Runner(loop_factory=new_virtual_loop) as runner:
        runner.run(asyncio.sleep(60))
        assert runner.get_loop().time() == 60


def test_pytest_asyncio_hook_selects_virtual_loop(tmp_path):
    # The recipe from the module docstring, run in a throwaway pytest session.
    (tmp_path / "conftest.py").write_text(textwrap.dedent("""
        from dynarl.core.virtual_time import loop_factories_for

        def pytest_configure(config):
            config.addinivalue_line("markers", "virtual_time: run in virtual time")

        def pytest_asyncio_loop_factories(config, item):
            return loop_factories_for(item)
    """))
    (tmp_path / "test_hook.py").write_text(textwrap.dedent("""
        import asyncio, pytest
        from dynarl.core.virtual_time import VirtualTimeLoop

        @pytest.mark.virtual_time
        async def test_virtual():
            loop = asyncio.get_running_loop()
            await asyncio.sleep(3600)
            assert isinstance(loop, VirtualTimeLoop) and loop.time() == 3600

        async def test_plain():
            assert not isinstance(asyncio.get_running_loop(), VirtualTimeLoop)
    """))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-o", "asyncio_mode=auto", "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout
