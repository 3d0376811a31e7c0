"""JudgeWorker: one rank of the LLM judge, a rollout engine (native, vllm or sglang,
made by engine_factory.py) that scores samples instead of writing them.

Its stage sits between the reward stage and inference: it reads the reward stage's
chunks, asks its engine for one judgment per sample (all of a chunk's samples in one
batch, through the engine's public `generate`), reads a score out of each judgment
(judge_score.py), puts it into the sample's reward (replacing it, or weighed with
it), gives each group its advantages again under the trainer's objective, and passes
the chunk on. The judge's weights are its own and frozen: it takes part in no
weight sync.

device_lock: on devices it shares with the placement's components (colocated), the
engine's KV cache is freed while the judge does not hold them, as a rollout rank's
is; on its own devices the cache stays.
"""
from __future__ import annotations

from dataclasses import dataclass

import dynarl
from dynarl.components.experience import END, PromptGroup, Sample, made_of
from dynarl.components.model.spec import ModelSpec, build_tokenizer, safe_decode
from dynarl.components.model.tokenizer import chat_formatter
from dynarl.components.reward.judge_config import JudgeSection
from dynarl.components.reward.judge_score import combine, parse_score, render
from dynarl.components.rollout.base import GenerationRequest, SamplingParams
from dynarl.components.trainer.advantages import group_advantages_for
from dynarl.components.trainer.base import TrainerConfig
from dynarl.transport.wire import register_struct

EXAMPLE_CHARS = 200
"""How much of a judgment a step's metrics keep as its example."""


@register_struct(76)
@dataclass(frozen=True, kw_only=True, slots=True)
class JudgeStats:
    """A judge rank's step: what it judged and how the judgments read."""
    samples: int = 0
    unparseable: int = 0
    """Judgments with no score in them (scored parser.default)."""
    too_long: int = 0
    """Samples whose judge prompt was over max_prompt_tokens (not sent; scored parser.default)."""
    score_sum: float = 0.0
    """Sum of the scores the samples got (defaults included)."""
    reward_before_sum: float = 0.0
    """Sum of the reward stage's rewards, before the judge's score went in."""
    tokens: int = 0
    """Judgment tokens generated."""
    example: str = ""
    """The first judgment's text (up to EXAMPLE_CHARS), to see what the judge writes."""


@dataclass(slots=True)
class Tally:
    """A judge rank's counts so far in its step (JudgeStats when it ends)."""
    samples: int = 0
    unparseable: int = 0
    too_long: int = 0
    score_sum: float = 0.0
    reward_before_sum: float = 0.0
    tokens: int = 0
    example: str | None = None

    def stats(self) -> JudgeStats:
        return JudgeStats(samples=self.samples, unparseable=self.unparseable, too_long=self.too_long,
                          score_sum=self.score_sum, reward_before_sum=self.reward_before_sum, tokens=self.tokens,
                          example=self.example or "")


def judge_group(group: PromptGroup, judgments: dict[str, tuple[str, int]], judge: JudgeSection, tally: Tally) -> None:
    """Each sample's reward once judged: its judgment's score (parser.default where it
    has none, or where it was not judged: too long), combined with the reward stage's
    reward as `judge.combine` says; counted in `tally`."""
    p = judge.parser
    for sample in group.samples:
        judgment = judgments.get(sample.id)
        score = None
        if judgment is None:
            tally.too_long += 1
        else:
            text, tokens = judgment
            tally.tokens += tokens
            if tally.example is None:
                tally.example = text[:EXAMPLE_CHARS]
            score = parse_score(text, p.kind, p.pattern, p.low, p.high)
            tally.unparseable += score is None
        score = p.default if score is None else score
        before = float(sample.reward or 0.0)
        tally.samples += 1
        tally.score_sum += score
        tally.reward_before_sum += before
        sample.reward = combine(before, score, judge.combine, judge.weight)


class JudgeWorker(dynarl.Worker):
    def __init__(self, judge: JudgeSection, model: ModelSpec, policy: ModelSpec, engine: TrainerConfig,
                 shares_device: bool = False) -> None:
        """`model`: the judge's model; `policy`: the policy's (its tokenizer decodes the
        samples); `engine`: the trainer's settings, whose objective the advantages follow."""
        self.settings = judge
        backend_config = {"vllm": judge.vllm, "sglang": judge.sglang}.get(judge.backend)
        from dynarl.components.engine_factory import make_rollout_engine  # (torch: in the rank only)
        self.engine = make_rollout_engine(judge.backend, model, judge.engine, backend_config, weight_version=0,
                                          device=self.device)
        self.tokenizer = build_tokenizer(model)
        self.policy_tokenizer = build_tokenizer(policy)
        self.chat = chat_formatter(self.tokenizer) if judge.chat else None
        self.trainer_config = engine
        self.shares_device = shares_device
        self.freed = False

    async def setup(self) -> None:
        if self.shares_device:
            await self._free()  # starts off the device; onload brings the cache

    async def teardown(self) -> None:
        shutdown = getattr(self.engine, "shutdown", None)  # sglang, vllm: their engine processes
        if shutdown is not None:
            shutdown()

    async def onload(self) -> None:
        if self.shares_device and self.freed:
            await self.engine.resume_memory()
            self.freed = False

    async def offload(self) -> None:
        if self.shares_device:
            await self._free()

    async def _free(self) -> None:
        if not self.freed:
            await self.engine.release_memory()
            self.freed = True

    async def score(self, get: str, put: str) -> JudgeStats:
        """Consumes the reward stage's chunks from `get` until END; puts them on `put`,
        each sample's reward judged and each group's advantages recomputed."""
        inbox, outbox = self.channel(get), self.channel(put)
        tally = Tally()
        while (chunk := await inbox.get()) is not END:
            judgments = await self._judgments(chunk)
            for group in chunk:
                judge_group(group, judgments, self.settings, tally)
                lengths = [len(s.output_ids) for s in group.samples]
                for sample, advantage in zip(group.samples, group_advantages_for(
                        self.trainer_config, [s.reward for s in group.samples], lengths)):
                    sample.advantage = advantage
            await outbox.put(chunk, weight=len(chunk), **made_of(inbox, chunk))
        await outbox.flush()
        return tally.stats()

    async def _judgments(self, chunk: list[PromptGroup]) -> dict[str, tuple[str, int]]:
        """Each sample's judgment (its text and its number of tokens), by sample id, from
        one batch on the engine; a sample whose judge prompt is too long is left out."""
        s = self.settings
        stop = () if self.tokenizer.eos_id is None else (self.tokenizer.eos_id,)
        requests = []
        for group in chunk:
            prompt = self.policy_tokenizer.decode(list(group.prompt_ids))
            for sample in group.samples:
                ids = self._prompt_ids(prompt, self._response(sample), group.answer)
                if len(ids) > s.max_prompt_tokens:
                    continue
                requests.append(GenerationRequest(
                    f"judge/{sample.id}", ids, SamplingParams(temperature=s.temperature,
                                                              max_new_tokens=s.max_new_tokens,
                                                              stop_token_ids=stop, seed=sample.seed)))
        results = await self.engine.generate(requests) if requests else []
        return {r.request_id.removeprefix("judge/"):
                (safe_decode(self.tokenizer, [t for t in r.output_token_ids if t not in stop]),
                 len(r.output_token_ids)) for r in results}

    def _response(self, sample: Sample) -> str:
        eos = self.policy_tokenizer.eos_id
        return safe_decode(self.policy_tokenizer, [t for t in sample.output_ids if t != eos])

    def _prompt_ids(self, prompt: str, response: str, answer: str) -> list[int]:
        text = render(self.settings.template, prompt=prompt, response=response, answer=answer)
        if self.chat is not None:
            text = self.chat(text)
        return self.tokenizer.encode(spellable(self.tokenizer, text), add_bos=True)


def spellable(tokenizer: object, text: str) -> str:
    """`text` with every character a character tokenizer cannot spell as '?' (a
    response may hold U+FFFD for ids past the tokenizer's vocabulary); other
    tokenizers spell anything."""
    alphabet = getattr(tokenizer, "alphabet", None)
    if alphabet is None:
        return text
    return "".join(ch if ch in alphabet else "?" for ch in text)
