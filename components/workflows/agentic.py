"""Agentic GRPO: multi-turn, tool-using episodes, trained as whole episodes.

One step:

    every sample of the step's prompt groups is an episode (episodes.py):
        rollout  turn after turn, each routed to a rank ("turns", keyed by rank);
                 a follow-up turn prefers the rank holding its prefix, and the
                 ranks' queues order turns by (tool_count, cached_prefix) or FIFO
        tools    a call's observation is appended to the context, masked out of the loss
    reward     a finished group is scored (exact answer, partial credit) -> "scored"
    inference  "scored" -> "experience"   old (and reference) log-probs
    trainer    one GRPO step over whole episodes, observation tokens masked (response_mask 0)
    weight sync

Everything else is the GRPO job's: warm start, ledger (every episode trained
exactly once), checkpoints and resume, metrics.jsonl, placement and device locks.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from typing import Any

from dynarl.components import experience
from dynarl.components.costmodel import get_model
from dynarl.components.experience import END, PromptGroup, Sample
from dynarl.components.model.spec import safe_decode
from dynarl.components.rollout.turn import TurnRequest
from dynarl.components.stage_results import RewardStats, RolloutStats
from dynarl.components.tasks.calc import calc_score, demonstration, is_direct
from dynarl.components.tasks.tool_syntax import CLOSE
from dynarl.components.tools.outcome import ToolResult
from dynarl.components.tools.worker import TOOL_OFF, ToolWorker
from dynarl.components.trainer.advantages import group_advantages_for
from dynarl.components.trainer.base import TrainBatch
from dynarl.components.workflows.agentic_rollout import AgenticRolloutWorker
from dynarl.components.workflows.episodes import (Episode, EpisodeDriver, EpisodeState, Limits, ReactTurns,
                                                  ScriptedTurns)
from dynarl.components.workflows.turns import Turns
from dynarl.components.workflows.grpo import GRPO
from dynarl.components.workflows.job import Groups
from dynarl.components.workflows.joins import StepRanks
from dynarl.components.workflows.live import LiveStep
from dynarl.components.workflows.stages import held
from dynarl.core.worker_group import WorkerGroup

TURNS, TURN_RESULTS = "turns", "turn_results"
log = logging.getLogger(__name__)


class AgenticStepRanks(StepRanks):
    """Rollout ranks leave and join the episode driver: it routes each next turn."""

    async def releasing(self, component: str, ranks: list[str], parked: bool = False) -> None:
        """Rollout ranks (worker ids) are about to be released by a migration: the
        driver routes nothing more to them, and each gets its END behind its turns.
        With rollout.move_kv, ranks that are parked (their processes stay to serve the
        offer) first offer the KV of the contexts whose next turn will go elsewhere
        (episodes between turns whose last turn they served)."""
        driver = self.wf.driver
        if component != "rollout" or driver is None:
            return
        driver.stop_routing(ranks)  # no turn goes to them while they offer
        if self.wf.cfg.rollout.move_kv and parked and not driver.closing:  # (closing: next turns on new weights)
            for handle in self.wf.g.rollout.handles:
                key = handle.spec.worker_id
                episodes = driver.between_turns(key) if key in ranks else []
                if not episodes:
                    continue
                turns = [[f"{ep.id}#{ep.turns}", ep.context[:ep.computed]] for ep in episodes]
                try:
                    offers = await handle.call(AgenticRolloutWorker.offer_prefixes, turns)
                except Exception as exc:  # not needed for correctness: those turns are prefilled again
                    log.warning("rollout rank %s could not offer its episodes' KV: %r", key, exc)
                    continue
                for ep, (turn_id, _), offer in zip(episodes, turns, offers):
                    driver.carry(ep, turn_id, offer, handle.spec.node, key)
        await driver.leave(ranks)

    def stage_call(self, component: str, position: int, version: int) -> Any:
        """A rollout rank joins the running step: the driver routes to it from now on,
        and it serves turns until the driver's close."""
        if component != "rollout":
            return super().stage_call(component, position, version)

        async def call() -> Any:
            if self.wf.driver is None:
                raise ValueError("no agentic step is running for a rollout rank to join")
            key = self.wf.g.rollout.handles[position].spec.worker_id
            await self.wf.driver.join([key])
            results = await self.wf.g.rollout.on([position]).call(
                AgenticRolloutWorker.serve_turns, TURNS, TURN_RESULTS, key, version, self.wf.sampling())
            return results[0]
        return call()

    async def joined(self, component: str, ranks: list[str]) -> None:
        """Nothing: the driver ends every rank in the run once the episodes are over."""


class AgenticGRPO(GRPO):
    rollout_worker = AgenticRolloutWorker
    reward_worker = None  # episodes are scored here, as each group ends (episode_reward)
    multi_turn = True
    step_ranks = AgenticStepRanks

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tools: WorkerGroup | None = None
        self.driver: EpisodeDriver | None = None
        """The step's episode driver (its counters feed the step's metrics)."""
        self.unfinished: asyncio.Future | None = None
        """Partial rollout: the groups whose episodes the step's close left unfinished
        (set once every episode is over or waits for a later step)."""
        a = self.cfg.agentic
        self.scripted = a.episodes == "scripted"
        if not self.scripted:
            self.limits = Limits(max_turns=a.max_turns, max_new_tokens=self.cfg.rollout.max_new_tokens,
                                 max_context=self.cfg.model.config().max_position_embeddings,
                                 max_observation_chars=a.max_observation_chars)
            self.close_id = self.tokenizer.encode(CLOSE)[0]

    async def spawn(self) -> Groups:
        groups = await super().spawn()
        a = self.cfg.agentic
        if not self.scripted:  # scripted tools are latencies, off every device
            self.tools = await self.ctl.spawn(ToolWorker, name="tools", devices=[0], init={
                "config": {"timeout_s": a.python_timeout_s, "cpu_s": max(1, int(a.python_timeout_s)),
                           "max_concurrency": 4}, "python": "py" in a.tools})
        self.ctl.graph.observe_affinity(TURNS, None if a.affinity == "none" else a.affinity)
        return groups

    def rollout_init(self) -> dict[str, Any]:
        return {"queue": self.cfg.agentic.queue, "max_bonus_s": self.cfg.agentic.max_bonus_s}

    # --- the algorithm ---------------------------------------------------------------
    async def step(self, step: int) -> dict[str, Any]:
        metrics = await super().step(step)
        stats = self.stage_stats  # (with overlapped steps: those that made the trained episodes)
        return metrics | episode_metrics(stats.episodes, stats.rollout)

    def train_batch(self, scored: list[PromptGroup], behaviour: bool = False) -> TrainBatch:
        return episode_batch(scored, self.cfg.with_ref, behaviour)

    async def start_rollout(self, groups: list[PromptGroup], step: int, label: str, live: LiveStep, *,
                            version: int | None = None) -> tuple[asyncio.Future, asyncio.Future]:
        """The rollout stage serves turns on every rank (with the weights of `version`,
        default `step`'s); beside it the episodes play (the driver routes their turns,
        runs their tools, scores each finished group onto "scored"): that is the step's
        reward stage, ending when every episode has, with the episodes' counts."""
        g = self.g
        keys = [h.spec.worker_id for h in g.rollout.handles]
        self.driver = driver = self.make_driver(keys, groups)
        self.unfinished = asyncio.get_running_loop().create_future()
        version = step if version is None else version
        rollout: Any = held(self.ctl, g.rollout, self.clock, label, "serve_turns",
                            lambda: g.rollout.scatter(AgenticRolloutWorker.serve_turns, [
                                [TURNS, TURN_RESULTS, key, version, self.sampling()] for key in keys]),
                            lock=live.rollout_lock)
        rollout = live.joined("rollout", rollout)
        reward = live.done["reward"] = asyncio.ensure_future(self.play(groups, driver, self.unfinished))
        return rollout, reward

    def make_driver(self, keys: list[str], groups: list[PromptGroup]) -> EpisodeDriver:
        a, ctl = self.cfg.agentic, self.ctl

        async def submit(key: str, turn: TurnRequest) -> None:
            await ctl.channel(TURNS).put(turn, key=key)

        async def end(key: str) -> None:
            await ctl.channel(TURNS).put(END, key=key)

        r = self.cfg.rollout
        engine = r.emulated if r.backend == "emulated" else r.engine
        return EpisodeDriver(self.episode_turns(groups), keys, submit, affinity=a.affinity, end=end,
                             capacity=engine.max_num_seqs)

    def episode_turns(self, groups: list[PromptGroup]) -> Turns:
        """What each turn of the step's episodes leads to (turns.py)."""
        if self.scripted:
            scripts = {s.id: s.turns for group in groups for s in group.samples}
            e = self.cfg.rollout.emulated
            return ScriptedTurns(scripts, get_model(e.model).vocab_size, e.time_scale)
        a = self.cfg.agentic

        async def call_tool(tool: str, argument: str) -> ToolResult:
            if tool not in a.tools:
                return ToolResult(ok=False, stdout="", error=TOOL_OFF.format(tool), rejected=True)
            if tool == "py":
                return (await self.tools.call(ToolWorker.python, argument, a.python_timeout_s))[0]
            return (await self.tools.call(ToolWorker.calculator, argument))[0]
        return ReactTurns(self.tokenizer, self.limits, call_tool, close_id=self.close_id,
                          decode=functools.partial(safe_decode, self.tokenizer))

    async def play(self, groups: list[PromptGroup], driver: EpisodeDriver,
                   unfinished_out: asyncio.Future | None = None) -> list[RewardStats]:
        """Runs every episode (a partial rollout's carried ones from where they were); a
        group goes to "scored", with its advantages, as soon as its last episode ends.
        With partial rollout the step's close (close_rollout) may leave episodes
        unfinished: their samples keep them for a later step, and their groups are
        `unfinished_out`'s result. Returns the reward stage's result (one, here)."""
        episodes, where = [], {}
        left = {group.index: 0 for group in groups}
        for group in groups:
            for k, sample in enumerate(group.samples):
                if sample.finish:  # partial rollout: over in an earlier step
                    continue
                episodes.append(episode_of(sample, group))
                where[sample.id] = (group, k)
                left[group.index] += 1
        scored = self.ctl.channel("scored")
        verifier = "none" if self.scripted else "calc"
        engine = self.cfg.trainer.engine

        async def on_done(ep: Episode) -> None:
            group, k = where[ep.id]
            fill_sample(group.samples[k], ep, group.answer, scored=not self.scripted)
            left[group.index] -= 1
            if left[group.index] == 0:
                rewards, lengths = [s.reward for s in group.samples], [len(s.output_ids) for s in group.samples]
                for s, adv in zip(group.samples, group_advantages_for(engine, rewards, lengths)):
                    s.advantage = adv
                await scored.put([group], weight=1)

        try:
            await driver.run(episodes, self.ctl.channel(TURN_RESULTS).get, on_done)
            await driver.close()
            unfinished = {}
            for ep in driver.live.values():  # (partial rollout) waiting for a later step
                group, k = where[ep.id]
                keep_unfinished(group.samples[k], ep)
                unfinished[group.index] = group
            if unfinished_out is not None:
                unfinished_out.set_result(list(unfinished.values()))
        except BaseException as exc:
            if unfinished_out is not None and not unfinished_out.done():
                unfinished_out.set_exception(exc)
                unfinished_out.exception()  # (retrieved: a close that never came does not log it)
            raise
        return [RewardStats(verifier=verifier, episodes=driver_metrics(driver))]

    async def close_rollout(self, step: int, carried: list[PromptGroup]) -> int:
        """Partial rollout: the step has its batch. No more turns are routed, every rank
        hands back the turns it holds (their tokens so far kept), and once the turns
        and tool calls under way are in, every episode not over waits in its sample for
        a later step; their groups go to `carried`. Returns how many."""
        await self.driver.stop()
        async with self.busy("rollout"):
            per_rank = await self.g.rollout.call(AgenticRolloutWorker.partial_close)
        self.driver.cut([item for items in per_rank for item in items])
        groups = await self.unfinished
        carried += groups
        return len(groups)

    def sampling(self) -> dict[str, Any]:
        if self.scripted:
            return super().sampling()
        return super().sampling() | {"stop_token_ids": [self.tokenizer.eos_id, self.close_id]}

    def warmup_batch(self, index: int) -> TrainBatch:
        size = self.cfg.trainer.warmup.batch_size
        calc = self.cfg.task.calc
        return demonstration_batch(self.source.warmup_problems(index * size, size), self.tokenizer,
                                   self.cfg.agentic.max_observation_chars, calc.warmup_direct_frac,
                                   self.cfg.run.seed, calc.tool)

def demonstration_batch(problems: list, tokenizer: Any, max_observation_chars: int, direct_frac: float,
                        seed: int, tool: str = "calc") -> TrainBatch:
    """Supervised episodes for the warm start: imitate the model's turns (advantage 1),
    not the observations (mask 0), exactly as RL will see them; `direct_frac` of them
    answer without the tool (task.calc.warmup_direct_frac)."""
    ids, plens, masks = [], [], []
    for problem in problems:
        prompt = tokenizer.encode(problem.prompt, add_bos=True)
        response, mask = [], []
        direct = is_direct(problem, seed, direct_frac)
        for text, by_model in demonstration(problem, max_observation_chars, direct, tool):
            tokens = tokenizer.encode(text)
            response += tokens
            mask += [int(by_model)] * len(tokens)
        ids.append(prompt + response + [tokenizer.eos_id])
        plens.append(len(prompt))
        masks.append(mask + [1])
    return TrainBatch(input_ids=ids, prompt_lens=plens, response_mask=masks, advantages=[1.0] * len(ids))


def episode_reward(ep: Episode, answer: str) -> float:
    """An episode scores only if it ended with an answer."""
    return calc_score(ep.answer, answer) if ep.finish == "answer" else 0.0


def fill_sample(sample: Sample, ep: Episode, answer: str, scored: bool = True) -> None:
    """A finished episode's tokens, mask and reward go into its sample; `scored` False
    (scripted episodes: nothing to verify) rewards 0. Its version is the oldest weights
    that made a token of it (its segments kept when several did: partial rollout)."""
    sample.output_ids, sample.logprobs, sample.mask = ep.response, ep.logprobs, ep.mask
    sample.finish, sample.version = ep.finish, ep.oldest
    sample.segments = [list(x) for x in ep.segments] if len({v for _, _, v in ep.segments}) > 1 else None
    sample.episode = None
    sample.reward = episode_reward(ep, answer) if scored else 0.0


def keep_unfinished(sample: Sample, ep: Episode) -> None:
    """Partial rollout: an episode the step's close left unfinished waits in its sample:
    its tokens, mask, log-probs and segments (the pending turn's tokens as a segment past
    the response, so the sample's oldest version counts them), and its EpisodeState."""
    sample.output_ids, sample.logprobs, sample.mask, sample.finish = ep.response, ep.logprobs, ep.mask, ""
    sample.segments = [list(x) for x in ep.segments] + ep.pending_segments(len(ep.response))
    sample.episode = ep.state().to_wire()


def episode_of(sample: Sample, group: PromptGroup) -> Episode:
    """The sample's episode: a fresh one, or one a partial rollout carried (its state)."""
    if sample.episode is None:
        return Episode(sample.id, list(group.prompt_ids), sample.seed, group=group.index)
    response = list(sample.output_ids)
    segments = [x for x in sample.segments or () if x[1] <= len(response)]  # (not the pending turn's)
    return Episode.resume(sample.id, list(group.prompt_ids), sample.seed, group.index, response,
                          list(sample.mask or ()), list(sample.logprobs), segments,
                          EpisodeState.from_wire(sample.episode))


def episode_batch(groups: list[PromptGroup], with_ref: bool, behaviour: bool = False) -> TrainBatch:
    """experience.train_batch, plus each episode's response mask (observations 0),
    in the same canonical order (groups by index, samples in order)."""
    batch = experience.train_batch(groups, with_ref, behaviour)
    masks = [list(s.mask) for g in sorted(groups, key=lambda g: g.index) for s in g.samples]
    return dataclasses.replace(batch, response_mask=masks)


def driver_metrics(driver: EpisodeDriver) -> dict[str, Any]:
    """A run's episodes, as the driver counted them (JSON-safe: a checkpoint keeps those
    of episodes made ahead, overlap.py)."""
    done = driver.finished
    n = len(done)
    per = max(n, 1)  # (a partial step may end none)
    return {"episodes": n,
            "tool_calls": sum(e.tool_calls for e in done),
            "tool_calls_by_tool": dict(driver.calls_by_tool),
            "tool_call_rate": sum(e.tool_calls > 0 for e in done) / per,
            "malformed_calls": sum(e.malformed for e in done),
            "tool_errors": sum(e.tool_errors for e in done),
            "turns": driver.turns,
            "turns_mean": driver.turns / per,
            "answered_frac": sum(e.finish == "answer" for e in done) / per,
            "reprefill_tokens": driver.reprefill_tokens,
            "max_wait_s": driver.max_wait_s,
            "route_reasons": dict(driver.router.by_reason)}


def episode_metrics(episodes: dict[str, Any], rollout_stats: list[RolloutStats]) -> dict[str, Any]:
    """The step's episode metrics: the driver's counts (driver_metrics, in the reward
    stage's result) and the rollout ranks'."""
    return {**episodes, **rollout_sums(rollout_stats, "cached_tokens", *TURN_KV)}


TURN_KV = ("turn_kv_requests", "turn_kv_tokens", "turn_kv_s", "turn_kv_reprefilled")
"""Follow-up turns whose last rank left, with its KV of their context: moved in, or prefilled again."""


def rollout_sums(rollout_stats: list[RolloutStats], *names: str) -> dict[str, Any]:
    """These RolloutStats fields, summed over the ranks."""
    return {name: sum(getattr(r, name) for r in rollout_stats) for name in names}
