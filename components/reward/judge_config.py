"""The `judge:` section of `dynarl train`: an LLM that scores each sample, its
engine, its devices, its prompt and how its score becomes the reward.

Each field is checked here (a ValueError naming the field: the loader prefixes
`judge.`); what needs the whole config (the devices against the cluster and the
placement, the workflow) is checked in components/workflows/judge_stage.py."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

from dynarl.components.reward.judge_score import pattern_problem, template_problem
from dynarl.components.rollout.base import SamplingParams
from dynarl.components.rollout.native.config import NativeEngineConfig
from dynarl.components.rollout.sglang.config import SGLangConfig
from dynarl.components.rollout.vllm.config import VLLMConfig
from dynarl.core.config_tree import wire_config

DEFAULT_TEMPLATE = ("Problem: {prompt}\nReference answer: {answer}\nResponse: {response}\n"
                    "How correct is the response, from 0 to 10?\nScore: ")


@dataclass(kw_only=True, slots=True)
class JudgeParserSection:
    """How the judge's text becomes a score in [0, 1] (components/reward/judge_score.py)."""
    kind: Literal["number", "yes_no"] = "number"
    """number: the first match of `pattern`, a number in [low, high], mapped onto [0, 1];
    yes_no: the first word yes (1) or no (0), in any case."""
    pattern: str = r"-?\d+(?:\.\d+)?"
    """number: the regular expression that finds the score (its one group, if it has
    one, else the whole match)."""
    low: float = 0.0
    """number: the lowest score the judge is asked for (maps to 0)."""
    high: float = 10.0
    """number: the highest score the judge is asked for (maps to 1); a number outside
    [low, high] is no score."""
    default: float = 0.0
    """The score, in [0, 1], of a judgment with no score in it (counted in the step's
    judge_unparseable), or of a sample whose judge prompt is too long (judge_too_long)."""

    def __post_init__(self) -> None:
        problem = pattern_problem(self.pattern)
        if problem:
            raise ValueError(f"pattern {problem}")
        if not self.low < self.high:
            raise ValueError(f"high must be > low, got low {self.low} and high {self.high}")
        if not 0.0 <= self.default <= 1.0:
            raise ValueError(f"default must be in [0, 1] (a normalised score), got {self.default}")


@wire_config(75)
@dataclass(kw_only=True, slots=True)
class JudgeSection:
    enabled: bool = False
    """Score every sample with an LLM judge after the reward stage (workflows grpo and
    ppo): its score replaces the reward, or is weighed into it (`combine`), before the
    advantages. The judge's weights are frozen: no weight sync reaches it."""
    model: str | None = None
    """The judge's HF folder; null: the policy's model section (its starting weights: a
    built-in model judges with its seeded initial weights, the tiny model judging itself)."""
    devices: list[int] = field(default_factory=lambda: [0])
    """The devices of the judge's ranks, one rank each. A device the placement's
    components also hold is time-shared with them (device_lock: the judge runs after the
    rollout frees it and before inference takes it); others are the judge's own."""
    backend: Literal["native", "vllm", "sglang"] = "native"
    """The judge's engine, through the rollout engine protocol (engine_factory.py):
    native, vllm (`pip install 'dynarl[vllm]'`) or sglang (`pip install 'dynarl[sglang]'`)."""
    engine: NativeEngineConfig = field(default_factory=NativeEngineConfig)
    """The native engine's settings when backend is native."""
    vllm: VLLMConfig | None = None
    """vLLM engine settings when backend is vllm (tp_size 1: one engine per judge device)."""
    sglang: SGLangConfig | None = None
    """SGLang engine settings when backend is sglang (tp_size 1: one engine per judge device)."""
    template: str = DEFAULT_TEMPLATE
    """The judge's prompt: {prompt} (the policy's prompt as decoded text), {response}
    (required) and {answer} (the task's reference answer) are filled in per sample."""
    chat: bool = True
    """The filled-in template goes to the judge as the user's message of its tokenizer's
    chat template, where it has one (an HF instruct model); else as plain text."""
    parser: JudgeParserSection = field(default_factory=JudgeParserSection)
    max_new_tokens: int = 8
    """Most tokens of a judgment."""
    max_prompt_tokens: int = 1024
    """A longer judge prompt is not sent: its sample gets parser.default (judge_too_long)."""
    temperature: float = 0.0
    """The judge's sampling temperature (0: greedy, the same judgment every time)."""
    combine: Literal["replace", "weight"] = "replace"
    """replace: the reward is the judge's score; weight: (1 - weight) x the reward
    stage's reward + weight x the judge's score."""
    weight: float = 0.5
    """combine weight: the judge's share of the reward, in [0, 1]."""

    def __post_init__(self) -> None:
        if not self.devices:
            raise ValueError("devices must name at least one device: the judge group needs devices of its own or "
                             "shared ones, e.g. judge.devices=[0]")
        if any(d < 0 for d in self.devices) or len(set(self.devices)) != len(self.devices):
            raise ValueError(f"devices must be distinct device ids >= 0, got {self.devices}")
        problem = template_problem(self.template)
        if problem:
            raise ValueError(f"template {problem}")
        for name in ("max_new_tokens", "max_prompt_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        SamplingParams(temperature=self.temperature, max_new_tokens=self.max_new_tokens)  # raises ValueError
        if not 0.0 <= self.weight <= 1.0:
            raise ValueError(f"weight must be in [0, 1], got {self.weight}")
        if self.model is not None and not os.path.isfile(os.path.join(self.model, "config.json")):
            raise ValueError(f"model {self.model!r} has no config.json (an HF model folder)")
        for name in ("vllm", "sglang"):
            engine = getattr(self, name)
            if engine is not None and engine.tp_size != 1:
                raise ValueError(f"{name} tp_size must be 1 (one judge engine per device), got {engine.tp_size}")
