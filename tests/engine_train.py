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


def moves_and_trains_the_static_runs_samples(tmp_path, train_fn, *args, steps: int = 2) -> list[dict]:
    """`train_fn(run, *args, steps=)` static, then with scheduler.policy=dynarl moving
    engines mid-step (FAST): some step moved rollout requests (Workload), and each step
    trained the static run's samples, once. The static run's rows."""
    rows, static = train_fn(tmp_path / "static", *args, steps=steps)
    moved_rows, moved = train_fn(tmp_path / "dynarl", *args, "scheduler.policy=dynarl", *FAST, steps=steps)
    assert any(r["migrations"].get("workload:rollout") for r in moved_rows), [r["migrations"] for r in moved_rows]
    same_samples(static, moved)
    return rows


def agentic_args(prompts: int, samples: int) -> list[str]:
    """The agentic workflow (tool episodes, DynaRL's priority queue) on MOVING's devices."""
    return ["workflow=agentic", "task.kind=calc", "agentic.queue=priority", f"run.prompts_per_step={prompts}",
            f"rollout.samples_per_prompt={samples}", "rollout.max_new_tokens=16", *MOVING[:5]]


def refuses_a_model_it_cannot_serve(tmp_path, backend: str) -> None:
    """rollout.<backend>.model_path naming a folder without the model: one line at config
    load, rc 2."""
    (tmp_path / "empty").mkdir()
    done = run_cli(tmp_path / "run", f"rollout.backend={backend}",
                   f"rollout.{backend}.model_path={tmp_path / 'empty'}", timeout_s=120)
    assert done.returncode == 2, done.stdout[-2000:]
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert lines == [f"dynarl train: error: rollout.{backend}.model_path: the engine cannot load the model in "
                     f"'{tmp_path / 'empty'}': no config.json in {tmp_path / 'empty'}"], lines
