"""The LLM judge inside a GRPO (or PPO) job: its group, its stage and its metrics.

    rollout "rollouts" -> reward "rewarded" -> judge "scored" -> inference ...

The judge is a component like the others: a worker group spawned on `judge.devices`
(in graph.json, its stage in the timeline and the trace), whose stage holds its
devices with device_lock. On devices the placement's components hold too it
time-shares them: its stage asks for the lock right after the rollout's and before
inference's, so it runs when the rollout frees them; on devices of its own it judges
each chunk as the reward stage passes it on. The dynarl scheduler (policy dynarl) does
not move the judge's devices: they must lie outside the placement, where no move
reaches (checked at load: judge_checks.py).
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Sequence

from dynarl.components.reward.judge_worker import JudgeStats, JudgeWorker
from dynarl.components.workflows.judge_checks import judge_model
from dynarl.components.workflows.live import joined
from dynarl.components.workflows.stages import stage
from dynarl.core.worker_group import WorkerGroup, gather_or_cancel

if TYPE_CHECKING:
    from dynarl.components.workflows.grpo import GRPO


async def spawn_judge(job: "GRPO") -> WorkerGroup | None:
    """The judge's group, one rank per judge device (None: no judge). A rank on a device
    of the placement frees its engine's cache whenever it does not hold the device."""
    cfg = job.cfg
    if not cfg.judge.enabled:
        return None
    shared = any(d < job.placement.num_devices for d in cfg.judge.devices)
    return await job.ctl.spawn(job.judge_worker, name="judge", devices=list(cfg.judge.devices), init={
        "judge": cfg.judge, "model": judge_model(cfg), "policy": cfg.model, "engine": cfg.trainer.engine,
        "shares_device": shared})


def judged(job: "GRPO", reward: asyncio.Future, label: str) -> asyncio.Future:
    """The judge's stage after the reward stage (which puts on "rewarded"); returns what
    stands for the reward stage from here: done when both are, with the reward's
    per-rank results. The judge's own go to job.judged[label] (judge_metrics). Call it
    before inference's stage starts: the device locks are taken in that order."""
    # wrapped as the rollout's and inference's stages are (live.joined), so that its device
    # lock is asked for in the same turn of the loop as theirs, between them: FIFO locks then
    # give shared devices to the rollout, the judge and inference in that order
    judge = asyncio.ensure_future(joined(stage(job.ctl, job.g.judge, JudgeWorker.score, get="rewarded", put="scored",
                                               after=reward, clock=job.clock, label=label,
                                               ranks_call=job.ranks_call("judge", True)), []))

    async def both() -> Any:
        rewarded, judgments = await gather_or_cancel([reward, judge])
        job.judged[label] = judgments
        return rewarded
    return asyncio.ensure_future(both())


def judge_metrics(stats: Sequence[JudgeStats], seconds: float) -> dict[str, Any]:
    """The step's judge figures for metrics.jsonl (its ranks' stats summed)."""
    n = sum(s.samples for s in stats)
    return {"judge_samples": n, "judge_unparseable": sum(s.unparseable for s in stats),
            "judge_too_long": sum(s.too_long for s in stats),
            "judge_score_mean": sum(s.score_sum for s in stats) / n if n else None,
            "reward_before_judge_mean": sum(s.reward_before_sum for s in stats) / n if n else None,
            "judge_tokens": sum(s.tokens for s in stats), "judge_s": seconds,
            "judge_example": next((s.example for s in stats if s.example), "")}
