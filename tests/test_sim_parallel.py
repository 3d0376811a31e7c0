NUM_GPUS = 0
"""launch/sim/parallel.py: independent simulator runs in forked children give the
results, in order, that running them here gives; a failing run is reported with its
traceback and takes the others down; no child outlives the call. And `dynarl sim`
prints the same JSON with one job as with several."""
import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from conftest import assert_reaped, marked_processes
from dynarl.launch.sim.parallel import ChildFailed, default_jobs, run_all


def square(n):
    return lambda: {"n": n, "square": n * n, "pid": os.getpid()}


def test_results_come_back_in_task_order_from_children():
    seen = []
    out = run_all([square(n) for n in range(5)], jobs=2, on_done=lambda i, r: seen.append(i))
    assert [r["square"] for r in out] == [0, 1, 4, 9, 16]
    assert all(r["pid"] != os.getpid() for r in out)  # each ran in a child
    assert sorted(seen) == [0, 1, 2, 3, 4]
    assert_reaped([r["pid"] for r in out])


def test_one_job_runs_here_without_forking():
    out = run_all([square(3), square(4)], jobs=1)
    assert [r["square"] for r in out] == [9, 16] and {r["pid"] for r in out} == {os.getpid()}


def test_a_failing_run_is_raised_with_its_traceback_and_the_others_are_killed(tmp_path):
    pids = tmp_path / "pids"

    def slow():
        with open(pids, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(60)
        return {}

    def failing():
        time.sleep(0.3)  # the slow one has started
        raise KeyError("no such policy")

    started = time.monotonic()
    with pytest.raises(ChildFailed, match="KeyError: 'no such policy'"):
        run_all([slow, failing], jobs=2)
    assert time.monotonic() - started < 10  # the slow run was killed, not waited for
    assert_reaped([int(p) for p in pids.read_text().split()])


def test_a_run_that_dies_without_a_result_is_reported():
    with pytest.raises(ChildFailed, match="died without a result"):
        run_all([lambda: os._exit(3), square(1)], jobs=2)


def test_jobs_are_bounded():
    assert 1 <= default_jobs(8) <= 8 and default_jobs(1) == 1
    with pytest.raises(ValueError, match="jobs"):
        run_all([square(1)], jobs=0)


def test_dynarl_sim_prints_the_same_json_with_one_job_or_several():
    marker = uuid.uuid4().hex
    env = dict(os.environ, DYNARL_TEST_MARKER=marker)
    command = [sys.executable, "-m", "dynarl.launch.cli", "sim", "--workload", "math-1.5b-zero", "--devices", "8",
               "--prompts", "4", "--policies", "colocated,spatial,rlinf-auto,dynarl", "--json"]
    outs = []
    for jobs in ("1", "3"):
        done = subprocess.run(command + ["--jobs", jobs], capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        outs.append(done.stdout)
    assert outs[0] == outs[1]
    assert set(json.loads(outs[0])["policies"]) == {"colocated", "spatial", "rlinf-auto", "dynarl"}
    assert marked_processes(marker) == []
    bad = subprocess.run(command + ["--jobs", "0"], capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode == 2 and "--jobs" in bad.stderr
