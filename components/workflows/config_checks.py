"""The checks of `dynarl train`'s config that need more than one section (TrainConfig
calls them from __post_init__; each raises ConfigError naming the field), and the
per-field checks the sections share (ValueError: the loader prefixes the section)."""
from __future__ import annotations

import importlib.util
import math
from typing import TYPE_CHECKING

from dynarl.components.model.same_tokens import same_tokens
from dynarl.components.placement.embodied import place
from dynarl.components.placement.plan import COMPONENTS, PlacementError, pools_for
from dynarl.transport.errors import ConfigError

if TYPE_CHECKING:
    from dynarl.components.workflows.config import TrainConfig


def at_least_one(section: object, *names: str) -> None:
    for name in names:
        if getattr(section, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(section, name)}")


def whole_number(section: object, name: str) -> None:
    """An int >= 0 (not a bool)."""
    value = getattr(section, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


def check(cfg: TrainConfig) -> None:
    """Every check of the whole tree: backends against the devices, the placement, the
    workflow and its task, overlapped and partial steps, the model's positions."""
    check_algorithm(cfg)
    emulated = cfg.runtime.cluster.device_kind == "emulated"
    if cfg.runtime.launcher == "inproc" and not emulated:
        raise ConfigError("runtime.launcher", "'inproc' cannot host torch.distributed groups for weight sync; "
                                              "choose from 'local', 'agent'")
    if cfg.workflow == "embodied":  # (its own workers: model, rollout, inference and trainer do not apply)
        if (cfg.embodied.backend == "emulated") != emulated:
            raise ConfigError("embodied.backend", "'emulated' workers run on emulated devices only, and "
                                                  "emulated devices (runtime.cluster.device_kind) run only them")
        if cfg.run.log_samples:
            raise ConfigError("run.log_samples", "the embodied workflow's samples are env steps, not text")
        check_embodied(cfg)
        return
    for path, backend in (("rollout.backend", cfg.rollout.backend), ("inference.backend",
                          cfg.inference.backend), ("trainer.backend", cfg.trainer.backend)):
        if (backend == "emulated") != emulated:
            raise ConfigError(path, "'emulated' engines run on emulated devices only, and emulated devices "
                                    "(runtime.cluster.device_kind) run only emulated engines")
    if cfg.trainer.streaming and cfg.trainer.backend == "megatron":
        raise ConfigError("trainer.streaming", "the megatron trainer steps on whole batches; set it false")
    check_lora(cfg)
    if cfg.trainer.streaming and cfg.scheduler.policy == "dynarl" and cfg.trainer.backend != "emulated":
        raise ConfigError("trainer.streaming", "scheduler.policy 'dynarl' grows a streaming trainer mid-step "
                                               "only on emulated devices; a real trainer reshards between "
                                               "whole-batch steps: set it false")
    for name, what in (("tail_tp", "wider-TP tail engines are"), ("lend", "lending the parked components' "
                       "devices to the rollout needs their state offloaded,")):
        if getattr(cfg.scheduler.dynarl, name) and cfg.rollout.backend != "emulated":
            raise ConfigError(f"scheduler.dynarl.{name}", f"{what} modelled on emulated engines only; set it false")
    if cfg.placement.mode != "hybrid" and cfg.placement.pools:
        raise ConfigError("placement.pools", f"only used by mode 'hybrid', not {cfg.placement.mode!r}")
    if cfg.placement.mode == "auto":
        check_auto(cfg)
    else:
        check_placed(cfg)
    check_workflow(cfg)
    if cfg.workflow == "ppo":
        check_ppo(cfg)
    if cfg.rollout.oversample > 1:
        check_partial(cfg)
    elif cfg.algorithm.max_staleness > 0:
        check_async(cfg)
    max_len = cfg.model.config().max_position_embeddings
    if cfg.rollout.max_new_tokens >= max_len and not emulated:
        raise ConfigError("rollout.max_new_tokens", f"must be below the model's {max_len} positions")


def check_algorithm(cfg: TrainConfig) -> None:
    """algorithm.name other than grpo: the native trainer's objectives, in the workflows
    whose advantages come from rewards (grpo, agentic); those that need the whole batch
    at once step on it whole; gspo's and cispo's ratios are to the sampling policy."""
    from dynarl.components.trainer.advantages import WHOLE_BATCH
    a = cfg.algorithm
    if a.name != "grpo":
        if cfg.workflow in ("ppo", "embodied"):
            why = "its critic's GAE advantages" if cfg.workflow == "ppo" else "its own learner's loss"
            raise ConfigError("algorithm.name", f"{a.name!r}: workflow {cfg.workflow} trains on {why}; the "
                                                "objectives are the grpo and agentic workflows': set grpo")
        if cfg.trainer.backend == "megatron":
            raise ConfigError("algorithm.name", f"{a.name!r} is implemented on the native trainer only (the "
                                                "megatron trainer trains grpo): set trainer.backend native "
                                                "or algorithm.name grpo")
    if a.name in WHOLE_BATCH and cfg.trainer.streaming:
        raise ConfigError("trainer.streaming", f"algorithm.name {a.name} needs the whole batch in one step "
                                               "(dr_grpo and gspo divide by its samples, reinforce_pp whitens "
                                               "over its tokens): set it false")
    if a.name in ("gspo", "cispo") and (a.max_staleness or cfg.rollout.oversample > 1):
        raise ConfigError("algorithm.max_staleness", f"algorithm.name {a.name} weighs tokens against the "
                                                     "policy that sampled them (no decoupled correction): set "
                                                     "max_staleness 0 and rollout.oversample 1")
    check_distill(cfg)
    if a.rollout_correction != "none":
        if cfg.workflow == "embodied":
            raise ConfigError("algorithm.rollout_correction", "workflow embodied trains its own learner's loss on "
                                                              "its own samples: set none")
        _one_temperature(cfg, "algorithm.rollout_correction")
    if a.clip_eps_low == 1 and a.name != "cispo":
        raise ConfigError("algorithm.clip_eps_low", "1 (no lower bound) is for cispo's IS weight; a PPO ratio "
                                                    "clip must be below 1")
    if a.dynamic_sampling:
        check_dynamic_sampling(cfg)
    elif a.max_refills is not None:
        raise ConfigError("algorithm.max_refills", "bounds dynamic sampling's refills: set "
                                                   "algorithm.dynamic_sampling true, or leave it null")
    if a.overlong_buffer is not None:
        if a.name != "dapo":
            raise ConfigError("algorithm.overlong_buffer", f"the overlong penalty is dapo's; algorithm.name is "
                                                           f"{a.name}: leave it null")
        if a.overlong_buffer and cfg.workflow != "grpo":
            raise ConfigError("algorithm.overlong_buffer", f"counts one response's tokens against "
                                                           f"rollout.max_new_tokens; workflow {cfg.workflow}'s "
                                                           "episodes span turns: set it 0")
        if a.overlong_buffer > cfg.rollout.max_new_tokens:
            raise ConfigError("algorithm.overlong_buffer", f"{a.overlong_buffer} is more than "
                                                           f"rollout.max_new_tokens ({cfg.rollout.max_new_tokens})")


def check_dynamic_sampling(cfg: TrainConfig) -> None:
    """algorithm.dynamic_sampling refills a running on-policy rollout of workflow grpo
    with static scheduling, where rewards can differ."""
    field_ = "algorithm.dynamic_sampling"
    if cfg.workflow != "grpo":
        raise ConfigError(field_, f"refills the prompt groups of workflow grpo; workflow {cfg.workflow} "
                                  "is not supported: set it false")
    if cfg.task.verifier == "none":
        raise ConfigError(field_, "task.verifier none gives every sample reward 0, so no group's rewards "
                                  "differ: set it false or choose a verifier")
    if cfg.rollout.oversample > 1 or cfg.algorithm.max_staleness > 0:
        raise ConfigError(field_, "refills an on-policy step's rollout; partial rollout "
                                  "(rollout.oversample > 1) and overlapped steps (algorithm.max_staleness > 0) "
                                  "choose their batches otherwise: set it false")
    if cfg.scheduler.policy != "static":
        raise ConfigError(field_, "refills the rollout while it runs, which scheduler.policy "
                                  f"{cfg.scheduler.policy!r} does not yet plan for: use static")


def check_distill(cfg: TrainConfig) -> None:
    """algorithm.name opd distils from algorithm.teacher, which reads the policy's tokens;
    a teacher is for opd alone."""
    a = cfg.algorithm
    if a.name == "opd" and a.teacher is None:
        raise ConfigError("algorithm.teacher", "algorithm.name opd distils from a teacher: set algorithm.teacher.path "
                                               "(an HF folder, e.g. one `dynarl export` wrote) or "
                                               "algorithm.teacher.name (a built-in model)")
    if a.teacher is None:
        return
    if a.name != "opd":
        raise ConfigError("algorithm.teacher", f"a teacher is for algorithm.name opd, not {a.name}: leave it null")
    if a.teacher.lora.enabled:
        raise ConfigError("algorithm.teacher.lora.rank", "the teacher is frozen (nothing of it trains): set it 0")
    same_tokens(cfg.model, a.teacher, "algorithm.teacher", "the teacher scores the policy's tokens")


def check_lora(cfg: TrainConfig) -> None:
    """LoRA (model.lora) adapts the native trainer's policy only."""
    if cfg.model.lora.enabled and cfg.trainer.backend == "megatron":
        raise ConfigError("model.lora.rank", "LoRA adapts the native trainer's policy; the megatron trainer "
                                             "trains every weight: set it 0 or trainer.backend native")
    if cfg.critic.model is not None and cfg.critic.model.lora.enabled:
        raise ConfigError("critic.model.lora.rank", "the critic trains its whole decoder and value head: set it 0")


def check_placed(cfg: TrainConfig) -> None:
    """A configured placement: the modes' pools, every component's ranks on the
    cluster, the trainer's ranks fed, dynarl's needs."""
    try:
        pools_for(cfg.placement.mode, cfg.placement.pools or None)
    except PlacementError as exc:
        raise ConfigError("placement.pools", str(exc)) from None
    ranks = cfg.ranks()
    devices = cfg.runtime.cluster.num_devices
    for c in COMPONENTS:
        if ranks[c] > devices:
            raise ConfigError(f"{c}.num_ranks", f"{ranks[c]} ranks need {ranks[c]} devices but the cluster has "
                                                f"{devices} (runtime.cluster.num_nodes x devices_per_node)")
    try:
        cfg.devices()
    except PlacementError as exc:
        raise ConfigError("placement.mode", f"{exc}; add devices (runtime.cluster.devices_per_node) "
                                            "or lower the components' num_ranks") from None
    if cfg.run.prompts_per_step < cfg.trainer.num_ranks and not cfg.trainer.streaming:
        raise ConfigError("run.prompts_per_step", f"{cfg.run.prompts_per_step} prompts cannot feed "
                                                  f"{cfg.trainer.num_ranks} trainer ranks (one group each at least)")
    if cfg.scheduler.policy == "dynarl":
        _check_dynarl(cfg)


def check_auto(cfg: TrainConfig) -> None:
    """placement.mode auto plans from a profile of the GRPO stages, one rank per device."""
    devices = cfg.runtime.cluster.num_devices
    if cfg.scheduler.policy == "dynarl":
        raise ConfigError("placement.mode", "auto plans a placement that does not change; scheduler.policy "
                                            "dynarl starts from its own (spatial or hybrid): choose one")
    if cfg.workflow != "grpo":
        raise ConfigError("placement.mode", f"auto profiles the grpo workflow's stages, not the {cfg.workflow} "
                                            "workflow's: choose colocated, spatial or hybrid")
    if cfg.rollout.backend != "native" or cfg.trainer.backend != "native":
        raise ConfigError("placement.mode", "auto places one rank per device (the native engines); "
                                            f"rollout.backend {cfg.rollout.backend!r} and trainer.backend "
                                            f"{cfg.trainer.backend!r} have their own parallel layout")
    if cfg.run.prompts_per_step < devices and not cfg.trainer.streaming:
        raise ConfigError("run.prompts_per_step", f"auto may give the trainer all {devices} devices: "
                                                  f"{cfg.run.prompts_per_step} prompts cannot feed as many ranks")


def _check_dynarl(cfg: TrainConfig) -> None:
    """dynarl moves whole rollout devices to the trainer and back: rollout needs
    devices of its own (spatial, or hybrid with rollout in a pool alone), at least
    two engines (one donates, one keeps the tail), and the cluster >= 4 devices."""
    devices = cfg.runtime.cluster.num_devices
    if devices < 4:
        raise ConfigError("scheduler.policy", f"dynarl needs >= 4 devices, the cluster has {devices} "
                                              "(runtime.cluster.devices_per_node); "
                                              "examples/dynarl_cpu.yaml is a 4-device setup")
    if cfg.placement.mode == "colocated":
        raise ConfigError("scheduler.policy", "dynarl needs rollout on devices of its own: "
                                              "placement.mode spatial or hybrid, not colocated")
    placed = cfg.devices()
    others = set(placed["inference"]) | set(placed["trainer"])
    if set(placed["rollout"]) & others:
        raise ConfigError("scheduler.policy", "dynarl needs rollout on devices of its own: in hybrid "
                                              "placement put rollout in a pool alone (placement.pools)")
    if cfg.rollout.num_ranks < 2:
        raise ConfigError("scheduler.policy", "dynarl needs rollout.num_ranks >= 2: "
                                              "one engine donates while another finishes the tail")


def check_async(cfg: TrainConfig) -> None:
    """algorithm.max_staleness > 0 overlaps the next step's rollout with this step's
    inference and training: they need devices apart, a workflow whose samples are
    whole when generated, and a fixed placement."""
    field_ = "algorithm.max_staleness"  # (ppo and embodied refuse it in their own checks)
    if cfg.scheduler.policy != "static":
        raise ConfigError(field_, f"scheduler.policy {cfg.scheduler.policy!r} runs asynchronous steps as "
                                  "partial rollout (the tail carried into the next steps while its devices "
                                  "train): leave rollout.oversample out (1.5) or set it > 1, or use "
                                  "scheduler.policy static for overlapped steps")
    if cfg.placement.mode == "auto":
        raise ConfigError(field_, "placement.mode auto plans for on-policy steps; choose spatial or hybrid")
    _one_temperature(cfg, field_)
    placed = cfg.devices()
    if set(placed["rollout"]) & (set(placed["inference"]) | set(placed["trainer"])):
        raise ConfigError(field_, "the rollout overlaps the trainer only on devices of its own: placement.mode "
                                  "spatial, or hybrid with rollout in a pool alone")


def check_partial(cfg: TrainConfig) -> None:
    """rollout.oversample > 1 carries unfinished groups into later steps: a workflow
    that carries them (grpo's requests, agentic's episodes), a staleness bound that lets them be trained later,
    prompts enough that at least one group is extra, a fixed placement."""
    field_ = "rollout.oversample"
    n, oversample = cfg.run.prompts_per_step, cfg.rollout.oversample
    # (ppo and embodied refuse it in their own checks; agentic episodes are carried mid-way)
    if cfg.algorithm.max_staleness < 1:
        raise ConfigError("algorithm.max_staleness", "partial rollout (rollout.oversample > 1) trains carried "
                                                     "groups on newer weights than made them: set it >= 1")
    from dynarl.components.workflows.partial import extra_groups
    if extra_groups(oversample, n) < 1:
        least = math.ceil((n + 1) / n * 1e4) / 1e4
        raise ConfigError(field_, f"{oversample} over run.prompts_per_step {n} adds no prompt group: "
                                  f"use >= {least}, or more prompts per step")
    if cfg.scheduler.policy == "dynarl" and cfg.scheduler.dynarl.tail_tp:
        raise ConfigError(field_, "scheduler.dynarl.tail_tp widens engines outside the moves the batch's "
                                  "close waits for; set tail_tp false or oversample 1")
    if cfg.rollout.backend == "sglang":
        raise ConfigError(field_, "the sglang engine's pause drops the tokens its queued requests made since "
                                  "they last reported; partial rollout needs native or emulated engines")
    if cfg.placement.mode == "auto":
        raise ConfigError(field_, "placement.mode auto plans for on-policy steps; choose colocated, spatial "
                                  "or hybrid")
    _one_temperature(cfg, field_)


def check_workflow(cfg: TrainConfig) -> None:
    """The calc task is built for tool calls and the agentic workflow runs only it
    (or, with scripted episodes, a simulated workload's scripts on emulated engines)."""
    for name in ("save_samples", "log_samples"):
        if getattr(cfg.run, name) and cfg.trainer.streaming:
            raise ConfigError(f"run.{name}", "a streaming trainer's samples never meet in one place; "
                                             "set trainer.streaming false")
    scripted = cfg.workflow == "agentic" and cfg.agentic.episodes == "scripted"
    if scripted and cfg.rollout.backend != "emulated":
        raise ConfigError("agentic.episodes", "scripted episodes play a simulated workload's scripts "
                                              "(dynarl sim): they need rollout.backend emulated")
    if cfg.workflow == "agentic" and cfg.agentic.episodes == "agent":
        check_agent(cfg)
    elif cfg.workflow == "agentic" and not scripted and cfg.task.kind != "calc":
        raise ConfigError("task.kind", f"workflow 'agentic' trains the built-in tool task 'calc', "
                                       f"not {cfg.task.kind!r}")
    if cfg.workflow == "agentic" and cfg.task.kind == "calc" and cfg.task.calc.tool not in cfg.agentic.tools:
        raise ConfigError("agentic.tools", f"the warm start demonstrates task.calc.tool {cfg.task.calc.tool!r}, "
                                           f"which is not among them ({cfg.agentic.tools})")
    if cfg.task.kind == "calc" and cfg.workflow != "agentic":
        raise ConfigError("workflow", "task.kind 'calc' needs tool calls between turns: set workflow: agentic")
    if cfg.workflow == "agentic" and cfg.agentic.queue == "priority":
        _check_engine_priority(cfg)


def check_agent(cfg: TrainConfig) -> None:
    """An agent's episodes live in the job's process: none waits for a later step."""
    a = cfg.agent
    if importlib.util.find_spec("openai") is None:
        raise ConfigError("agentic.episodes", "an agent's client is the openai package: pip install 'dynarl[agent]'")
    from dynarl.components.agents.runner import load_agent  # (imports the user's module: agent mode only)
    try:
        load_agent(a.function)
    except ValueError as exc:
        raise ConfigError("agent.function", str(exc).removeprefix("agent.function: ")) from None
    if a.episodes_per_prompt and a.episodes_per_prompt != cfg.rollout.samples_per_prompt:
        raise ConfigError("agent.episodes_per_prompt", f"is the group size, rollout.samples_per_prompt "
                                                       f"({cfg.rollout.samples_per_prompt}): set one of them")
    if cfg.rollout.oversample > 1:
        raise ConfigError("rollout.oversample", "partial rollout carries unfinished episodes into later "
                                                "steps; an agent's episode lives in the job's process and "
                                                "cannot wait in a checkpoint: set it 1")


def _check_engine_priority(cfg: TrainConfig) -> None:
    """agentic.queue priority orders each engine's waiting requests; SGLang and vLLM
    take a request's priority only in their priority mode, else serve FCFS."""
    backend = cfg.rollout.backend
    if backend == "sglang" and not (cfg.rollout.sglang and cfg.rollout.sglang.enable_priority_scheduling):
        raise ConfigError("rollout.sglang.enable_priority_scheduling",
                          "agentic.queue priority needs it true (else SGLang serves its queue FCFS); "
                          "or set agentic.queue fifo")
    if backend == "vllm" and (cfg.rollout.vllm is None or cfg.rollout.vllm.scheduling_policy != "priority"):
        raise ConfigError("rollout.vllm.scheduling_policy",
                          "agentic.queue priority needs 'priority' (else vLLM serves its queue FCFS); "
                          "or set agentic.queue fifo")


def check_embodied(cfg: TrainConfig) -> None:
    """Env workers, the policy and its learner on the cluster's devices (components/placement/embodied.py place);
    asynchronous steps are for the LLM workflows, the DynaRL scheduler's barrier rule for emulated workers. (Whether
    the env exists and the policy can take its spaces is checked before any worker
    starts: it builds one env.)"""
    try:
        place(cfg.placement.mode, cfg.embodied.env_workers, cfg.runtime.cluster.num_devices)
    except ValueError as exc:
        raise ConfigError("placement.mode", f"{exc}; add devices (runtime.cluster.devices_per_node) or "
                                            "fewer embodied.env_workers") from None
    if cfg.scheduler.policy == "dynarl" and cfg.embodied.backend != "emulated":
        raise ConfigError("scheduler.policy", "the embodied workflow's dynarl rule (the learner takes the "
                                              "finished env and policy devices at its barrier) runs on "
                                              "emulated workers only (dynarl sim); set static")
    _on_policy(cfg, "the embodied workflow is on-policy")
    if cfg.runtime.launcher == "inproc" and cfg.embodied.backend == "gym":
        raise ConfigError("runtime.launcher", "the embodied workflow's weight sync needs worker processes: local")


def check_ppo(cfg: TrainConfig) -> None:
    """The critic is a native trainer on the trainer's devices, stepping on whole
    batches of whole (on-policy) samples, and reads the policy's tokens."""
    if cfg.trainer.backend == "megatron":
        raise ConfigError("trainer.backend", "workflow ppo trains its critic beside a native (or emulated) "
                                             "policy trainer, not megatron")
    if cfg.trainer.streaming:
        raise ConfigError("trainer.streaming", "workflow ppo computes GAE over whole samples before the step; "
                                               "set it false")
    _on_policy(cfg, "workflow ppo is on-policy for now")
    critic = cfg.critic.model
    if critic is not None and critic != cfg.model:
        same_tokens(cfg.model, critic, "critic.model", "the critic reads the policy's tokens")


def _one_temperature(cfg: TrainConfig, field_: str) -> None:
    """A sample trained on newer weights than made it is weighted by the rollout's log-probs
    against inference's: both must be of one distribution."""
    if cfg.rollout.temperature != 1.0:
        raise ConfigError(field_, f"the rollout's log-probs are those of its sampling temperature "
                                  f"({cfg.rollout.temperature}), inference's of temperature 1: the behaviour "
                                  "weight would compare two distributions; set rollout.temperature 1")


def _on_policy(cfg: TrainConfig, why: str) -> None:
    if cfg.algorithm.max_staleness or cfg.rollout.oversample > 1:
        field_ = "algorithm.max_staleness" if cfg.algorithm.max_staleness else "rollout.oversample"
        raise ConfigError(field_, f"{why}: set max_staleness 0 and oversample 1")
