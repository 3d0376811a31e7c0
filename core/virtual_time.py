"""Virtual-time asyncio event loop: sleeps and timeouts cost no wall time.

`VirtualTimeLoop.time()` is a virtual clock. Whenever the loop has nothing
runnable and no real I/O is ready, the clock jumps straight to the next timer,
so `asyncio.sleep(3600)` returns at once with `loop.time()` exactly 3600 later.
Same program, same seeds -> same sequence of (virtual time, event), however fast
the machine is. This is what lets the inproc launcher emulate thousands of
devices in seconds.

Virtual time is sound only when every actor lives in the loop. Work done in
threads (`run_in_executor`, `to_thread`) or by real peers over sockets takes real
time that the virtual clock does not see: while such work runs, any pending
timer fires as soon as the loop polls, so a timeout can expire "early". Real I/O
still works (it is polled before every jump) and a loop with no timers blocks on
the real selector, so `call_soon_threadsafe` from a thread wakes it up.

A simulation that has no timers and nothing runnable can only be woken by
something outside the loop; usually that is a deadlock. With `stall_timeout`
set (on by default in `run_virtual` / `new_virtual_loop`), waiting that many
real seconds for such a wake-up raises `VirtualTimeDeadlock` instead of hanging.

Use it:
    result = run_virtual(main(), start=0.0)        # like asyncio.run

    def test_something():                          # a plain sync pytest test
        assert run_virtual(scenario()) == ...

    with asyncio.Runner(loop_factory=new_virtual_loop) as runner:
        runner.run(main())

From pytest-asyncio (1.x has no `event_loop` fixture and 1.5 deprecates
overriding `event_loop_policy`), implement its loop-factory hook in a conftest.py
and mark the async tests that should run in virtual time:

    # conftest.py
    from dynarl.core.virtual_time import loop_factories_for

    def pytest_configure(config):
        config.addinivalue_line("markers", "virtual_time: run in virtual time")

    def pytest_asyncio_loop_factories(config, item):
        return loop_factories_for(item)

    @pytest.mark.virtual_time
    async def test_retry_backoff(): ...

The hook must return a factory for every async test under that conftest
(pytest-asyncio turns `None` into a usage error), so unmarked tests get the
stock loop. (The helper is not named `pytest_*`: pytest would take an imported
`pytest_*` name in a conftest for an unknown hook.)
"""

import asyncio
import functools
import selectors
from dataclasses import dataclass, field

DEFAULT_STALL_TIMEOUT = 10.0
"""Real seconds a virtual loop waits with no timers before calling it a deadlock."""


class VirtualTimeDeadlock(RuntimeError):
    """Nothing runnable, no timer pending, and nothing woke the loop in time."""


class _VirtualSelector(selectors.DefaultSelector):
    # asyncio calls select(timeout) with timeout None (no timers), 0 (callbacks
    # ready) or the delay to the next timer; the loop decides what that means.
    def __init__(self, on_select):
        super().__init__()
        self._on_select = on_select

    def select(self, timeout=None):
        return self._on_select(super().select, timeout)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A SelectorEventLoop whose clock jumps to the next timer instead of waiting.

    start: the virtual time the clock starts at.
    stall_timeout: real seconds to wait for outside I/O when no timer is
        pending before raising VirtualTimeDeadlock; None waits forever.
    """

    def __init__(self, *, start: float = 0.0, stall_timeout: float | None = None):
        super().__init__(selector=_VirtualSelector(self._select))
        self._clock = float(start)
        self.stall_timeout = stall_timeout

    def time(self) -> float:
        return self._clock

    def _select(self, real_select, timeout):
        # Real I/O first, without waiting: ready events always win over a jump.
        events = real_select(0)
        if events or timeout == 0:
            return events
        if timeout is None:
            return self._block_on_real_io(real_select)
        # Jump exactly onto the head timer's `when` rather than adding
        # `timeout` (= when - now, rounded, and capped at one day by asyncio):
        # then `when < time() + clock_resolution` holds and it fires this turn.
        scheduled = self._scheduled  # type: ignore[attr-defined]  # BaseEventLoop's timer heap (private)
        assert scheduled, "positive select timeout with no timer pending"
        self._clock = max(self._clock, scheduled[0].when())
        return []

    def _block_on_real_io(self, real_select):
        if self.stall_timeout is None:
            return real_select(None)
        events = real_select(self.stall_timeout)
        if events:
            return events
        tasks = [t for t in asyncio.all_tasks(self) if not t.done()]
        listed = "\n  ".join(repr(t) for t in tasks[:10])
        raise VirtualTimeDeadlock(
            f"virtual time stalled at t={self._clock}: no timer pending, nothing "
            f"runnable, and no real I/O for {self.stall_timeout}s of wall time. "
            f"{len(tasks)} task(s) still waiting:\n  {listed}"
        )

    async def shutdown_default_executor(self, timeout=None):
        # asyncio.Runner (3.12+) bounds the executor join with a timeout; in
        # virtual time it would expire at once while the threads join for real.
        await super().shutdown_default_executor()


def new_virtual_loop(
    *, start: float = 0.0, stall_timeout: float | None = DEFAULT_STALL_TIMEOUT
) -> VirtualTimeLoop:
    """Loop factory for asyncio.Runner / pytest-asyncio; deadlock guard on."""
    return VirtualTimeLoop(start=start, stall_timeout=stall_timeout)


def run_virtual(
    main_coro,
    *,
    start: float = 0.0,
    debug: bool = False,
    stall_timeout: float | None = DEFAULT_STALL_TIMEOUT,
):
    """asyncio.run on a fresh VirtualTimeLoop: cancels leftover tasks, closes the loop."""
    factory = functools.partial(new_virtual_loop, start=start, stall_timeout=stall_timeout)
    with asyncio.Runner(debug=debug, loop_factory=factory) as runner:
        return runner.run(main_coro)


def loop_factories_for(item) -> dict:
    """Body for a conftest `pytest_asyncio_loop_factories` hook (see module doc)."""
    if item.get_closest_marker("virtual_time"):
        return {"virtual_time": new_virtual_loop}
    return {"asyncio": asyncio.new_event_loop}


@dataclass(slots=True)
class EventLog:
    """(virtual time, label) pairs; two runs of one seeded program compare equal."""

    events: list[tuple[float, object]] = field(default_factory=list)

    def record(self, label) -> None:
        self.events.append((asyncio.get_running_loop().time(), label))
