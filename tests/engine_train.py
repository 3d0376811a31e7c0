"""`dynarl train` on a real engine, for the real-engine suites (tests/test_vllm_train.py,
tests/test_sglang_real_train.py; run by .ci/engines in each engine's venv): the run in
a session of its own, its rows and ledger, nothing of it (workers, the engines'
processes) left running."""
import json
import os
import subprocess
import sys

import psutil

from dynarl.components.workflows.ledger import read_entries

MOVING = ["runtime.cluster.devices_per_node=4", "placement.mode=hybrid", "rollout.num_ranks=3", "inference.num_ranks=1",
          "trainer.num_ranks=1", "rollout.max_new_tokens=48", "rollout.samples_per_prompt=8"]
"""Three engines on devices of their own beside the inference and trainer ranks: room for
scheduler.policy=dynarl to release engines mid-step."""
FAST = ["scheduler.dynarl.interval_s=0.02", "scheduler.dynarl.charge_move_cost=false",
        "scheduler.dynarl.trainer_profile=home", "scheduler.dynarl.pack=8", "scheduler.dynarl.theta=0.6"]
"""The DynaRL scheduler deciding at once, so a short test run moves engines."""


def session_processes(sid: int) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                found.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            pass
    return found


def run_cli(run, *args, timeout_s: float = 900) -> subprocess.CompletedProcess:
    """`dynarl train ARGS --run-dir RUN` in a session of its own; its rc and output, and
    no process of its session left running."""
    proc = subprocess.Popen([sys.executable, "-m", "dynarl.launch.cli", "train", *args, "--run-dir", str(run)],
                            cwd=run.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            out = ""
    left = psutil.wait_procs(session_processes(proc.pid), timeout=20)[1]
    for p in left:
        p.kill()
    assert not left, f"processes of the run left running: {[p.pid for p in left]}"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out)


def train(run, *args, steps: int):
    """A run that must succeed: its metrics rows and ledger entries, one per step, every
    step's weights in the engines (weight_version equal to the step)."""
    done = run_cli(run, f"run.steps={steps}", "trainer.warmup.steps=2", *args)
    assert done.returncode == 0, done.stdout[-4000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(steps))
    assert all(r["weight_version"] == r["step"] for r in rows)
    entries = read_entries(str(run / "ledger.jsonl"))
    assert [e.step for e in entries] == list(range(steps))
    return rows, entries


def same_samples(static, moved) -> None:
    """Each step of the moved run trained the static run's samples, each once."""
    for s, d in zip(static, moved, strict=True):
        assert sorted(d.sample_ids) == sorted(s.sample_ids) and len(set(d.sample_ids)) == len(d.sample_ids)
