"""An online policy (dynarl and its variants) inside each step of the workflow: the
StepHooks (components/workflows/live.py) the simulator plugs into GRPO.step."""
from __future__ import annotations

import asyncio

from dynarl.components.placement.plan import Placement
from dynarl.components.placement.policy import Migrate
from dynarl.components.workflows.grpo import GRPO
from dynarl.components.workflows.live import LiveStep
from dynarl.core.controller import Controller
from dynarl.core.worker_group import gather_or_cancel

from .migrate import Migrator
from .records import PolicyRun, timed
from .scenario import Scenario
from .snapshot import build_snapshot


class OnlineHooks:
    """An online policy (dynarl and its variants) inside each GRPO step (StepHooks,
    components/workflows/live.py): before it, back to the start placement (the
    Migrator's restore; at the first, lending the parked components' devices to the
    rollout); beside it, decide() every decide_every_s and each Migrate executed at
    once, and the lent devices handed back once the rollout is done at the latest."""

    def __init__(self, ctl: Controller, scn: Scenario, wf: GRPO, policy, run: PolicyRun, placement: Placement,
                 now, migrator: Migrator) -> None:
        self.ctl, self.scn, self.wf, self.policy, self.run = ctl, scn, wf, policy, run
        self.placement, self.now, self.migrator = placement, now, migrator
        self.borrowed = False

    async def before_step(self, live: LiveStep) -> None:
        m, g = self.migrator, self.wf.g
        if live.version > 0:
            await m.restore(g, live.version, live)  # paid by this iteration: its window began at the last end
        elif m.borrow:
            await asyncio.sleep(await m.lend(g, live.version, live) * self.scn.config.time_scale)
        self.borrowed = bool(m.lent)
        live.rollout_lock = not self.borrowed

    async def during_step(self, live: LiveStep) -> None:
        await gather_or_cancel([asyncio.ensure_future(self._ticker(live)),
                                asyncio.ensure_future(self._home_after_rollout(live))])

    def sync_lock(self) -> asyncio.Lock:
        return self.migrator.lock

    async def _home_after_rollout(self, live: LiveStep) -> None:
        """Devices the rollout borrowed go back to inference and trainer once it is done at
        the latest (without this, a policy that never migrates would leave them parked)."""
        if not self.borrowed:
            return
        await asyncio.wait([live.done["rollout"]])
        await self.migrator.return_home(self.wf.g, live)

    async def _ticker(self, live: LiveStep) -> None:
        """decide() every decide_every_s during the step; Migrate decisions are executed
        at once (migrate.py), while the step goes on."""
        while True:
            await asyncio.sleep(self.policy.decide_every_s * self.scn.config.time_scale)
            snapshot = await build_snapshot(self.ctl, self.wf.g, live.version, self.placement, self.now, self.scn,
                                            live, self.migrator)
            for decision in timed(self.policy, snapshot, self.run):
                if not isinstance(decision, Migrate):
                    raise ValueError(f"{type(decision).__name__} during an iteration: only Migrate is executed there")
                await self.migrator.execute(self.wf.g, decision, live)
