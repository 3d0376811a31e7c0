"""A prepared `dynarl train` job: it runs the workflow in a controller (restarting
lost workers from the newest checkpoint), reports progress, and turns what ends a run
(an interrupt, a lost worker, a failing disk) into one line and an exit code."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import json
import os
import signal
import sys
import time
from typing import Any

import yaml

from dynarl.core.config_tree import to_dict
from dynarl.core.files import atomic_open
from dynarl.transport.errors import DynarlError, RemoteError


def workflow_class(cfg: Any) -> type:
    if cfg.workflow == "agentic" and cfg.agentic.episodes == "agent":
        from dynarl.components.agents.workflow import AgentGRPO
        return AgentGRPO
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
        from dynarl.launch import run_segments
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
        try:
            run_segments.begin(self.run_dir, 0 if self.checkpoint is None else self.checkpoint[1].step)
        except OSError as exc:
            print(f"dynarl train: failed: cannot write the run directory {self.run_dir}: "
                  f"{exc.strerror or exc}", file=sys.stderr)
            return 1
        try:
            return self._segment(runtime, progress, controller, stop, attempt)
        finally:
            with contextlib.suppress(OSError):  # (a full disk: the segment then counts to its last step line)
                run_segments.end(self.run_dir)

    def _segment(self, runtime: Any, progress: Any, controller: Any, stop: Any, attempt: str) -> int:
        """This process's part of the run (a segment: launch/run_segments.py)."""
        import uvloop

        from dynarl.launch import run_segments
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
        walls = run_segments.run_wall_times(self.run_dir, now=time.time())  # (this segment's end: now)
        summary = summarize(os.path.join(self.run_dir, "metrics.jsonl"), walls)
        with open(os.path.join(self.run_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        n = summary["window"]
        steps = f"{n} steps" if n > 1 else "step"
        first, last = (("-" if x is None else f"{x:.3f}") for x in (summary["reward_first"], summary["reward_last"]))
        parts = f" ({len(walls)} segments: {' + '.join(f'{w:.0f}' for w in walls)} s)" if len(walls) > 1 else ""
        print(f"done in {summary['wall_time_s']:.0f} s{parts}: reward first {steps} {first}, last {steps} {last}; "
              f"run directory {self.run_dir}")
        return 0

    async def _main(self, runtime: Any, progress: Any, controller: Any, stop: Any) -> None:
        """The workflow in a controller; a lost worker restarts both from the newest
        checkpoint (launch/recovery.py), up to run.max_restarts times. A node agent's
        controller (multi-node) is entered once: there a lost worker ends the run."""
        from dynarl.components.workflows import checkpoints as ckpt
        from dynarl.core.controller import Controller
        from dynarl.core.run import dump_tasks_on_sigusr1
        from dynarl.launch.recovery import lost_workers, restart_note
        from dynarl.launch.trackers import tracked

        stop.attach()  # the first SIGINT or SIGTERM cancels this task: the controller stops the workers in order
        dump_tasks_on_sigusr1()
        progress = tracked(progress, self.cfg.run.loggers, self.run_dir, to_dict(self.cfg))
        max_restarts = self.cfg.run.max_restarts if controller is None else 0
        checkpoint, restart = self.checkpoint, 0
        dashboard = None
        try:
            dashboard = await self._dashboard(progress)
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
            if dashboard is not None:
                await dashboard.stop()

    async def _dashboard(self, progress: Any) -> Any:
        """run.dashboard: the live dashboard served on this loop from the run directory
        (launch/dashboard/), its address with the job's token printed; None without it."""
        section = self.cfg.run.dashboard
        if section is None:
            return None
        from dynarl.launch.dashboard.server import DashboardServer
        from dynarl.transport.errors import ConfigError
        server = DashboardServer(self.run_dir, host=section.host, port=section.port)
        try:
            await server.start()
        except OSError as exc:  # the port in use, an address not on this machine
            raise ConfigError("run.dashboard", f"cannot serve on {section.host}:{section.port}: "
                                               f"{exc.strerror or exc}") from None
        progress.note(f"dashboard {server.url}")
        return server

    def _draw(self, spans: Any, attempt: str) -> None:
        from dynarl.components.workflows import jsonl
        from dynarl.launch.timeline import draw_timeline, rewards_of
        try:
            draw_timeline(spans, self.cfg.runtime.cluster.num_devices,
                          os.path.join(self.run_dir, f"timeline{attempt}.png"),
                          f"placement {self.workflow.placement.describe()}"
                          + judged_on(self.cfg, self.workflow.placement),
                          rewards_of(jsonl.read(os.path.join(self.run_dir, "metrics.jsonl"))))
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
        from dynarl.components.workflows.judge_checks import describe
        judge = describe(cfg)
        return "planned at start from a profile of each component (placement.json)" + (f"; {judge}" if judge else "")
    from dynarl.components.workflows.judge_checks import describe
    judge = describe(cfg)
    return ", ".join(f"{c} {d}" for c, d in cfg.devices().items()) + (f", {judge}" if judge else "")


def judged_on(cfg: Any, placement: Any) -> str:
    """' | judge [devices] (own or time-shared)' for the timeline's title; '' without a judge."""
    from dynarl.components.workflows.judge_checks import describe
    judge = describe(cfg, placement)
    return f" | {judge}" if judge else ""


def summarize(metrics_path: str, wall_time_s: float | list[float]) -> dict[str, Any]:
    """summary.json. `wall_time_s`: the run's wall time, or each of its segments' (the
    processes that trained it: launch/run_segments.py), whose sum it then is."""
    from dynarl.components.workflows import jsonl

    rows = jsonl.read(metrics_path)
    n = summary_window(len(rows))

    def ends(key: str) -> tuple[float | None, float | None]:
        """The means of the first and last n steps' values (those given: an embodied
        step where no episode has ended yet has none)."""
        first, last = ([v for v in part if v is not None] for part in ([r[key] for r in rows[:n]],
                                                                         [r[key] for r in rows[-n:]]))
        return (sum(first) / len(first) if first else None), (sum(last) / len(last) if last else None)
    segments = wall_time_s if isinstance(wall_time_s, list) else [wall_time_s]
    summary = {"steps": len(rows), "wall_time_s": sum(segments), "wall_time_segments_s": segments, "window": n,
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
