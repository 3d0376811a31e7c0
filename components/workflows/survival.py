"""A lost rollout, reward, judge or inference rank is a forced donor: the step goes
on, the job does not restart.

Every prompt group of the step is in the custody of the rank that took it, stage by
stage (transport/custody.py Custody): "prompts" until the rollout rank puts the chunk
made of it on "rollouts", "rollouts" until a reward rank puts it scored on "scored",
"scored" until an inference rank puts it on "experience" (with an LLM judge: "rollouts"
until a reward rank puts it on "rewarded", which a judge rank puts on "scored"); the
put that delivers the
work releases what it was made of, in one message. When a rank of one of those stages
is lost (its process exited, froze past the heartbeat timeout, or became unreachable)
during its stage, or between steps:

  1. the items it held go back to the front of its input channel, in the order it
     took them (its END last, if it had taken it), for the ranks still working or its
     replacement; a rollout group is generated again from its prompt, every sample
     with its own sampling seed: nothing is lost, and nothing it had delivered is made
     twice;
  2. it is replaced on its devices (a Reboot: a fresh rank of the group's class starts
     there, then the lost process is reaped); a rollout or inference replacement loads
     the step's weights from the trainer (a refit, and inference the reference policy)
     before it serves, then runs the stage's call on the same channels;
  3. the step's metrics count it (`survived`, `reissued_items`), and the progress
     line says so.

A receiver lost during the weight sync's broadcast is replaced the same way, and every
rank the broken broadcast left short of the new weights loads them from the trainer
(`refit`). Where it does not apply (`applies`), and for any other failure (the trainer's), the
step fails as before and the job restarts from the newest checkpoint (launch/
recovery.py): with the DynaRL scheduler (its moves hold ranks of their own: parked,
lent, joining), partial or overlapped steps (groups carried across steps), the
agentic workflow (its episode driver routes turns to ranks). In `dynarl sim` (the
inproc launcher, emulated engines: `--fail`) a replacement also costs an engine's
start on its devices (engine_costs.move_costs' restart_s), as a process does.
"""
from __future__ import annotations

import asyncio
import os
from typing import Any, Callable

from dynarl.components import engine_costs
from dynarl.components.experience import PromptGroup
from dynarl.components.inference.worker import InferenceWorker
from dynarl.components.workflows.joins import StepRanks
from dynarl.core.health import LOSS_WAIT_S, seen_lost
from dynarl.core.worker_handle import WorkerHandle
from dynarl.transport.custody import Custody

INPUT = {"rollout": "prompts", "reward": "rollouts", "inference": "scored"}
"""Each surviving stage's input channel (custody); its output releases it."""
OUTPUT = {"rollout": "rollouts", "reward": "scored", "inference": "experience"}
JUDGED_INPUT = INPUT | {"judge": "rewarded"}
JUDGED_OUTPUT = OUTPUT | {"reward": "rewarded", "judge": "scored"}
"""With an LLM judge (judge.enabled) between reward and inference (judge_stage.py)."""


def applies(cfg: Any) -> bool:
    """Whether a lost rollout, reward or inference rank is survived in place under `cfg`
    (else: a restart)."""
    return (cfg.run.survive and cfg.scheduler.policy == "static" and cfg.rollout.oversample == 1
            and cfg.algorithm.max_staleness == 0 and cfg.workflow in ("grpo", "ppo")
            and not cfg.algorithm.dynamic_sampling)


def group_ident(item: Any) -> int | None:
    """A prompt group's custody name on "prompts": its index in the step (END: none)."""
    return item.index if isinstance(item, PromptGroup) else None


class Survival:
    def __init__(self, wf: Any) -> None:
        self.wf = wf
        """The workflow (grpo.py GRPO): its controller, groups and progress."""
        judge = wf.cfg.judge.enabled
        self.input, self.output = (JUDGED_INPUT, JUDGED_OUTPUT) if judge else (INPUT, OUTPUT)
        """Each surviving stage's input channel, and the output whose puts release it."""
        if wf.inference_pass is None:  # no inference stage: the controller takes "scored" for the trainer
            self.input = {c: ch for c, ch in self.input.items() if c != "inference"}
        self.survived = 0
        """Ranks replaced in the step in progress."""
        self.reissued = 0
        """Items the lost ranks held, given to the others, in the step in progress."""
        self.loss_wait_s = max(LOSS_WAIT_S, wf.cfg.runtime.heartbeat_timeout_s + wf.cfg.runtime.heartbeat_interval_s)
        """How long a failure may take to show the loss behind it (a frozen rank: its heartbeat's timeout)."""
        self.replacing = asyncio.Lock()
        """One replacement at a time (their weight refits share a process group's name)."""
        self.start_s = engine_costs.move_costs(wf.cfg).restart_s * engine_costs.time_scale(wf.cfg)
        """What a replacement's start costs beyond its calls: on emulated devices an
        engine's restart (the cost model's), on real ones nothing (the spawn took it)."""

    def open(self) -> None:
        """Custody on each stage's input, released by its output's puts."""
        ctl = self.wf.ctl
        for component, inbox in self.input.items():
            channel = ctl.channel(inbox)
            channel.custody = Custody(group_ident)
            ctl.channel(self.output[component]).releases = channel

    def metrics(self) -> dict[str, int]:
        """The step's survivals (and resets the count for the next step)."""
        out = {"survived": self.survived, "reissued_items": self.reissued}
        self.survived = self.reissued = 0
        return out

    async def replace_lost(self, version: int | None) -> None:
        """Ranks lost since the last call are replaced: before a step's prompts flow (a
        rollout or inference replacement loads weights `version` from the trainer), or
        before a weight sync (None: the sync gives them their weights)."""
        for component in self.input:
            group = getattr(self.wf.g, component)
            for handle in [] if group is None else [h for h in group.handles if h.lost is not None]:
                await self._replace(component, handle, version, locked=False)

    async def lost_receiver(self) -> bool:
        """Whether a rollout or inference rank is lost (waiting a moment for a loss behind
        a failed weight sync to be seen)."""
        ranks = [h for group in self.wf.policy_groups() for h in group.handles]
        return bool(await seen_lost(ranks, self.loss_wait_s))

    async def refit(self, version: int) -> None:
        """After a weight sync a receiver was lost in: the lost ranks are replaced, and
        every rollout and inference rank that does not hold `version` yet (a replacement,
        or one the broken broadcast left short) loads it from the trainer, one group at a
        time (StepRanks.load_weights: a process group of their own)."""
        await self.replace_lost(None)
        for group in self.wf.policy_groups():
            await StepRanks(self.wf).load_weights(group, list(range(group.world_size)), version)

    def stage_call(self, component: str, locked: bool) -> Any:
        """The stage's call of `component`'s ranks (stages.stage's `ranks_call`);
        `locked`: the stage holds the group's device lock."""
        async def call(method: Callable[..., Any], get: str, put: str, **kwargs: Any) -> list[Any]:
            return await self._call(component, locked, method, get, put, kwargs)
        return call

    async def _call(self, component: str, locked: bool, method: Callable[..., Any], get: str, put: str,
                    kwargs: dict[str, Any]) -> list[Any]:
        """The per-rank results in the group's rank order; a rank lost meanwhile is
        replaced and its replacement's result stands in for it. Any other failure cancels
        the others' calls and is raised."""
        group, custody = getattr(self.wf.g, component), self.wf.ctl.channel(get).custody
        running: dict[asyncio.Future, WorkerHandle] = {
            asyncio.ensure_future(h.call(method, get, put, **kwargs)): h for h in group.handles}
        results: dict[int, Any] = {}
        fresh: list[WorkerHandle] = []
        try:
            while running:
                done, _ = await asyncio.wait(list(running), return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    handle = running.pop(task)
                    error = task.exception()
                    if error is None:
                        results[id(handle)] = task.result()
                        left = custody.forget(handle.spec.worker_id)  # its END: all else it took is downstream
                        if left:
                            raise RuntimeError(f"{handle.name} ended its {method.__name__} holding {len(left)} "
                                               f"items of {get!r} it delivered nothing of")
                        continue
                    if not await seen_lost([handle], self.loss_wait_s):
                        raise error
                    new = await self._replace(component, handle, kwargs.get("version"), locked=locked)
                    fresh.append(new)
                    running[asyncio.ensure_future(new.call(method, get, put, **kwargs))] = new
        except BaseException:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            raise
        fresh = [h for h in fresh if h in group.handles]  # (a replacement lost in turn is gone)
        if fresh and locked:  # (the stage's lock offloads only the ranks that took it)
            await group.on([group.handles.index(h) for h in fresh]).call(group.cls.offload)
        return [results[id(h)] for h in group.handles]

    async def _replace(self, component: str, lost: WorkerHandle, version: int | None, *,
                       locked: bool) -> WorkerHandle:
        """A fresh rank on the lost one's devices, after what it held went back to the
        others; ready to serve weights `version` (`locked`: inside the stage's device
        lock, so onloaded as the others are). The lost rank leaves the group last: if
        the replacement fails, the loss is still there for the restart (launch/
        recovery.py looks for it)."""
        async with self.replacing:
            ctl, group = self.wf.ctl, getattr(self.wf.g, component)
            loop = asyncio.get_running_loop()
            begun = loop.time()
            worker = lost.spec.worker_id
            for channel in list(ctl.channels.values()):  # its waiting gets end: nothing more is handed to it
                channel.abandon(worker)
            items = ctl.channel(self.input[component]).reclaim(worker)
            devices, init = list(lost.spec.devices), dict(lost.spec.init_kwargs)
            await ctl.grow_group(group, devices, init)
            await asyncio.sleep(self.start_s)  # (emulated devices: a new engine's start; real ones took it)
            new = group.handles[-1]
            position = group.handles.index(new)
            if locked:
                await group.on([position]).call(group.cls.onload)
            if version is not None and component in ("rollout", "inference"):
                await StepRanks(self.wf).load_weights(group, [position], version)
                new.weight_version = version
            if component == "inference" and self.wf.cfg.with_ref and self.wf.run_dir is not None:
                reference = os.path.join(self.wf.run_dir, "reference")
                await group.on([position]).call(InferenceWorker.load_reference, reference)
            await ctl.shrink_group(group, [group.handles.index(lost)])  # the lost process reaped
            self.survived += 1
            self.reissued += items
            self.wf.progress.note(f"{component} rank {lost.name} lost ({lost.lost}): the {items} items it held "
                                  f"went back to the others; replaced on devices {devices} in "
                                  f"{loop.time() - begun:.1f} s")
            return new
