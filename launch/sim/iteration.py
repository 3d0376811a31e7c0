"""One GRPO iteration of the simulator: the macro flow of components/workflows/grpo.py,

    put the iteration's prompt groups on "prompts"
    rollout    "prompts"    -> "rollouts"     finished groups, chunk by chunk
    inference  "rollouts"   -> "experience"   old-policy log-probs; scored samples one by one
    trainer    "experience"                  streaming gradient accumulation, then the step
    weight sync trainer -> rollout, inference (version + 1)

run with the same stage() helper (components/workflows/stages.py): every stage
holds its group's device_lock, so time-shared devices serve the components in
data order, and stages on devices of their own stream from their upstream. (The
reward stage is left out: a math verifier or the tool's verdict costs CPU time,
not device time.)
"""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from dynarl.components.experience import END
from dynarl.components.workflows.live import LiveStep, joined
from dynarl.components.workflows.stages import StageClock, stage
from dynarl.components.workloads.samples import Group
from dynarl.core.controller import Controller
from dynarl.core.worker_group import WorkerGroup, gather_or_cancel

from .turn_router import start_turn_router

CHANNELS = ("prompts", "rollouts", "experience")


@dataclass(slots=True)
class SimGroups:
    rollout: WorkerGroup
    inference: WorkerGroup
    trainer: WorkerGroup

    def all(self) -> list[WorkerGroup]:
        return [self.rollout, self.inference, self.trainer]


def open_channels(ctl: Controller, capacity: int) -> None:
    """Each channel holds a whole iteration: on time-shared devices the next stage
    reads only after the previous one has produced everything."""
    for name in CHANNELS:
        ctl.channel(name, capacity=capacity)


@dataclass(slots=True)
class LiveIteration(LiveStep):
    """The simulator's own iteration in progress (no reward stage: inference reads
    "rollouts" straight from the rollout): live.py's LiveStep with this chain."""
    INPUT = {"rollout": "prompts", "inference": "rollouts", "trainer": "experience"}
    UPSTREAM = {"inference": "rollout", "trainer": "inference"}
    borrowed: bool = False
    """The rollout also runs on devices lent by parked inference and trainer ranks
    (migrate.Migrator.lend): parking, not device_lock, keeps them apart, so the
    rollout stage does not take the lock (it would hold the lenders' devices)."""


async def run_iteration(ctl: Controller, g: SimGroups, batch: list[Group], version: int, *, clock: StageClock,
                        chunk_size: int, weight_bytes: int, live: LiveIteration | None = None,
                        sync_lock: asyncio.Lock | None = None) -> dict[str, list[Any]]:
    """`sync_lock`: held for the weight sync, so no migration changes the groups while the
    new weights go out (the Migrator's lock; on the real clock a rollout engine being
    handed back could otherwise vanish between the call and its delivery)."""
    live = live or LiveIteration(version)
    label = f"iteration {version}"
    prompts = ctl.channel("prompts")
    for index, group in enumerate(batch):
        await prompts.put(group.to_wire(index))
    for _ in range(g.rollout.world_size):
        await prompts.put(END)
    rollout = asyncio.ensure_future(joined(asyncio.ensure_future(stage(
        ctl, g.rollout, "generate", get="prompts", put="rollouts", clock=clock, label=label, version=version,
        chunk_size=chunk_size, lock=not live.borrowed)), live.extras["rollout"]))
    live.done["rollout"] = rollout
    inference = asyncio.ensure_future(joined(asyncio.ensure_future(stage(
        ctl, g.inference, "compute_logprobs", get="rollouts", put="experience", after=rollout, clock=clock,
        label=label, version=version)), live.extras["inference"]))
    live.done["inference"] = inference
    trainer = asyncio.ensure_future(joined(asyncio.ensure_future(stage(
        ctl, g.trainer, "train", get="experience", put=None, after=inference, clock=clock, label=label,
        version=version)), live.extras["trainer"]))
    live.done["trainer"] = trainer
    # multi-turn: the rollout's DataRouter routes follow-up turns and assembles groups (turn_router.py)
    router = start_turn_router(ctl, g.rollout, batch, chunk_size, version)
    r, i, t, *_ = await gather_or_cancel([rollout, inference, trainer, *([router] if router else [])])
    async with sync_lock or contextlib.nullcontext():
        await sync_weights(g, version + 1, weight_bytes)
    return {"rollout": r, "inference": i, "trainer": t}


async def sync_weights(g: SimGroups, version: int, weight_bytes: int) -> None:
    """The new policy to rollout and inference; each engine pays the transfer on its next step."""
    await gather_or_cancel([g.rollout.call("receive_weights", version, weight_bytes),
                            g.inference.call("receive_weights", version, weight_bytes)])
