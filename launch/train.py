"""`dynarl train [CONFIG] [key=value ...] [--run-dir DIR] [--resume DIR] [--dry-run]`

Runs GRPO end to end: config -> validation -> run directory -> workers ->
warm start -> steps -> checkpoints. With no arguments it trains the built-in
count-up task on the tiny model on CPU.

Everything a user can get wrong (unknown key, wrong type, a placement that does
not fit the devices, a missing dataset file) is checked before any worker
starts and reported as one line naming the field, exit code 2, no traceback.
Malformed dataset rows are skipped, counted and reported.

`--dry-run` resolves and validates the config and the placement, checks the
backends' layouts, prints the result and exits: no worker, no tokenizer, no
dataset read (a cluster config can be checked on a laptop). Optional extras
that are missing (sglang, megatron) are then notes, not errors.

The run directory holds: config.yaml (resolved), metrics.jsonl (one object per
step), ledger.jsonl (samples trained per step), graph.json (the runtime hypergraph
after the last step), placement.json (placement.mode=auto: profile and plan),
data_report.json, trace.json (Perfetto / chrome://tracing), timeline.png,
checkpoints/, summary.json, run.lock (its owner: one job at a time trains in it,
launch/run_dir.py).
"""
from __future__ import annotations

import asyncio
import errno
import json
import os
import sys
import time
from typing import Any

import yaml

from dynarl.core.files import atomic_open
from dynarl.transport.errors import ConfigError, DynarlError, RemoteError

USAGE = "usage: dynarl train [CONFIG.yaml] [key.path=value ...] [--run-dir DIR] [--resume DIR] [--dry-run]"


class UsageError(Exception):
    pass


class RunDirUnwritable(OSError):
    """The run directory cannot be made or locked (read-only, no space, refused): exit 1."""


def main(argv: list[str]) -> int:
    dry_run = "--dry-run" in argv
    argv = [a for a in argv if a != "--dry-run"]
    try:
        args = parse_args(argv)
        if args is None:
            print(USAGE + "\n\n" + __doc__.split("\n\n", 1)[1])
            return 0
        if dry_run:
            print(dry_run_report(*args))
            check_memory(resolve_config(*args[:2], args[3]))
            return 0
        job = prepare(*args)
    except (UsageError, ConfigError) as exc:
        print(f"dynarl train: error: {exc}", file=sys.stderr)
        return 2
    except RunDirUnwritable as exc:
        print(f"dynarl train: failed: {exc}", file=sys.stderr)
        return 1
    return job.run()


def dry_run_report(config_path: str | None, overrides: list[tuple[str, Any]], run_dir: str | None,
                   resume: str | None) -> str:
    cfg = resolve_config(config_path, overrides, resume)
    notes = check_backends_of(cfg, require_installed=False)
    cluster = cfg.runtime.cluster
    lines = ["dry run: config valid; nothing started",
             f"cluster: {cluster.num_nodes} node(s) x {cluster.devices_per_node} {cluster.device_kind} devices, "
             f"launcher {cfg.runtime.launcher}",
             f"placement {cfg.placement.mode}: " + placed(cfg)]
    if cfg.workflow == "embodied":  # no model, task or engines: envs and a small policy
        e = cfg.embodied
        lines.append(f"workflow embodied, env {e.env_id}: {e.env_workers} env workers x {e.envs_per_worker} envs, "
                     f"horizon {e.horizon}, MLP {e.hidden} x 2 (env not built in a dry run)")
        return "\n".join(lines)
    lines += [f"workflow {cfg.workflow}, task {cfg.task.kind}",
              f"backends: rollout {cfg.rollout.backend}, trainer {cfg.trainer.backend}; "
              f"scheduler {cfg.scheduler.policy}",
              f"model: {cfg.model.path or cfg.model.name} ({cfg.model.config().num_parameters / 1e6:.1f}M parameters)"]
    from dynarl.launch.trackers import missing_packages
    lines += [f"note: {n}" for n in notes + missing_packages(cfg.run.loggers)]
    try:
        check_wired_of(cfg)
    except ConfigError as exc:  # valid, but `dynarl train` would refuse to start it
        lines.append(f"note: not trainable yet: {exc}")
    if cfg.task.kind == "dataset":
        lines.append(f"note: dataset {cfg.task.dataset.path} not read in a dry run")
    from dynarl.components.memory.of_config import plan_of
    from dynarl.components.memory.table import format_plan
    plan = plan_of(cfg)
    if plan is not None:
        lines.append(format_plan(plan))
    return "\n".join(lines)


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


def check_backends_of(cfg: Any, require_installed: bool) -> list[str]:
    """Backend checks at config load: a missing extra names the pip command."""
    from dynarl.components.backends import check_backends
    return check_backends(rollout_backend=cfg.rollout.backend, trainer_backend=cfg.trainer.backend,
                          model=cfg.model.config(), rollout_ranks=cfg.rollout.num_ranks,
                          trainer_ranks=cfg.trainer.num_ranks, sglang=cfg.rollout.sglang, vllm=cfg.rollout.vllm,
                          megatron=cfg.trainer.megatron, require_installed=require_installed)


def resolve_config(config_path: str | None, overrides: list[tuple[str, Any]], resume: str | None) -> Any:
    """The TrainConfig a command line names: CONFIG (or the defaults) with overrides,
    or with --resume DIR that run's own config.yaml."""
    from dynarl.components.workflows.config import load_config
    if resume is not None:
        config_path = os.path.join(resume, "config.yaml")
    return load_config(_read_yaml(config_path) if config_path else None, overrides)


def check_wired_of(cfg: Any) -> None:
    """The workers build their engines through components/engine_factory.py; backend
    combinations they cannot train with yet raise ConfigError, naming the field."""
    from dynarl.components.backends import check_wired
    check_wired(rollout_backend=cfg.rollout.backend, trainer_backend=cfg.trainer.backend,
                megatron=cfg.trainer.megatron, device_kind=cfg.runtime.cluster.device_kind)


def parse_override(arg: str) -> tuple[str, Any]:
    """key=value, the value read as YAML (a number, a list, ...), else as text."""
    key, _, text = arg.partition("=")
    try:
        return key, yaml.safe_load(text) if text else ""
    except yaml.YAMLError:
        return key, text


def parse_args(argv: list[str]) -> tuple[str | None, list[tuple[str, Any]], str | None, str | None] | None:
    config_path = run_dir = resume = None
    overrides: list[tuple[str, Any]] = []
    it = iter(argv)
    for arg in it:
        if arg in ("-h", "--help"):
            return None
        if arg in ("--run-dir", "--resume"):
            value = next(it, None)
            if value is None:
                raise UsageError(f"{arg} needs a directory\n{USAGE}")
            if arg == "--run-dir":
                run_dir = value
            else:
                resume = value
        elif arg.startswith("--"):
            raise UsageError(f"unknown option {arg}\n{USAGE}")
        elif "=" in arg:
            overrides.append(parse_override(arg))
        elif config_path is None:
            config_path = arg
        else:
            raise UsageError(f"more than one config file given ({config_path!r}, {arg!r})\n{USAGE}")
    if resume is not None and (config_path is not None or run_dir not in (None, resume)):
        raise UsageError("--resume DIR continues the run in DIR with its own config.yaml; "
                         "give only key=value overrides beside it")
    return config_path, overrides, run_dir, resume


def prepare(config_path: str | None, overrides: list[tuple[str, Any]], run_dir: str | None,
            resume: str | None) -> "Job":
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
             resume: str | None) -> "Job":
    from dynarl.components.workflows import checkpoints as ckpt
    from dynarl.components.workflows.partial import resume_refused

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
        refused = resume_refused(checkpoint[0], cfg.rollout.oversample) or ckpt.workflow_refused(
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
            return yaml.safe_load(f)
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


# --- task / workflow selection (the agentic workflow) -----------------------------------
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


def workflow_class(cfg: Any) -> type:
    if cfg.workflow == "agentic":
        from dynarl.components.workflows.agentic import AgenticGRPO
        return AgenticGRPO
    if cfg.workflow == "ppo":
        from dynarl.components.workflows.ppo import PPO
        return PPO
    if cfg.workflow == "embodied":
        from dynarl.components.workflows.embodied import Embodied
        return Embodied
    from dynarl.components.workflows.grpo import GRPO
    return GRPO


class Job:
    def __init__(self, cfg: Any, source: Any, tokenizer: Any, run_dir: str, checkpoint: Any) -> None:
        self.cfg, self.source, self.tokenizer = cfg, source, tokenizer
        self.run_dir, self.checkpoint = run_dir, checkpoint
        self.workflow: Any = None
        self.lock: Any = None
        """The run directory's lock (launch/run_dir.py), held until run() ends."""

    def _how_to_continue(self) -> str:
        from dynarl.components.workflows import checkpoints as ckpt
        found = ckpt.latest_checkpoint(self.run_dir)
        if found is not None:
            return f"continue from step {found[1].step} with: dynarl train --resume {self.run_dir}"
        return (f"no checkpoint was written yet (run.checkpoint_every={self.cfg.run.checkpoint_every}), so "
                f"there is nothing to resume: start again with another --run-dir, or remove {self.run_dir}")

    def run(self, controller: Any = None) -> int:
        """controller(runtime): an async context manager giving the Controller; None =
        `Controller(runtime)` (the node agent passes one built on its AgentLauncher).
        The first SIGINT or SIGTERM from here on stops the workers in order, later ones
        change nothing (OrderedStop). The run directory is released when it returns."""
        from dynarl.core.run import OrderedStop
        from dynarl.launch.local import TERM_WAIT_S

        stop = OrderedStop("dynarl train", bound_s=self.cfg.runtime.shutdown_grace_s + TERM_WAIT_S)
        try:
            with stop:
                return self._run(controller, stop)
        finally:
            if self.lock is not None:
                self.lock.release()

    def _run(self, controller: Any, stop: Any) -> int:
        import dataclasses
        import signal

        import uvloop

        from dynarl.core.config_tree import to_dict
        from dynarl.launch.progress import make_progress

        try:
            os.makedirs(self.run_dir, exist_ok=True)
            # whole or not at all: other nodes' agents read config.yaml on --resume meanwhile
            with atomic_open(os.path.join(self.run_dir, "config.yaml")) as f:
                yaml.safe_dump(to_dict(self.cfg), f, sort_keys=False)
            if self.cfg.workflow != "embodied":  # (its data are env steps)
                report = {"task": self.cfg.task.kind, "report": self.source.report,
                          "skipped": [{"row": n, "reason": why} for n, why in self.source.skipped]}
                with atomic_open(os.path.join(self.run_dir, "data_report.json")) as f:
                    json.dump(report, f, indent=1)
        except OSError as exc:
            print(f"dynarl train: failed: cannot write the run directory {self.run_dir}: "
                  f"{exc.strerror or exc}", file=sys.stderr)
            return 1
        attempt = "" if self.checkpoint is None else f"-resume-{self.checkpoint[1].step}"
        runtime = dataclasses.replace(self.cfg.runtime,
                                      trace_path=os.path.join(self.run_dir, f"trace{attempt}.json"))
        progress = make_progress(self.cfg.run.steps)
        started = time.perf_counter()
        with progress:
            progress.note(f"run directory {self.run_dir}; placement {self.cfg.placement.mode}: {placed(self.cfg)} "
                          f"on {self.cfg.runtime.cluster.num_devices} devices")
            if self.source.report:
                progress.note(f"dataset: {self.source.report}")
            try:
                uvloop.run(self._main(runtime, progress, controller, stop))
            except KeyboardInterrupt:  # (SIGINT where OrderedStop left it to asyncio: not the main thread)
                print(f"dynarl train: interrupted; {self._how_to_continue()}", file=sys.stderr)
                return 130
            except asyncio.CancelledError:  # the first SIGINT or SIGTERM: workers were stopped in order
                how = "interrupted" if stop.received == signal.SIGINT else "terminated"
                print(f"dynarl train: {how}; {self._how_to_continue()}", file=sys.stderr)
                return 130 if how == "interrupted" else 143
            except (DynarlError, OSError) as exc:  # a worker failed or was lost: its own traceback is in the message
                disk = disk_failure(exc)
                if disk is not None:
                    print(f"dynarl train: failed: {disk} in {self.run_dir} ({_first_line(exc)}); "
                          f"once it is fixed, {self._how_to_continue()}", file=sys.stderr)
                    return 1
                if isinstance(exc, OSError):
                    raise
                print(f"dynarl train: failed: {exc}", file=sys.stderr)
                return 1
            finally:
                if self.workflow is not None and self.workflow.placement is not None:  # auto: once planned
                    self._draw(self.workflow.clock.spans, attempt)
        summary = summarize(os.path.join(self.run_dir, "metrics.jsonl"), time.perf_counter() - started)
        with open(os.path.join(self.run_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        n = summary["window"]
        steps = f"{n} steps" if n > 1 else "step"
        first, last = (("-" if x is None else f"{x:.3f}") for x in (summary["reward_first"], summary["reward_last"]))
        print(f"done in {summary['wall_time_s']:.0f} s: reward first {steps} {first}, last {steps} {last}; "
              f"run directory {self.run_dir}")
        return 0

    async def _main(self, runtime: Any, progress: Any, controller: Any, stop: Any) -> None:
        """The workflow in a controller; a lost worker restarts both from the newest
        checkpoint (launch/recovery.py), up to run.max_restarts times. A node agent's
        controller (multi-node) is entered once: there a lost worker ends the run."""
        import dataclasses

        from dynarl.components.workflows import checkpoints as ckpt
        from dynarl.core.config_tree import to_dict
        from dynarl.core.controller import Controller
        from dynarl.core.run import dump_tasks_on_sigusr1
        from dynarl.launch.recovery import lost_workers, restart_note
        from dynarl.launch.trackers import tracked

        stop.attach()  # the first SIGINT or SIGTERM cancels this task: the controller stops the workers in order
        dump_tasks_on_sigusr1()
        progress = tracked(progress, self.cfg.run.loggers, self.run_dir, to_dict(self.cfg))
        max_restarts = self.cfg.run.max_restarts if controller is None else 0
        checkpoint, restart = self.checkpoint, 0
        try:
            while True:
                attempt = runtime if restart == 0 else dataclasses.replace(
                    runtime, trace_path=runtime.trace_path.removesuffix(".json") + f"-restart-{restart}.json")
                async with (controller or Controller)(attempt) as ctl:
                    if getattr(ctl, "swept", None):
                        progress.note(swept_note(ctl.swept))
                    self.workflow = workflow_class(self.cfg)(ctl, self.cfg, self.source, self.tokenizer,
                                                             self.run_dir, progress)
                    try:
                        await self.workflow.run(checkpoint)
                        return
                    except Exception as exc:
                        lost = await lost_workers(ctl) if restart < max_restarts else []
                        if not lost:
                            raise
                        failure = exc
                # every worker of the failed attempt is stopped (the controller's exit)
                restart += 1
                checkpoint = ckpt.resume_checkpoint(self.run_dir, progress.note)
                progress.note(restart_note(lost, failure, restart, max_restarts,
                                           None if checkpoint is None else checkpoint[1].step))
        finally:
            progress.close()

    def _draw(self, spans: Any, attempt: str) -> None:
        from dynarl.launch.timeline import draw_timeline
        try:
            draw_timeline(spans, self.cfg.runtime.cluster.num_devices,
                          os.path.join(self.run_dir, f"timeline{attempt}.png"),
                          f"placement {self.workflow.placement.describe()}")
        except Exception as exc:  # the picture must never cost the run's result
            print(f"dynarl train: timeline not drawn: {exc!r}", file=sys.stderr)


DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EIO)
"""What a run directory's disk can do to a run: full, over quota, read-only, refused, failing."""


def disk_failure(exc: BaseException) -> str | None:
    """'no space left on device' (etc.) when `exc`, or an error it came from, is the
    run directory's disk failing here or in a worker (a RemoteError names it in its
    message: a worker's checkpoint write); None otherwise."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS:
            return os.strerror(exc.errno).lower()
        if isinstance(exc, RemoteError):
            for code in DISK_ERRNOS:
                if os.strerror(code) in exc.remote_message:
                    return os.strerror(code).lower()
        exc = exc.__cause__ or exc.__context__
    return None


def swept_note(paths: list[str]) -> str:
    """The temp dirs of dead processes the controller removed at start, in one line."""
    shown = ", ".join(os.path.basename(p) for p in paths[:3]) + (", ..." if len(paths) > 3 else "")
    return (f"removed {len(paths)} temp dir{'s' if len(paths) > 1 else ''} that dead dynarl processes left "
            f"in {os.path.dirname(paths[0])} ({shown})")


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def placed(cfg: Any) -> str:
    """Each component's devices, or for placement.mode auto when they are chosen."""
    if cfg.workflow == "embodied":
        from dynarl.components.placement.embodied import place
        return place(cfg.placement.mode, cfg.embodied.env_workers, cfg.runtime.cluster.num_devices).describe()
    if cfg.placement.mode == "auto":
        return "planned at start from a profile of each component (placement.json)"
    return ", ".join(f"{c} {d}" for c, d in cfg.devices().items())


def summarize(metrics_path: str, wall_time_s: float) -> dict[str, Any]:
    from dynarl.components.workflows import jsonl

    rows = jsonl.read(metrics_path)
    n = summary_window(len(rows))

    def ends(key: str) -> tuple[float | None, float | None]:
        """The means of the first and last n steps' values (those given: an embodied
        step where no episode has ended yet has none)."""
        first, last = ([v for v in part if v is not None] for part in ([r[key] for r in rows[:n]],
                                                                         [r[key] for r in rows[-n:]]))
        return (sum(first) / len(first) if first else None), (sum(last) / len(last) if last else None)
    summary = {"steps": len(rows), "wall_time_s": wall_time_s, "window": n,
               "step_time_s_mean": sum(r["step_time_s"] for r in rows) / len(rows)}
    rate = "env_steps_per_s" if "env_steps_per_s" in rows[0] else "tokens_per_s"  # embodied: env steps
    summary[f"{rate}_mean"] = sum(r[rate] for r in rows) / len(rows)
    summary["reward_first"], summary["reward_last"] = ends("reward_mean")
    if "success_rate" in rows[0] and all("success_rate" in r for r in rows):
        summary["success_rate_first"], summary["success_rate_last"] = ends("success_rate")
    if "tool_call_rate" in rows[0]:  # the agentic workflow: how often episodes used a tool
        summary["tool_call_rate_first"], summary["tool_call_rate_last"] = ends("tool_call_rate")
    return summary


def summary_window(steps: int) -> int:
    """How many steps the summary's first and last means take: 10, fewer in a run of
    under 20 steps so that the two do not overlap (all of it for a 1-step run)."""
    return max(1, min(10, steps // 2))
