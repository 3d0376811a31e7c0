"""Fleet health: each rank, as the controller sees it, in one of four states.

    healthy   heard from within `suspect_after_s`, its event loop responsive, and
              holding the step's weights (or weights do not apply to it)
    suspect   silent past `suspect_after_s` (a paused or swapped-out process, a slow
              link) or its event loop lagging past `lag_suspect_s`: not lost yet,
              but no new work or devices should be planned onto it
    stale     alive, but holding older weights than the step's (it joined or was
              replaced since the last sync): it serves only after a weight refit
    lost      gone (exited, unreachable), silent past `lost_after_s`, or its loop
              blocked past `hang_after_s`

`rank_health` is pure (table-tested); `monitor` applies it to every rank each
heartbeat interval and marks the lost ones.
`seen_lost` waits a moment for a loss behind a failure to be seen (a call can fail
before the exit is noticed): the restart (launch/recovery.py) and the in-place
survival (components/workflows/survival.py) both ask it.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Sequence

if TYPE_CHECKING:
    from dynarl.core.worker_handle import WorkerHandle

State = Literal["healthy", "suspect", "stale", "lost"]
STATES: tuple[State, ...] = ("healthy", "suspect", "stale", "lost")


@dataclass(frozen=True, slots=True)
class HealthLimits:
    suspect_after_s: float
    lost_after_s: float
    lag_suspect_s: float
    hang_after_s: float

    @classmethod
    def of(cls, heartbeat_interval_s: float, heartbeat_timeout_s: float, hang_timeout_s: float) -> "HealthLimits":
        """Suspect after three missed heartbeats (or a loop a heartbeat behind), never
        later than the loss itself."""
        return cls(suspect_after_s=min(3 * heartbeat_interval_s, heartbeat_timeout_s),
                   lost_after_s=heartbeat_timeout_s, lag_suspect_s=min(heartbeat_interval_s, hang_timeout_s),
                   hang_after_s=hang_timeout_s)


def rank_health(*, gone: bool, silent_s: float, loop_lag_s: float, limits: HealthLimits,
                weights: int | None = None, current: int | None = None) -> State:
    """`gone`: the rank is known lost already; `weights`/`current`: the weight version
    it holds and the step's (None where weights do not apply)."""
    if gone or silent_s > limits.lost_after_s or loop_lag_s > limits.hang_after_s:
        return "lost"
    if silent_s > limits.suspect_after_s or loop_lag_s > limits.lag_suspect_s:
        return "suspect"
    if weights is not None and current is not None and weights < current:
        return "stale"
    return "healthy"


async def monitor(watched: Callable[[], list[WorkerHandle]], last_seen: Mapping[bytes, float],
                  limits: HealthLimits, interval_s: float, where: Callable[[WorkerHandle], str]) -> None:
    """Reports silent or hung ranks as lost (a rank is suspect first). Consumes: the
    router's `last_seen` (by worker id) and each rank's heartbeat lag; `where(rank)`
    names its node in the reason. Unblocked by: cancellation at shutdown."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(interval_s)
        now = loop.time()
        for h in watched():
            if not h.alive or h.endpoint is None:
                continue
            h.silent_s = now - last_seen.get(h.spec.worker_id.encode(), now)
            if rank_health(gone=False, silent_s=h.silent_s, loop_lag_s=h.loop_lag_s, limits=limits) != "lost":
                continue
            if h.silent_s > limits.lost_after_s:
                # its heartbeat thread is silent: the process is frozen (SIGSTOP, swapped
                # out), its host or the network is gone, or a C call holds the GIL
                h.mark_lost(f"no heartbeat for {h.silent_s:.1f} s{where(h)} (process frozen or "
                            "unreachable: its host or the network to it down, or a native call holding the GIL)")
            else:
                h.mark_lost(f"event loop blocked for {h.loop_lag_s:.1f} s{where(h)}")


LOSS_WAIT_S = 2.0
"""How long after a failure the controller may take to see the loss behind it (a
peer's collective can fail before the dead rank's exit is noticed)."""


async def seen_lost(handles: Sequence[Any], wait_s: float = LOSS_WAIT_S) -> list[Any]:
    """The handles among `handles` that are lost, waiting up to `wait_s` for one to be
    seen (not once every one is stopped: no loss comes then); [] when none is."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        lost = [h for h in handles if h.lost is not None]
        if lost or loop.time() >= deadline or all(h.stopped for h in handles):
            return lost
        await asyncio.sleep(0.05)
