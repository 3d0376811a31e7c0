"""The `run:` section of `dynarl train`: steps, batch, seed, checkpoints, loggers, restarts,
the samples logged as text and the live dashboard."""
from __future__ import annotations

from dataclasses import dataclass, field

from dynarl.components.workflows.config_checks import at_least_one, whole_number


LOGGERS = {"jsonl": None, "tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
"""run.loggers' names, each with the package it needs."""


@dataclass(kw_only=True, slots=True)
class DashboardSection:
    """The run's live dashboard (launch/dashboard/, docs/dashboard.md): a web page served by
    `dynarl train` from what the run writes; its address, with the job's token in it, is
    printed at start."""
    host: str = "127.0.0.1"
    """The address it binds (only this one). Loopback by default: reach it from another
    machine through an SSH tunnel; another address sends the token over plain HTTP."""
    port: int = 0
    """0: a free port the kernel picks (printed at start)."""

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ValueError("host must be an address, e.g. 127.0.0.1")
        if not isinstance(self.port, int) or isinstance(self.port, bool) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be an integer in [0, 65535], got {self.port!r}")


@dataclass(kw_only=True, slots=True)
class RunSection:
    steps: int = 200
    """GRPO steps."""
    prompts_per_step: int = 32
    """Prompts (groups of rollout.samples_per_prompt samples) per step."""
    seed: int = 0
    """Seeds the data stream and every sample's sampling seed."""
    save_samples: bool = False
    """Append each step's trained samples to samples.jsonl in the run directory, a line
    per step: each sample's id, token ids, prompt length, loss mask and reward (what
    the trainer was given; a streaming trainer's step writes none)."""
    log_samples: int = 0
    """Samples per step (spread over the batch) appended as text to samples_text.jsonl in
    the run directory, a line per step: each one's prompt, response, reward, per-token
    log-probs and, multi-turn, its model and tool turns (the dashboard's samples browser;
    a streaming trainer's step writes none). 0: none."""
    dashboard: DashboardSection | None = None
    """The live dashboard; null: none. `run.dashboard: {}` serves it on a free loopback port."""
    checkpoint_every: int = 50
    """Checkpoint after every this many steps (and after the warm start and the last step)."""
    keep_checkpoints: int = 2
    """Newest checkpoints kept on disk; pruning also keeps the newest one that verifies
    (its manifest; components/workflows/checkpoints.py), whatever is newer."""
    loggers: list[str] = field(default_factory=lambda: ["jsonl"])
    """Where each step's metrics go besides metrics.jsonl (always written): tensorboard,
    wandb (offline), mlflow (a local file store); launch/trackers.py."""
    max_restarts: int = 3
    """How often a lost worker (killed, frozen, unreachable) restarts the job's workers
    from the newest checkpoint inside the same `dynarl train` process (launch/recovery.py);
    0: a lost worker ends the run. The steps since that checkpoint are trained again
    (the ledger and metrics.jsonl are rolled back to it), so run.checkpoint_every bounds
    what a loss costs."""
    survive: bool = True
    """A lost rollout, reward or inference rank does not restart the job: what it held
    goes to the other ranks and a replacement takes its place within the step
    (components/workflows/survival.py; where it applies: the static scheduler, whole
    on-policy steps, the grpo and ppo workflows). False: every loss restarts."""

    def __post_init__(self) -> None:
        at_least_one(self, "steps", "prompts_per_step", "checkpoint_every", "keep_checkpoints")
        whole_number(self, "max_restarts")
        whole_number(self, "log_samples")
        for name in self.loggers:
            if name not in LOGGERS:
                raise ValueError(f"loggers has an unknown logger {name!r}; choose from {', '.join(LOGGERS)}")

