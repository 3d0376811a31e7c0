"""The `reward:` section of `dynarl train`: a reward function of the user's in place of
the task's verifier (docs/reward.md).

The section checks its own values (RewardSection.__post_init__: the form of
`function`, the numbers); `check_reward`, called by TrainConfig once the whole tree is
built, checks what needs more: the workflow runs a reward stage, and the function
loads (imported here; in sandbox mode only read and compiled, never run outside the
sandbox). Each error is one ConfigError naming the key.
"""
from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dynarl.components.reward.loading import check_source, load_function, parse_spec, source_file
from dynarl.components.tools.config import ToolConfig
from dynarl.transport.errors import ConfigError

if TYPE_CHECKING:
    from dynarl.components.workflows.config import TrainConfig

WORKFLOWS = ("grpo", "ppo")
"""The workflows whose reward stage (components/reward/worker.py) calls the function."""


@dataclass(kw_only=True, slots=True)
class RewardSection:
    function: str | None = None
    """`module:fn` (a module on the import path) or `path/to/file.py:fn` (a relative path
    is taken from the working directory at load): the user's reward, called in the
    reward workers for every sample of workflows grpo and ppo (docs/reward.md);
    per sample `fn(response, answer, **context)` -> a number or a mapping with a "reward"
    number (its other numbers are logged, each as its step mean in reward_scores);
    context: any of prompt, problem_id, sample_id, metadata its signature names. sync
    or async. null: the task's verifier (task.verifier)."""
    batched: bool = False
    """fn takes a rollout chunk's samples at once: `fn(responses, answers, **context)`
    with lists (context: prompts, problem_ids, sample_ids, metadata) and returns a list
    of as many results."""
    timeout_s: float = 30.0
    """One call's wall-clock limit (a sample's; batched: its chunk's); past it the
    call's samples get on_error and count as reward_timeouts."""
    on_error: float = 0.0
    """The reward of a sample whose call raised, timed out, or returned no finite number
    (counted per step: reward_errors, reward_timeouts); the run goes on."""
    max_concurrency: int = 8
    """Calls in flight at once in a reward worker (async ones on its loop, sync ones in
    as many threads); sandbox: sandboxes at once, a chunk's samples split among them."""
    sandbox: bool = False
    """Run fn inside the project's bubblewrap Python sandbox
    (components/tools/python_sandbox.py: no network, no writes outside its in-memory
    folders, resource limits): its file's source is read and run there. It may import
    the standard library and the packages of the interpreter's environment, not the
    files beside it."""
    sandbox_memory_mb: int = 2048
    """sandbox: the address space of each sandbox process (RLIMIT_AS)."""
    num_ranks: int | None = None
    """Reward worker processes (no torch: ~70 MB each with math-verify). Each takes the
    rollout's finished chunks as they come, so several score a step's last chunks in
    parallel (the verifier or a sync function holds the GIL: one process scores one at
    a time). null: one per rollout rank, at most the controller node's cores
    (`ranks`; on the TRL job 2 instead of 1 cut the tail after the rollout from 0.15 to
    0.08 s)."""

    def __post_init__(self) -> None:
        if self.function is not None:
            spec = parse_spec(self.function)  # ValueError "function ...": the loader names reward.function
            if spec.is_file and not os.path.isabs(spec.target):
                self.function = f"{os.path.abspath(spec.target)}:{spec.name}"
        if not isinstance(self.timeout_s, (int, float)) or not 0 < self.timeout_s <= 3600:
            raise ValueError(f"timeout_s must be in (0, 3600], got {self.timeout_s!r}")
        if not math.isfinite(self.on_error):
            raise ValueError(f"on_error must be a finite number, got {self.on_error!r}")
        for name in ("max_concurrency", "sandbox_memory_mb", "num_ranks"):
            value = getattr(self, name)
            if name == "num_ranks" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.sandbox_memory_mb < 64:
            raise ValueError(f"sandbox_memory_mb must be >= 64 (the interpreter needs it to start), "
                             f"got {self.sandbox_memory_mb}")


def reward_ranks(configured: int | None, rollout_ranks: int, cores: int) -> int:
    """The reward stage's ranks: `reward.num_ranks`, or one per rollout rank up to `cores`."""
    return configured if configured is not None else max(1, min(rollout_ranks, cores))


def check_reward(cfg: TrainConfig) -> None:
    """reward.function, against the whole config: a workflow with a reward stage, and a
    function that loads (sandbox: a file that compiles and defines it, and bubblewrap)."""
    r = cfg.reward
    if r.function is None:
        return
    if cfg.workflow not in WORKFLOWS:
        raise ConfigError("reward.function", f"workflow {cfg.workflow!r} scores its samples itself (no reward "
                                             f"stage); a reward function runs in workflow grpo or ppo")
    spec = parse_spec(r.function)
    try:
        if r.sandbox:
            check_source(source_file(spec), spec.name)
        else:
            load_function(spec, r.batched)
    except ValueError as exc:
        raise ConfigError("reward.function", str(exc)) from None
    if r.sandbox and shutil.which(ToolConfig().bwrap) is None:
        # (the reward worker's first call proves that it isolates: python_sandbox.py check)
        raise ConfigError("reward.sandbox", "bubblewrap not found (bwrap): install the Debian package "
                                            "bubblewrap, or set reward.sandbox false")
