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
data_report.json, trace.json (Perfetto / chrome://tracing), spans.jsonl (who held
which device when, a line per step), timeline.png, samples_text.jsonl (run.log_samples),
checkpoints/, summary.json, run.lock (its owner: one job at a time trains in it,
launch/run_dir.py).
"""
from __future__ import annotations

import sys
from typing import Any

import yaml

from dynarl.components.workflows.old_logprobs import describe
from dynarl.launch.train_job import Job, placed, summarize, summary_window
from dynarl.launch.train_prepare import (RunDirUnwritable, UsageError, check_backends_of, check_memory,
                                         check_tools, check_wired_of, prepare, resolve_config)
from dynarl.transport.errors import ConfigError

__all__ = ["Job", "RunDirUnwritable", "USAGE", "UsageError", "check_memory", "dry_run_report", "main",
           "parse_args", "parse_override", "prepare", "resolve_config", "summarize", "summary_window"]

USAGE = "usage: dynarl train [CONFIG.yaml] [key.path=value ...] [--run-dir DIR] [--resume DIR] [--dry-run]"

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
              describe(cfg),
              f"model: {cfg.model.path or cfg.model.name} ({cfg.model.config().num_parameters / 1e6:.1f}M parameters)"]
    from dynarl.launch.trackers import missing_packages
    lines += [f"note: {n}" for n in notes + missing_packages(cfg.run.loggers)]
    try:
        check_wired_of(cfg)
    except ConfigError as exc:  # valid, but `dynarl train` would refuse to start it
        lines.append(f"note: not trainable yet: {exc}")
    try:
        check_tools(cfg)
    except ConfigError as exc:
        lines.append(f"note: would not start: {exc}")
    if cfg.task.kind == "dataset":
        lines.append(f"note: dataset {cfg.task.dataset.path} not read in a dry run")
    from dynarl.components.memory.of_config import plan_of
    from dynarl.components.memory.table import format_plan
    plan = plan_of(cfg)
    if plan is not None:
        lines.append(format_plan(plan))
    return "\n".join(lines)


def parse_override(arg: str) -> tuple[str, Any]:
    """key=value, the value read as YAML (a number, 3e-4 included: core/yaml_config.py;
    a list, ...), else as text."""
    from dynarl.core import yaml_config
    key, _, text = arg.partition("=")
    try:
        return key, yaml_config.load(text) if text else ""
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
