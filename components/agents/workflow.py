"""Agentic GRPO whose episodes an unmodified agent plays over the OpenAI API
(agentic.episodes agent). The job serves /v1/chat/completions and /v1/completions
(server.py) on its own loop; each episode's agent gets a client bound to its
session; every turn the agent asks for is routed to a rollout rank like any agentic
turn (affinity, (tool_count, cached_prefix) priority, KV and device moves apply);
the ids the engines produced are what is trained (sessions.py)."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import secrets
from collections import Counter
from typing import Any

from dynarl.components.agents.calc_agent import TOOLS
from dynarl.components.agents.chat_format import ChatFormat
from dynarl.components.agents.messages import ChatMessage, ToolCall, ToolSpec
from dynarl.components.agents.runner import (AgentSample, Sandbox, finish_group, load_agent, own_groups,
                                             play_episode)
from dynarl.components.agents.server import AgentServer
from dynarl.components.agents.sessions import Sessions
from dynarl.components.agents.tool_calls import call_text, parser_for
from dynarl.components.experience import PromptGroup
from dynarl.components.stage_results import RewardStats
from dynarl.components.tasks.calc import expression, is_direct
from dynarl.components.tasks.problem import stable_seed
from dynarl.components.trainer.base import TrainBatch
from dynarl.components.workflows.agentic import TURN_RESULTS, AgenticGRPO, driver_metrics
from dynarl.components.workflows.episode import Episode
from dynarl.components.workflows.episodes import EpisodeDriver
from dynarl.components.workflows.grpo import GRPO
from dynarl.components.workflows.turns import AgentTurns, Turns


log = logging.getLogger(__name__)
STOP_AGENTS_S = 30.0
"""How long a step's end waits for its cancelled agents."""

COUNTED = ("failures", "retries", "resent", "malformed_tool_calls", "diverged", "too_long", "turn_cap", "http_requests", "http_ok",
           "http_unauthorized", "http_too_large", "http_bad_json", "http_bad_request", "http_unknown_session",
           "http_busy", "http_failed")
"""The step's counts every metrics row has (agent_<name>): episodes whose agent failed,
tool-call text that did not parse, requests refused by reason; others appear once seen."""


class AgentGRPO(AgenticGRPO):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        a = self.cfg.agent
        self.agent = load_agent(a.function)
        self.parser = parser_for(getattr(self.tokenizer, "chat_template", None), a.tool_parser)
        self.fmt = ChatFormat(self.tokenizer, self.parser)
        self.sessions = Sessions(self.fmt, self.tokenizer, self.limits, self.cfg.rollout.temperature, self.parser,
                                 top_p=self.cfg.rollout.top_p, vocab_size=self.cfg.model.config().vocab_size)
        self.token = secrets.token_urlsafe(32)
        self.server = AgentServer(self.sessions, self.token, host=a.host, max_body_bytes=a.max_body_bytes)
        self.counted: Counter[str] = Counter()
        """The endpoint's and the sessions' counters at the last step's end."""

    async def run(self, resume: Any = None) -> None:
        await self.server.start()
        try:
            await super().run(resume)
        finally:
            await self.server.stop()

    def episode_turns(self, groups: list[PromptGroup]) -> Turns:
        return AgentTurns(self.sessions)

    def sampling(self) -> dict[str, Any]:
        return GRPO.sampling(self) | {"stop_token_ids": [self.fmt.end_id]}

    async def step(self, step: int) -> dict[str, Any]:
        metrics = await super().step(step)
        now = Counter(self.sessions.counters) + Counter({f"http_{k}": v for k, v in self.server.counters.items()})
        metrics.update({f"agent_{k}": now[k] - self.counted[k] for k in sorted(set(now) | set(COUNTED))})
        self.counted = now
        return metrics

    async def play(self, groups: list[PromptGroup], driver: EpisodeDriver,
                   unfinished_out: asyncio.Future | None = None) -> list[RewardStats]:
        """Every episode's agent runs beside the driver; a group goes to "scored" once its
        episodes are over (finish_group: the trained ids, masks, advantages)."""
        a, scored = self.cfg.agent, self.ctl.channel("scored")
        eps = self.cfg.trainer.engine.adv_eps
        retries = a.max_retries if a.on_failure == "retry" else 0
        sandbox = Sandbox(self.tools, self.cfg.agentic.python_timeout_s)
        slots: dict[int, list[Episode]] = {group.index: [] for group in groups}
        """Per group, the episode now playing each sample (a retry replaces a failed one)."""
        sessions, agents = [], []

        prompts = {group.index: self.tokenizer.decode(list(group.prompt_ids)) for group in groups}

        def start(group: PromptGroup, k: int, attempt: int) -> Episode:
            sample = group.samples[k]
            ep = Episode(sample.id if attempt == 0 else f"{sample.id}~{attempt}", [],
                         sample.seed if attempt == 0 else stable_seed(sample.seed, "retry", attempt), group=group.index)
            session = self.sessions.open(ep)
            sessions.append(session)
            if attempt == 0:
                slots[group.index].append(ep)
            else:
                slots[group.index][k] = ep

            def failed() -> None:  # (at once: the driver has not ended the failed episode yet)
                if attempt < retries:
                    self.sessions.counters["retries"] += 1
                    driver.add(start(group, k, attempt + 1))
            agents.append(asyncio.ensure_future(play_episode(
                self.agent, self.client(session.id), self.sessions, session,
                AgentSample(sample.id, prompts[group.index], group.answer, group.index, k,
                            sandbox), a.timeout_s, failed)))
            return ep

        for group in groups:
            for k in range(len(group.samples)):
                start(group, k, 0)
        by_index = {group.index: group for group in groups}
        left = {group.index: len(group.samples) for group in groups}

        async def on_done(ep: Episode) -> None:
            if not any(ep is current for current in slots[ep.group]):
                return  # a failed attempt that a retry replaced
            left[ep.group] -= 1
            if left[ep.group] == 0:
                group, done = by_index[ep.group], slots[ep.group]
                states = [self.sessions.by_episode[e.id] for e in done]
                finish_group(group, done, [bool(s.failure) for s in states], [s.reward for s in states],
                             self.fmt.end_id, eps, self.cfg.trainer.engine)
                await scored.put([group], weight=1)

        try:
            await driver.run([ep for done in slots.values() for ep in done], self.ctl.channel(TURN_RESULTS).get,
                             on_done)
            await driver.close()
        finally:
            for task in agents:
                task.cancel()
            _, stuck = await asyncio.wait(agents, timeout=STOP_AGENTS_S) if agents else (set(), set())
            if stuck:  # (an agent that swallows its cancellation: left behind, not waited for)
                log.warning("%d agent episodes did not stop within %.0f s of their step's end", len(stuck),
                            STOP_AGENTS_S)
            for session in sessions:
                self.sessions.close(session)
        if unfinished_out is not None:
            unfinished_out.set_result([])
        return [RewardStats(verifier="agent", episodes=driver_metrics(driver))]

    def train_batch(self, scored: list[PromptGroup], behaviour: bool = False) -> TrainBatch:
        """The agentic batch, each dropped episode in a group of its own (the trainer
        recomputes advantages by group: it must not count their reward)."""
        batch = super().train_batch(scored, behaviour)
        finishes = [s.finish for g in sorted(scored, key=lambda g: g.index) for s in g.samples]
        return dataclasses.replace(batch, group_ids=own_groups(batch.group_ids or [], finishes))

    def client(self, session_id: str) -> Any:
        import openai  # the agent extra: only a run with agents needs it
        return openai.AsyncOpenAI(base_url=self.server.base_url(session_id), api_key=self.token, max_retries=0,
                                  timeout=self.cfg.agent.timeout_s)

    def warmup_batch(self, index: int) -> TrainBatch:
        """The calc task's episodes as the built-in agent plays them, in the chat format:
        the model's turns imitated, the rest masked (the same renders the endpoint uses)."""
        size, calc = self.cfg.trainer.warmup.batch_size, self.cfg.task.calc
        tools = tuple(ToolSpec(t["function"]["name"], t["function"]["description"], t["function"]["parameters"])
                      for t in TOOLS)
        end = self.fmt.end_id
        ids, plens, masks = [], [], []
        for problem in self.source.warmup_problems(index * size, size):
            user = ChatMessage("user", problem.prompt)
            prompt = self.fmt.render([user], tools, True)
            if is_direct(problem, self.cfg.run.seed, calc.warmup_direct_frac):
                response, mask = self.tokenizer.encode(problem.answer) + [end], None
            else:
                call = ToolCall("call_0_0", "calc", json.dumps({"x": expression(problem)}))
                turn = self.tokenizer.encode(call_text(call, self.parser)) + [end]
                history = [user, ChatMessage("assistant", "", (call,))]
                tool = self.fmt.continuation(history, [ChatMessage("tool", problem.answer, tool_call_id=call.id)],
                                             tools, True)
                answer = self.tokenizer.encode(problem.answer) + [end]
                response = turn + tool + answer
                mask = [1] * len(turn) + [0] * len(tool) + [1] * len(answer)
            ids.append(prompt + response)
            plens.append(len(prompt))
            masks.append(mask or [1] * len(response))
        return TrainBatch(input_ids=ids, prompt_lens=plens, response_mask=masks, advantages=[1.0] * len(ids))
