"""What a move asks of the running step (core/migration/step.py Joins; the workflow
gives it to its Mover): how
ranks leave it and join it. GRPO's step: released rollout ranks just leave (the
prompt channel is shared); a rank that joins a running stage gets ready (weights,
the reference, a fresh trainer) and runs the stage's call on its channels; a group
a P2P move replaced takes the old one's place. The agentic workflow's episode driver
routes turns, so its ranks join and leave the driver too (AgenticStepRanks)."""
from __future__ import annotations

import dataclasses
import os
from typing import Any

from dynarl.components.experience import END
from dynarl.components.inference.worker import InferenceWorker
from dynarl.components.roles import PolicyRank
from dynarl.components.rollout.worker import RolloutWorker
from dynarl.components.trainer.worker import TrainerWorker
from dynarl.core.roles import MigratableRank
from dynarl.core.worker_group import WorkerGroup, gather_or_cancel


class StepRanks:
    def __init__(self, wf: Any) -> None:
        self.wf = wf
        """The workflow (grpo.py GRPO): its controller, config, groups and sampling."""

    async def releasing(self, component: str, ranks: list[str], parked: bool = False) -> None:
        """A migration is about to release `ranks` (worker ids) of `component` (`parked`:
        their processes stay, in a standby pool; else they stop): nothing to do here
        (the prompt channel is shared); a workflow that routes work to ranks (the agentic
        one) stops routing to them."""

    async def ready_ranks(self, component: str, group: WorkerGroup, positions: list[int],
                          version: int | None) -> None:
        """Ranks that joined `component` (from a standby pool, or started) get ready for
        the running step: a rollout engine resumes (it was paused when it was parked);
        rollout and inference load weight version `version` (None: the weight sync that
        follows gives it); a streaming trainer rank starts (its state arrives as the
        engine's own P2P transfer)."""
        if component == "rollout":
            await group.on(positions).call(MigratableRank.workload_resume)
        if component == "trainer":
            await group.on(positions).call(TrainerWorker.start, None)
            return
        if version is not None:
            await self.load_weights(group, positions, version)
        if component == "inference" and self.wf.cfg.with_ref and self.wf.run_dir is not None:
            await group.on(positions).call(InferenceWorker.load_reference, os.path.join(self.wf.run_dir, "reference"))

    async def load_weights(self, group: WorkerGroup, positions: list[int], version: int) -> None:
        """The ranks that do not hold `version` yet receive it from the trainer, over a
        group of their own (a parked rank may hold it already)."""
        held = await group.on(positions).call(PolicyRank.weight_version)
        positions = [p for p, v in zip(positions, held) if v != version]
        if not positions:
            return
        name = "weight_load"
        await self.wf.ctl.process_group(name, [(self.wf.g.trainer, 0), *((group, p) for p in positions)])
        try:
            await gather_or_cancel([self.wf.g.trainer.on(self.wf.export_ranks).call(  # (TP: a collective export)
                TrainerWorker.send_weights, name, version),
                group.on(positions).call(PolicyRank.receive_weights, name, version)])
        finally:
            await self.wf.ctl.process_groups.destroy(name)

    def stage_call(self, component: str, position: int, version: int) -> Any:
        """The stage call of a rank that joins `component` while its stage runs, on the
        stage's channels; an awaitable of its result."""
        async def call() -> Any:
            group = getattr(self.wf.g, component)
            inbox = self.wf.live.INPUT.get(component)  # the step's own ("ahead" for a partial step's inference)
            if component == "rollout":
                results = await group.on([position]).call(
                    RolloutWorker.generate, inbox, "rollouts", version=version,
                    chunk_size=self.wf.rollout_chunk_size, sampling=self.wf.sampling())
            elif component == "inference":
                results = await group.on([position]).call(InferenceWorker.compute_logprobs, inbox, "experience",
                                                          version=version, split=self.wf.cfg.trainer.streaming)
            elif component == "trainer":
                results = await group.on([position]).call(TrainerWorker.train_stream, inbox, None,
                                                          with_ref=self.wf.cfg.with_ref,
                                                          behaviour=self.wf.behaviour)
            else:
                raise ValueError(f"no rank joins a running {component} stage")
            return results[0]
        return call()

    async def joined(self, component: str, ranks: list[str]) -> None:
        """The joined ranks (worker ids) have taken the work handed to them: each gets
        its END on the prompts (drained by then: the joined ranks get no prompt)."""
        for _ in ranks:
            await self.wf.ctl.channel("prompts").put(END)

    async def replaced(self, component: str, group: WorkerGroup) -> None:
        """A move replaced the component's group (a P2P reshard): the step goes on with it."""
        setattr(self.wf.g, component, group)

    def rank_init(self, component: str, tp: int | None = None) -> dict[str, Any]:
        """A new rank's constructor arguments: the component's first rank's, at
        tensor-parallel size `tp` where given (tail-TP's wider rollout engines)."""
        init = dict(getattr(self.wf.g, component).handles[0].spec.init_kwargs)
        if tp is not None:
            init["backend_config"] = dataclasses.replace(init["backend_config"], tp=tp)
        return init
