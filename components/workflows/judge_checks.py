"""The judge's section against the rest of `dynarl train`'s config (TrainConfig calls
`check_judge` from __post_init__; each error is a ConfigError naming the field), its
model, and its place as the placement line prints it. No worker or engine is imported
here: a dry run checks a cluster's config on a laptop."""
from __future__ import annotations

from typing import TYPE_CHECKING

from dynarl.components.model.spec import ModelSpec
from dynarl.transport.errors import ConfigError

if TYPE_CHECKING:
    from dynarl.components.placement.plan import Placement
    from dynarl.components.workflows.config import TrainConfig

WORKFLOWS = ("grpo", "ppo")
"""The workflows whose samples the judge scores (agentic scores episodes as they end)."""


def judge_model(cfg: "TrainConfig") -> ModelSpec:
    """The judge's model: judge.model's folder (in the policy's dtype), else the policy's spec."""
    if cfg.judge.model is None:
        return cfg.model
    return ModelSpec(path=cfg.judge.model, dtype=cfg.model.dtype)


def check_judge(cfg: "TrainConfig") -> None:
    """The judge against the rest of the config (TrainConfig.__post_init__); ConfigError
    names the field."""
    j = cfg.judge
    if not j.enabled:
        return
    if cfg.workflow not in WORKFLOWS:
        raise ConfigError("judge.enabled", f"the judge scores the samples of workflow grpo or ppo, not "
                                           f"{cfg.workflow!r}; set it false")
    if cfg.runtime.cluster.device_kind == "emulated":
        raise ConfigError("judge.enabled", "the judge runs a real engine, not on emulated devices; set it false")
    cluster = cfg.runtime.cluster.num_devices
    outside = [d for d in j.devices if d >= cluster]
    if outside:
        raise ConfigError("judge.devices", f"device {outside[0]} is not in the cluster (devices 0..{cluster - 1})")
    if cfg.scheduler.policy == "dynarl":  # (on a fixed placement: config_checks refuses auto with dynarl)
        placed = cfg.placement_plan().num_devices
        shared = sorted(d for d in j.devices if d < placed)
        if shared:
            raise ConfigError("judge.devices", f"scheduler.policy dynarl moves devices 0..{placed - 1} among rollout, "
                                               f"inference and trainer and does not move the judge's: give the judge "
                                               f"devices of its own (>= {placed}), not {shared}")
    limit = judge_model(cfg).config().max_position_embeddings
    if j.backend == "native" and j.engine.max_model_len is not None:
        limit = min(limit, j.engine.max_model_len)
    if j.max_prompt_tokens + j.max_new_tokens > limit:
        raise ConfigError("judge.max_prompt_tokens", f"{j.max_prompt_tokens} + judge.max_new_tokens "
                                                     f"{j.max_new_tokens} exceed the judge model's {limit} positions")


def describe(cfg: "TrainConfig", placement: "Placement | None" = None) -> str:
    """The judge's place, for the placement line of `dynarl train` (and --dry-run): its
    devices, time-shared with the placement's components or its own; '' without a judge."""
    if not cfg.judge.enabled:
        return ""
    devices = cfg.judge.devices
    if placement is None and cfg.placement.mode != "auto":
        placement = cfg.placement_plan()
    if placement is None:
        return f"judge {devices}"
    shared = [d for d in devices if d < placement.num_devices]
    how = "own" if not shared else ("time-shared" if len(shared) == len(devices) else f"time-shares {shared}")
    return f"judge {devices} ({how})"


def judge_backend_notes(cfg: "TrainConfig", require_installed: bool) -> list[str]:
    """The judge's engine extra (vllm, sglang) is installed: ConfigError at judge.backend
    naming the pip command, or on a dry run (`require_installed` false) a note."""
    from dynarl.components.extras import is_available, require_extra
    backend = cfg.judge.backend
    if not cfg.judge.enabled:
        return []
    if require_installed:
        require_extra(backend, "judge.backend")
        return []
    return [] if is_available(backend) else [f"judge.backend={backend}: extra not installed here "
                                             f"(pip install 'dynarl[{backend}]')"]
