"""A lost worker restarts the job from its newest checkpoint, in the same process.

`dynarl train` (launch/train.py Job) runs the workflow inside one Controller; when it
fails and a worker is lost (its process exited, froze past the heartbeat timeout, or
became unreachable), the controller stops every other worker in order, and a fresh
controller and workflow resume from the newest complete checkpoint: the same path
as `--resume`, which rolls the ledger and metrics.jsonl back to that step, so every
sample of every step is trained exactly once in the record. A failure with no lost
worker (a bug, a bad config, a full disk) still ends the run. At most run.max_restarts
times; each restart's trace goes to trace-restart-N.json.

This is the fallback the DynaRL design keeps for any component: migration-based
survival (a forced donor, a redundant ZeRO shard) would lose less than the steps
since the checkpoint.
"""
from __future__ import annotations

from typing import Any

from dynarl.core.health import LOSS_WAIT_S, seen_lost


async def lost_workers(ctl: Any, wait_s: float = LOSS_WAIT_S) -> list[str]:
    """The names of the controller's ranks that are lost, waiting up to `wait_s` for one
    to be seen; [] when none is."""
    handles = [h for group in list(ctl.groups.values()) for h in group.handles]
    return [f"{h.name} ({h.lost.reason})" for h in await seen_lost(handles, wait_s)]


def restart_note(lost: list[str], error: BaseException, restart: int, max_restarts: int,
                 step: int | None) -> str:
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    where = f"the checkpoint of step {step}" if step is not None else "the start (no checkpoint yet)"
    return (f"lost {', '.join(lost)}; the step failed with: {first[:200]}. Restart {restart}/{max_restarts}: "
            f"every worker from {where}")
