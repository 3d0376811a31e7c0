"""`dynarl bench faults [--json] [--injections N]`: a short `dynarl train` job with
faults injected, side by side with the same job fault-free.

Each kind is one run of the job in this process (its workers are processes), with
`--injections` faults of that kind, each once the job has done two more steps:

    kill-<component>   SIGKILL of the component's first rank (rollout, inference,
                       reward, trainer)
    stop-<component>   SIGSTOP of it (a frozen process: lost at the heartbeat timeout)
    kill-sync          SIGKILL of the rollout's first rank as a weight sync begins
    kill-standby       scheduler.policy=dynarl: SIGKILL of a warm standby trainer rank
    kill-moving        scheduler.policy=dynarl: SIGKILL of the trainer's first rank,
                       whatever move it is in

Per kind: injected, survived (the run finished every step, with no new
`dynarl train`), how: in place (a lost rollout rank replaced within its step,
components/workflows/survival.py) or by restarts from the checkpoint, recovery seconds (injection to the interrupted step trained
again: detection, the ordered stop, the restart from the checkpoint and the steps
retrained; p50 and max), samples lost and duplicated (the ledger against the
fault-free run's), the last steps' mean reward minus the fault-free run's, and
whether every step's tokens equal the fault-free run's (the retrained steps are
replayed from the checkpoint's exact state).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

import yaml

from dynarl.components.workflows.ledger import read_entries
from dynarl.launch.train import prepare

STEPS = 8
JOB = ["runtime.cluster.devices_per_node=3", "rollout.num_ranks=1", "inference.num_ranks=1",
       "trainer.num_ranks=1", "task.count_up.alphabet=abcdefghij", "task.count_up.median_len=2",
       "rollout.max_new_tokens=12", "rollout.samples_per_prompt=4", "rollout.chunk_size=2",
       "run.prompts_per_step=8", "trainer.warmup.steps=4", "trainer.warmup.batch_size=32",
       "trainer.engine.micro_batch_size=32", f"run.steps={STEPS}", "run.checkpoint_every=2",
       "run.max_restarts=8", "runtime.heartbeat_interval_s=0.5", "runtime.heartbeat_timeout_s=2.0",
       "inference.old_logprobs=always"]  # (an inference stage and ranks to hit: kill-inference, stop-inference)
DYNARL = ["runtime.cluster.devices_per_node=4", "placement.mode=hybrid", "rollout.num_ranks=3",
          "scheduler.policy=dynarl", "scheduler.dynarl.interval_s=0.02", "scheduler.dynarl.charge_move_cost=false",
          "scheduler.dynarl.trainer_profile=home"]
KINDS = {"kill-rollout": ("rollout", "SIGKILL", False), "kill-inference": ("inference", "SIGKILL", False),
         "kill-reward": ("reward", "SIGKILL", False), "kill-trainer": ("trainer", "SIGKILL", False),
         "stop-rollout": ("rollout", "SIGSTOP", False), "stop-inference": ("inference", "SIGSTOP", False),
         "stop-reward": ("reward", "SIGSTOP", False), "stop-trainer": ("trainer", "SIGSTOP", False),
         "kill-sync": ("rollout", "SIGKILL", False), "kill-standby": ("trainer~standby", "SIGKILL", True),
         "kill-moving": ("trainer", "SIGKILL", True)}
AT_SYNC = {"kill-sync"}
"""Kinds injected when the weight sync begins (the workflow's "sync" stage), not at a step's start."""
TIMEOUT_S = 300.0


def _overrides(args: list[str]) -> list[tuple[str, Any]]:
    return [(k, yaml.safe_load(v)) for k, _, v in (a.partition("=") for a in args)]


def _rows(path: str) -> int:
    try:
        with open(path) as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def _target(job: Any, component: str) -> int | None:
    """The pid to hit: the component's first rank (a standby: the first parked one)."""
    workflow = job.workflow
    if component == "trainer~standby":
        groups = [g for name, g in list(workflow.ctl.groups.items()) if name.startswith("trainer~standby")]
    else:
        groups = [getattr(workflow.g, component)]
    pids = [h.pid for g in groups if g is not None for h in g.handles if h.alive and h.pid]
    return pids[0] if pids else None


def _at_sync(job: Any, stop: threading.Event) -> threading.Event:
    """Set whenever the job's weight sync begins (its workflow's clock reports the "sync"
    stage; the clock of each restarted attempt's workflow too). `stop` ends the watch."""
    synced = threading.Event()

    def watch() -> None:
        hooked = None
        while not stop.is_set():
            workflow = job.workflow
            if workflow is not None and workflow is not hooked:
                clock = workflow.clock
                before = clock.on_stage

                def on_stage(name: str, before=before) -> None:
                    if name == "sync":
                        synced.set()
                    if before is not None:
                        before(name)
                clock.on_stage = on_stage
                hooked = workflow
            time.sleep(0.005)
    threading.Thread(target=watch, daemon=True).start()
    return synced


def run_job(run_dir: str, args: list[str], component: str | None = None, sig: str | None = None,
            injections: int = 0, at_sync: bool = False) -> dict:
    """Runs the job (in a thread; its workers are processes) and injects the faults
    (`at_sync`: each when a weight sync begins, once the steps are done)."""
    job = prepare(None, _overrides(args), run_dir, None)
    watching = threading.Event()
    synced = _at_sync(job, watching) if at_sync else None
    metrics = os.path.join(run_dir, "metrics.jsonl")
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(job.run()), daemon=True)
    begun = time.perf_counter()
    thread.start()
    recoveries, injected = [], 0
    deadline = time.monotonic() + TIMEOUT_S
    for n in range(injections):
        at = 2 * n + 2  # after every two steps
        while thread.is_alive() and _rows(metrics) < at and time.monotonic() < deadline:
            time.sleep(0.01)
        if synced is not None:  # the next weight sync's start
            synced.clear()
            while thread.is_alive() and not synced.wait(0.01) and time.monotonic() < deadline:
                pass
        for _ in range(100):  # a standby may be adopted (or a rank replaced) meanwhile: the next one
            pid = _target(job, component) if thread.is_alive() else None
            try:
                if pid is not None:
                    os.kill(pid, getattr(signal, sig))
                    break
            except ProcessLookupError:
                pass
            time.sleep(0.01)
        else:
            break
        injected += 1
        hit = time.perf_counter()
        while thread.is_alive() and _rows(metrics) <= at and time.monotonic() < deadline:
            time.sleep(0.01)  # back to where it was: the interrupted step trained
        recoveries.append(time.perf_counter() - hit)
    thread.join(max(0.0, deadline - time.monotonic()))
    watching.set()
    rows = [json.loads(line) for line in open(metrics)] if os.path.exists(metrics) else []
    entries = read_entries(os.path.join(run_dir, "ledger.jsonl")) if os.path.exists(
        os.path.join(run_dir, "ledger.jsonl")) else []
    restarts = sum(1 for name in os.listdir(run_dir) if name.startswith("trace-restart-"))
    return {"rc": result[0] if result else None, "wall_s": time.perf_counter() - begun, "injected": injected,
            "recovery_s": recoveries, "rows": rows, "entries": entries, "restarts": restarts}


def finished(run: dict) -> bool:
    """The job ended well and trained every step."""
    return run["rc"] == 0 and [r["step"] for r in run["rows"]] == list(range(STEPS))


def compare(kind: str, faulty: dict, clean: dict) -> dict:
    ids = [i for e in faulty["entries"] for i in e.sample_ids]
    expected = {i for e in clean["entries"] for i in e.sample_ids}
    last = lambda run: statistics.fmean(r["reward_mean"] for r in run["rows"][-2:]) if run["rows"] else float("nan")
    rec = faulty["recovery_s"]
    if not finished(clean):  # nothing to compare with: no figure rather than a vacuous "0 lost"
        return {"kind": kind, "injected": faulty["injected"], "survived": finished(faulty),
                "recovery_s_p50": statistics.median(rec) if rec else None, "recovery_s_max": max(rec) if rec else None,
                "samples_lost": None, "samples_duplicated": None, "reward_delta": None, "same_tokens": None,
                "in_place": sum(r.get("survived", 0) for r in faulty["rows"]), "restarts": faulty.get("restarts", 0),
                "wall_s": faulty["wall_s"], "baseline_failed": True}
    return {"kind": kind, "injected": faulty["injected"],
            "survived": finished(faulty),
            "recovery_s_p50": statistics.median(rec) if rec else None, "recovery_s_max": max(rec) if rec else None,
            "samples_lost": len(expected - set(ids)), "samples_duplicated": len(ids) - len(set(ids)),
            "reward_delta": last(faulty) - last(clean),
            "same_tokens": [e.digests for e in faulty["entries"]] == [e.digests for e in clean["entries"]],
            "in_place": sum(r.get("survived", 0) for r in faulty["rows"]), "restarts": faulty.get("restarts", 0),
            "wall_s": faulty["wall_s"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dynarl bench faults", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--injections", type=int, default=2, help="faults per kind (default 2)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated kinds (default: all)")
    args = parser.parse_args(argv)
    kinds = args.kinds.split(",")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or args.injections < 1:
        parser.error(f"unknown kinds {unknown}; choose from {', '.join(KINDS)}" if unknown
                     else "--injections must be >= 1")
    report = []
    # the jobs' progress lines go to stderr: stdout is the report's
    with tempfile.TemporaryDirectory(prefix="dynarl-faults-") as tmp, contextlib.redirect_stdout(sys.stderr):
        clean = {}
        for dynarl in sorted({KINDS[k][2] for k in kinds}):
            config = JOB + (DYNARL if dynarl else [])
            print(f"fault-free run{' (dynarl)' if dynarl else ''}", file=sys.stderr, flush=True)
            clean[dynarl] = run_job(os.path.join(tmp, f"clean-{int(dynarl)}"), config)
            if not finished(clean[dynarl]):
                print(f"the fault-free run{' (dynarl)' if dynarl else ''} failed (rc {clean[dynarl]['rc']}): its "
                      "kinds are reported without lost/duplicated/token figures, and the bench fails",
                      file=sys.stderr, flush=True)
        for kind in kinds:
            component, sig, dynarl = KINDS[kind]
            print(f"{kind}: {args.injections} injections", file=sys.stderr, flush=True)
            faulty = run_job(os.path.join(tmp, kind), JOB + (DYNARL if dynarl else []), component, sig,
                             args.injections, at_sync=kind in AT_SYNC)
            report.append(compare(kind, faulty, clean[dynarl]))
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"{'kind':<16}{'injected':>9}{'survived':>9}{'in place':>9}{'restarts':>9}{'recov p50':>10}"
              f"{'recov max':>10}{'lost':>6}{'dup':>5}{'reward Δ':>10}{'same tokens':>12}")
        for r in report:
            void = r.get("baseline_failed", False)
            print(f"{r['kind']:<16}{r['injected']:>9}{str(r['survived']):>9}{r['in_place']:>9}{r['restarts']:>9}"
                  f"{r['recovery_s_p50'] or 0:>10.1f}{r['recovery_s_max'] or 0:>10.1f}"
                  + ("   (the fault-free run failed: nothing to compare)" if void else
                     f"{r['samples_lost']:>6}{r['samples_duplicated']:>5}{r['reward_delta']:>10.4f}"
                     f"{str(r['same_tokens']):>12}"))
    return 0 if all(r["survived"] and r["injected"] == args.injections and not r.get("baseline_failed")
                    for r in report) else 1


if __name__ == "__main__":
    sys.exit(main())
