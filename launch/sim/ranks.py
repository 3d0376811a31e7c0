"""What the simulator's Migrator (migrate.py) moves and through what: devices per
component over time (Ownership, the run's timeline), and the workflow's workers as
a migration talks to them (WorkflowRanks: their metrics, the step's stage gates,
the weight-sync group, the stage call of a rank that joins a running step)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dynarl.components.placement.plan import COMPONENTS
from dynarl.core.worker_group import gather_or_cancel

from .scenario import nic_or_link


@dataclass(slots=True)
class Ownership:
    """Devices per component over time, as change events."""
    events: list[tuple[float, dict[str, int]]] = field(default_factory=list)

    @property
    def current(self) -> dict[str, int]:
        return dict(self.events[-1][1])

    def change(self, t: float, **delta: int) -> None:
        alloc = self.current
        for c, d in delta.items():
            alloc[c] += d
        self.events.append((t, alloc))

    def spans(self, start: float, end: float) -> list[tuple[str, int, float, float]]:
        out = []
        points = [e for e in self.events if e[0] < end]
        for i, (t, alloc) in enumerate(points):
            s = max(t, start)
            e = points[i + 1][0] if i + 1 < len(points) else end
            if e <= s:
                continue
            out.extend((c, alloc[c], s, e) for c in COMPONENTS if alloc[c] > 0)
        return out


class WorkflowRanks:
    """How the Migrator talks to the GRPO workflow's workers (components/*/worker.py,
    on emulated engines): their metrics, the stage gates of live.py for lending, the
    weight-sync group for a new rank's weights."""
    load_method, utilization, progress_method = "metrics", "kv_utilization", "metrics"

    def __init__(self, wf) -> None:
        self.wf = wf

    def pool_init(self, group) -> dict:
        """A parked or grown rank of `group`'s component: the workflow's own init for it
        (base TP, whatever engines run now), on devices of its own."""
        init = dict(self.wf.worker_inits()[group.name], shares_device=False)
        if group.name == "rollout":  # off the trainer's segment: weights come over a NIC
            init["backend_config"] = dict(init["backend_config"], weight_sync_bandwidth=nic_or_link(
                False, self.wf.cfg.rollout.emulated.device))
        return init

    def wide_init(self, group, tp: int) -> dict:
        """A rollout rank's init at tensor-parallel size `tp` (tail_tp.py's wider engines)."""
        init = self.pool_init(group)
        init["backend_config"] = dict(init["backend_config"], tp=tp)
        return init

    async def joining(self, component: str, position: int, version: int) -> Any:
        return await self.wf.joining(component, position, version)

    async def joined(self, component: str, ranks: list[str]) -> None:
        await self.wf.joined(component, ranks)

    async def releasing(self, g, positions: list[int]) -> None:
        """The workflow stops routing work to the rollout ranks about to leave."""
        await self.wf.releasing("rollout", [g.rollout.handles[p].spec.worker_id for p in positions])

    async def park(self, g, live) -> None:
        for component in ("inference", "trainer"):
            live.gate(component)

    async def unpark(self, g, live) -> None:
        for component in ("inference", "trainer"):
            gate = live.gates.get(component)
            if gate is not None and not gate.done():
                gate.set_result(None)

    async def load_weights(self, g, group, ranks: list[int], version: int) -> None:
        """The ranks that do not hold `version` yet receive it (a parked rank may have)."""
        held = await group.call("weight_version", ranks=ranks)
        ranks = [p for p, v in zip(ranks, held) if v != version]
        if not ranks:
            return
        await self.wf.weight_sync_group()
        await gather_or_cancel([g.trainer.call("send_weights", "weight_sync", version, ranks=[0]),
                                group.call("receive_weights", "weight_sync", version, ranks=ranks)])

    async def start(self, group, ranks: list[int]) -> None:
        await group.call("start", None, ranks=ranks)

    def stage_call(self, group, component: str, p: int, version: int) -> Any:
        if component == "trainer":
            return _first(group.call("train_stream", "experience", None, with_ref=self.wf.cfg.with_ref, ranks=[p]))
        return _first(group.call("compute_logprobs", "scored", "experience", version=version, split=True, ranks=[p]))


async def _first(call):
    return (await call)[0]
