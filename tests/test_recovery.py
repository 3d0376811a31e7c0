"""A lost worker does not end `dynarl train`: every worker restarts from the newest
checkpoint in the same process (launch/recovery.py), the steps since are trained
again, and the ledger holds every sample of every step once."""
NUM_GPUS = 0

import json
import os
import signal
import threading
import time

from conftest import assert_reaped
from dynarl.components.workflows.ledger import read_entries
from dynarl.launch.train import prepare
from grpo_tiny import overrides

STEPS = 5


def _rows(path):
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


def _run_and_kill(run_dir, component, *extra):
    """Runs the job in a thread; SIGKILLs `component`'s first rank once three steps are
    done (the checkpoint is after the second: the third is trained again). Returns the job's exit code and every pid the
    job's groups held."""
    job = prepare(None, overrides(f"run.steps={STEPS}", "run.checkpoint_every=2", *extra), run_dir, None)
    rc, pids = [], set()
    thread = threading.Thread(target=lambda: rc.append(job.run()))
    thread.start()
    try:
        metrics = os.path.join(run_dir, "metrics.jsonl")
        deadline = time.monotonic() + 120
        while len(_rows(metrics)) < 3 and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        group = getattr(job.workflow.g, component)
        pids.update(group.pids)
        os.kill(group.pids[0], signal.SIGKILL)
        while thread.is_alive():
            if job.workflow is not None and job.workflow.g is not None:
                groups = job.workflow.g
                for g in (groups.rollout, groups.reward, groups.inference, groups.trainer):
                    pids.update(p for p in (g.pids if g is not None else []) if p is not None)
            time.sleep(0.05)
    finally:
        thread.join()
    return rc[0], pids


def test_a_killed_trainer_rank_restarts_the_run_from_its_checkpoint(tmp_path):
    run_dir = str(tmp_path / "run")
    rc, pids = _run_and_kill(run_dir, "trainer")
    assert rc == 0
    assert_reaped(sorted(pids))  # the killed attempt's workers and the restarted ones
    rows = _rows(os.path.join(run_dir, "metrics.jsonl"))
    assert [r["step"] for r in rows] == list(range(STEPS))
    entries = read_entries(os.path.join(run_dir, "ledger.jsonl"))
    assert [e.step for e in entries] == list(range(STEPS))  # every step once
    ids = [i for e in entries for i in e.sample_ids]
    assert len(ids) == len(set(ids)) == STEPS * 8 * 4  # every sample once
    # the steps after the checkpoint that the lost attempt had done were rolled back and
    # trained again from the same state: the same samples, tokens and rewards
    redone = _rows(os.path.join(run_dir, "metrics.rolled_back.jsonl"))
    assert [r["step"] for r in redone][:1] == [2] and all(r["step"] >= 2 for r in redone), redone
    by_step = {r["step"]: r for r in rows}
    for r in redone:
        assert (r["tokens"], r["reward_mean"]) == (by_step[r["step"]]["tokens"], by_step[r["step"]]["reward_mean"])
    assert os.path.exists(os.path.join(run_dir, "trace-restart-1.json"))


def test_without_restarts_a_lost_worker_ends_the_run(tmp_path, capsys):
    """(run.survive false: a lost rollout rank is not replaced in place, tests/test_survival.py)"""
    run_dir = str(tmp_path / "run")
    rc, pids = _run_and_kill(run_dir, "rollout", "run.max_restarts=0", "run.survive=false")
    assert rc == 1
    assert_reaped(sorted(pids))
    err = capsys.readouterr().err
    assert "dynarl train: failed:" in err and "rollout[0] lost" in err, err[-2000:]
    assert not os.path.exists(os.path.join(run_dir, "trace-restart-1.json"))
