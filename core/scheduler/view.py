"""The scheduler's view of a step in progress, from what the components report:
pure functions that turn the rollout engines' and the stages' reports (as the
managers last polled them into the hypergraph) into the remaining work, the
donor's floor and its signal that `decide_dynarl` reads. No oracle lengths: what
is not yet generated is estimated.

    rollout    remaining output tokens: each running request makes as many again as
               it made so far, at least the mean of those finished this step, never
               past the cap on its output (tokens_left); its floor (keep_engines):
               the engines its active KV needs at the step's peak fill (rollout_demand)
    inference, remaining sequence tokens: the finished samples' known lengths it has not
    trainer    processed, plus the running and unstarted requests at their estimated
               lengths (downstream_tokens_left); multi-turn: samples left x mean length
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from dynarl.core.scheduler.report import RankReport


@dataclass(frozen=True, slots=True)
class StepWork:
    """What a step has to produce, known when it begins."""
    samples: int
    prompt_mean: float
    """Prompt tokens per sample, on average."""
    cap: int | None
    """The cap on a request's output tokens (max_new_tokens); None: not capped or not
    known (multi-turn turns, a trace's own lengths)."""
    multi_turn: bool = False
    """A finished request is a turn, not a sample (the agentic workflow)."""


@dataclass(frozen=True, slots=True)
class RolloutProgress:
    """The rollout engines' last reports this step, summed (released engines keep
    what they had finished)."""
    active: int = 0
    """Requests running or waiting."""
    generated: int = 0
    """Output tokens the active requests made so far."""
    kv_tokens: int = 0
    capacity: int = 0
    """KV capacity of one engine, in tokens."""
    finished: int = 0
    finished_tokens: int = 0
    step_s: float = 0.0
    """The engines' mean engine step so far this step (0: none reported)."""

    @property
    def made(self) -> float:
        """Mean output tokens an active request made so far."""
        return self.generated / self.active if self.active else 0.0

    @property
    def finished_mean(self) -> float:
        return self.finished_tokens / self.finished if self.finished else 0.0


def rollout_progress(reports: Sequence[RankReport], finished: Mapping[str, tuple[int, int]]) -> RolloutProgress:
    """From the current engines' reports and every engine's (finished, finished_tokens)
    this step (the released ones' as of their last report)."""
    return RolloutProgress(
        active=sum(r.running + r.waiting for r in reports), generated=sum(r.generated for r in reports),
        kv_tokens=sum(r.kv for r in reports), capacity=reports[0].capacity if reports else 0,
        finished=sum(n for n, _ in finished.values()), finished_tokens=sum(t for _, t in finished.values()),
        step_s=_mean([r.step_s for r in reports if r.step_s]))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def tokens_left(made: float, finished_mean: float, cap: float | None) -> float:
    """Output tokens a running request that has made `made` is expected to make still:
    as many again, and at least the mean length of the requests finished this step,
    but never past the cap on its output (a capped distribution's stragglers mostly
    run to the cap)."""
    left = max(made, finished_mean)
    if cap is not None:
        left = min(left, max(0.0, cap - made))
    return left


def rollout_tokens_left(p: RolloutProgress, cap: int | None) -> float:
    """The rollout's remaining work: tokens_left for each of its active requests."""
    return p.active * tokens_left(p.made, p.finished_mean, cap)


def sequence_mean(work: StepWork, p: RolloutProgress) -> float:
    """A sample's expected sequence length: its prompt and the longer of the active
    requests' output so far and the finished mean."""
    return work.prompt_mean + max(p.made, p.finished_mean)


def downstream_tokens_left(*, samples: int, prompt_mean: float, finished: int, finished_tokens: float,
                           active: int, made: float, finished_mean: float, cap: int | None,
                           processed: float) -> float:
    """Sequence tokens a downstream component (inference, trainer) still has to process:
    the finished samples' known lengths it has not processed, plus the running requests
    (prompt, made so far, tokens_left) and the unstarted ones (prompt and the finished
    mean). Counting every unprocessed sample at the running requests' mean length
    instead overstated it 2.5x at math-7b/64's first move: in the tail the running
    requests are the long ones."""
    produced = finished_tokens + finished * prompt_mean
    running = prompt_mean + made + tokens_left(made, finished_mean, cap)
    unstarted = prompt_mean + (finished_mean or made)
    future = active * running + max(0, samples - finished - active) * unstarted
    return max(0.0, produced - processed) + future


def stage_tokens_left(work: StepWork, p: RolloutProgress, processed_tokens: float, processed_samples: int) -> float:
    """A downstream stage's remaining work this step, from what it processed so far."""
    if work.multi_turn:  # a finished request is a turn: count samples left at the mean length
        return max(0, work.samples - processed_samples) * sequence_mean(work, p)
    return downstream_tokens_left(samples=work.samples, prompt_mean=work.prompt_mean, finished=p.finished,
                                  finished_tokens=p.finished_tokens, active=p.active, made=p.made,
                                  finished_mean=p.finished_mean, cap=work.cap, processed=processed_tokens)


def rollout_demand(p: RolloutProgress, peaks: Mapping[str, float], pack: float = 1.0) -> int:
    """Engines the active requests need, the donor's floor (keep_engines): enough that
    their KV fits at `pack` times the engines' mean peak utilization this step (at most
    90%), the fill they decoded at in the bulk phase. (A floor of one engine per
    request would let rollout shrink only once fewer requests than engines remain,
    i.e. not before the last few dozen of 8192 requests.)"""
    if not p.active:
        return 0
    peak = sum(peaks.values()) / len(peaks) if peaks else 0.0
    fill = min(0.9, pack * peak)
    if fill <= 0 or not p.capacity:
        return p.active
    return max(1, min(p.active, math.ceil(p.kv_tokens / (fill * p.capacity))))


def rollout_done(p: RolloutProgress, prompts_queued: int) -> bool:
    """The rollout has finished the step's batch: prompts drained, nothing active, and
    requests finished on its engines (an idle engine at the very start has none)."""
    return p.active == 0 and p.finished_mean > 0 and prompts_queued == 0


def packable_since(engines: int, demand: int, theta: float, now: float, since: float | None) -> float | None:
    """dynarl-consolidate's donor signal: since when the active KV, packed at the
    consolidating fill, has fit on at most (1 - theta) of the engines (None: it does not)."""
    if engines > 1 and demand <= (1 - theta) * engines:
        return now if since is None else since
    return None
