"""What `dynarl train` checks and builds before any worker starts: the resolved config,
the backends, the memory plan, the task's data, the run directory (a Job holding it)."""
from __future__ import annotations

import os
import sys
import time
from typing import Any

import yaml

from dynarl.core import yaml_config
from dynarl.launch.train_job import Job
from dynarl.transport.errors import ConfigError


class UsageError(Exception):
    pass


class RunDirUnwritable(OSError):
    """The run directory cannot be made or locked (read-only, no space, refused): exit 1."""


def check_memory(cfg: Any) -> None:
    """A planned peak over a device's memory stops the launch (memory.check), before
    any worker starts: ConfigError naming the device, the component and the numbers."""
    from dynarl.components.memory.of_config import plan_of
    from dynarl.components.memory.table import refusal
    plan = plan_of(cfg) if cfg.memory.check else None
    message = refusal(plan) if plan is not None else None
    if message is not None:
        raise ConfigError("memory", message)


def check_env(env_id: str) -> None:
    """The embodied env exists and the policy can take its spaces (one env built here)."""
    from dynarl.components.embodied.spaces import EnvError, describe
    try:
        describe(env_id)
    except EnvError as exc:
        raise ConfigError("embodied.env_id", str(exc)) from None


def check_tools(cfg: Any) -> None:
    """An agentic job whose episodes may call `py` needs bubblewrap (the Python sandbox):
    refused here, in one line, rather than by the tool worker's start after the engines'."""
    import shutil

    from dynarl.components.tools.config import ToolConfig
    a = cfg.agentic
    if cfg.workflow != "agentic" or a.episodes == "scripted" or "py" not in a.tools:
        return
    bwrap = ToolConfig().bwrap
    if shutil.which(bwrap) is None:
        raise ConfigError("agentic.tools", f"'py' runs model code in the bubblewrap sandbox, and {bwrap!r} is not "
                                           "on PATH: install bubblewrap (apt-get install bubblewrap, or dnf install "
                                           "bubblewrap) or leave py out (agentic.tools=[calc])")


def check_backends_of(cfg: Any, require_installed: bool) -> list[str]:
    """Backend checks at config load: a missing extra names the pip command."""
    from dynarl.components.backends import check_backends
    from dynarl.components.workflows.judge_checks import judge_backend_notes
    return check_backends(rollout_backend=cfg.rollout.backend, trainer_backend=cfg.trainer.backend,
                          model=cfg.model.config(), rollout_ranks=cfg.rollout.num_ranks,
                          trainer_ranks=cfg.trainer.num_ranks, sglang=cfg.rollout.sglang, vllm=cfg.rollout.vllm,
                          megatron=cfg.trainer.megatron, require_installed=require_installed) \
        + judge_backend_notes(cfg, require_installed)


def resolve_config(config_path: str | None, overrides: list[tuple[str, Any]], resume: str | None) -> Any:
    """The TrainConfig a command line names: CONFIG (or the defaults) with overrides,
    or with --resume DIR that run's own config.yaml."""
    from dynarl.components.workflows.config import load_config
    if resume is None:
        return load_config(_read_yaml(config_path) if config_path else None, overrides)
    data = _read_yaml(os.path.join(resume, "config.yaml"))
    placement = data.get("placement") if isinstance(data, dict) else None
    if isinstance(placement, dict) and placement.get("mode") == "temporal":  # a run written before the rename
        placement["mode"] = "colocated"
    return load_config(data, overrides)


def check_wired_of(cfg: Any) -> None:
    """The workers build their engines through components/engine_factory.py; backend
    combinations they cannot train with yet raise ConfigError, naming the field."""
    from dynarl.components.backends import check_wired
    check_wired(rollout_backend=cfg.rollout.backend, trainer_backend=cfg.trainer.backend,
                megatron=cfg.trainer.megatron, device_kind=cfg.runtime.cluster.device_kind)


def prepare(config_path: str | None, overrides: list[tuple[str, Any]], run_dir: str | None,
            resume: str | None) -> Job:
    """The validated job, owning its run directory until its run ends (launch/run_dir.py):
    --resume takes the directory before its checkpoint is read, a new run once its
    config is valid; a directory another live job holds is refused (UsageError)."""
    from dynarl.launch import run_dir as owned
    lock = None
    try:
        if resume is not None and os.path.isfile(os.path.join(resume, "config.yaml")):
            lock = _claim(resume)
        job = _prepare(config_path, overrides, run_dir, resume)
        if lock is None:
            lock = _claim(job.run_dir)
            if not owned.is_empty(job.run_dir):  # filled by a job that ended between the check and the claim
                raise _not_empty(job.run_dir)
    except owned.RunDirBusy as exc:
        raise UsageError(str(exc)) from None
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    job.lock = lock
    return job


def _prepare(config_path: str | None, overrides: list[tuple[str, Any]], run_dir: str | None,
             resume: str | None) -> Job:
    from dynarl.components.workflows import checkpoints as ckpt
    from dynarl.components.workflows.partial import resume_refused, stream_source

    checkpoint = None
    if resume is not None:
        config_path = os.path.join(resume, "config.yaml")
        if not os.path.isfile(config_path):
            raise UsageError(f"--resume {resume}: no config.yaml there (not a run directory)")
        try:  # each checkpoint passed over (failed verification) gets a line
            checkpoint = ckpt.resume_checkpoint(resume, lambda line: print(f"dynarl train: {line}", file=sys.stderr))
        except ValueError as exc:
            raise UsageError(f"--resume {resume}: {exc}") from None
        if checkpoint is None:
            raise UsageError(f"--resume {resume}: no complete checkpoint to resume from")
        run_dir = resume
    cfg = resolve_config(config_path, overrides, resume)
    if checkpoint is not None:  # before config.yaml is rewritten with the new values
        mismatch = ckpt.resume_mismatch(checkpoint[1], cfg.run.seed, cfg.run.prompts_per_step)
        if mismatch is not None:
            raise UsageError(f"--resume {resume}: {mismatch}")
        refused = resume_refused(checkpoint[0], stream_source(cfg)) or ckpt.workflow_refused(
            checkpoint[0], cfg.workflow)
        if refused is not None:
            raise UsageError(f"--resume {resume}: its checkpoint of step {checkpoint[1].step}: {refused}")
        done = checkpoint[1].step
        if done >= cfg.run.steps:
            raise UsageError(f"--resume {resume}: its checkpoint has trained {done} steps and run.steps is "
                             f"{cfg.run.steps}, so there is nothing to run; to train further, raise it "
                             f"(e.g. run.steps={done + cfg.run.checkpoint_every})")
    check_backends_of(cfg, require_installed=True)
    check_wired_of(cfg)
    check_memory(cfg)
    check_tools(cfg)
    if cfg.workflow == "embodied":
        check_env(cfg.embodied.env_id)
    from dynarl.launch.trackers import missing_packages
    missing = missing_packages(cfg.run.loggers)
    if missing:
        raise ConfigError("run.loggers", missing[0])
    source, tokenizer = _task(cfg)
    if resume is None:
        run_dir = _new_run_dir(run_dir, cfg.workflow)
    return Job(cfg, source, tokenizer, run_dir, checkpoint)


def _claim(run_dir: str) -> Any:
    from dynarl.launch import run_dir as owned
    try:
        return owned.claim(run_dir)
    except OSError as exc:
        raise RunDirUnwritable(f"cannot write the run directory {run_dir}: {exc.strerror or exc}") from None


def _new_run_dir(run_dir: str | None, workflow: str) -> str:
    """`run_dir` if nothing is in it yet, else UsageError; by default runs/<workflow>-<time>,
    made here, of this job alone (-2, -3, ... when another job took the name first)."""
    from dynarl.launch import run_dir as owned
    if run_dir is None:
        try:
            return owned.new_default("runs", time.strftime(f"{workflow}-%Y%m%d-%H%M%S"))
        except OSError as exc:
            raise RunDirUnwritable(f"cannot make a run directory in runs: {exc.strerror or exc}") from None
    if not owned.is_empty(run_dir):
        owner = owned.owner_of(run_dir)
        raise _not_empty(run_dir) if owner is None else owned.RunDirBusy(run_dir, owner)
    return run_dir


def _not_empty(run_dir: str) -> UsageError:
    return UsageError(f"run directory {run_dir} is not empty; use --resume {run_dir} to continue it "
                      "or choose another --run-dir")


def _read_yaml(path: str) -> Any:
    if not os.path.isfile(path):
        raise UsageError(f"config file {path!r} does not exist")
    try:
        with open(path) as f:
            return yaml_config.load(f)
    except yaml.YAMLError as exc:
        raise UsageError(f"config file {path!r} is not valid YAML: {exc}") from None


def _task(cfg: Any) -> tuple[Any, Any]:
    """The problem stream and tokenizer; dataset problems become ConfigErrors naming the field."""
    from dynarl.components.model.spec import build_tokenizer, prompt_check
    from dynarl.components.model.tokenizer import chat_formatter
    from dynarl.components.tasks.source import ProblemSource

    tokenizer = build_tokenizer(cfg.model)
    max_prompt = cfg.model.config().max_position_embeddings - cfg.rollout.max_new_tokens
    try:
        source = ProblemSource(cfg.task, cfg.run.seed, prompt_check(tokenizer, max_prompt), chat_formatter(tokenizer))
    except FileNotFoundError as exc:
        raise ConfigError("task.dataset.path", str(exc)) from None
    except ValueError as exc:
        raise ConfigError("task.dataset", str(exc)) from None
    if cfg.task.kind == "count_up":
        try:
            tokenizer.encode(cfg.task.count_up.alphabet + ">:")
        except ValueError as exc:
            raise ConfigError("task.count_up.alphabet", str(exc)) from None
        longest = len(cfg.task.count_up.alphabet) + 1
        if cfg.rollout.max_new_tokens < longest:
            raise ConfigError("rollout.max_new_tokens", f"{cfg.rollout.max_new_tokens} cannot fit the longest "
                                                        f"count_up answer ({longest - 1} symbols + EOS)")
    if cfg.task.kind == "calc":
        _check_calc(cfg, tokenizer)
    return source, tokenizer


def _check_calc(cfg: Any, tokenizer: Any) -> None:
    """The calc task's text must encode, and its tool call must fit in one turn."""
    from dynarl.components.tasks.calc import TOOL_ARGUMENT, CalcTask, demonstration
    from dynarl.components.tasks.tool_syntax import call_text
    calc = cfg.task.calc
    problem = CalcTask(calc, cfg.run.seed).problem(0)
    try:
        tokenizer.encode(problem.prompt + "".join(t for t, _ in demonstration(problem, tool=calc.tool)))
    except ValueError as exc:
        raise ConfigError("task.calc", str(exc)) from None
    a, b = calc.digits
    longest_call = len(call_text(calc.tool, TOOL_ARGUMENT[calc.tool].format("9" * (a + 1 + b))))
    if cfg.rollout.max_new_tokens < longest_call:
        raise ConfigError("rollout.max_new_tokens", f"{cfg.rollout.max_new_tokens} cannot fit the longest "
                                                    f"{calc.tool} tool call ({longest_call} tokens)")
