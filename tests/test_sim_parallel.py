NUM_GPUS = 0
"""launch/sim/parallel.py: independent simulator runs in forked children give the
results, in order, that running them here gives; a failing run is reported with its
traceback and takes the others down; no child outlives the call. And `dynarl sim`
prints the same JSON with one job as with several."""
import json
import os
import signal
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
        deadline = time.monotonic() + 120
        while not (pids.exists() and pids.read_text()) and time.monotonic() < deadline:
            time.sleep(0.01)  # until the slow one has started
        raise KeyError("no such policy")

    started = time.monotonic()
    with pytest.raises(ChildFailed, match="KeyError: 'no such policy'"):
        run_all([slow, failing], jobs=2)
    assert time.monotonic() - started < 50  # the slow run (60 s) was killed, not waited for
    assert_reaped([int(p) for p in pids.read_text().split()])


def test_a_run_that_dies_without_a_result_is_reported_with_its_exit_code():
    with pytest.raises(ChildFailed, match=r"died without a result \(exit code 3\)"):
        run_all([lambda: os._exit(3), square(1)], jobs=2)
    with pytest.raises(ChildFailed, match=r"exit code -9"):
        run_all([lambda: os.kill(os.getpid(), signal.SIGKILL), square(1)], jobs=2)


def test_results_have_the_same_types_with_one_job_or_several():
    task = lambda: {1: (1, 2), "x": [0.1, float("inf")]}  # noqa: E731
    assert run_all([task], jobs=1) == run_all([task, task], jobs=2)[:1] == [{"1": [1, 2], "x": [0.1, float("inf")]}]


DRIVER = """
import os, sys, time
from dynarl.launch.sim.parallel import run_all
def slow():
    with open(sys.argv[1], "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(60)
    return {}
run_all([slow, slow], jobs=2)
"""


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGINT])
def test_children_go_when_the_parent_is_killed_or_interrupted(tmp_path, signum):
    """SIGKILL to the parent alone: the children die with it (PR_SET_PDEATHSIG). SIGINT to
    the whole process group, as a terminal's Ctrl-C: the children ignore it, and the
    parent stops with KeyboardInterrupt (not a child's failure) and kills them."""
    pids = tmp_path / "pids"
    parent = subprocess.Popen([sys.executable, "-c", DRIVER, str(pids)], stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not pids.exists() or len(pids.read_text().split()) < 2:
            assert time.monotonic() < deadline and parent.poll() is None, "the children did not start"
            time.sleep(0.05)
        if signum == signal.SIGINT:
            os.killpg(parent.pid, signum)  # the terminal's Ctrl-C goes to the whole group
        else:
            os.kill(parent.pid, signum)  # the parent alone
        _, stderr = parent.communicate(timeout=120)
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
            parent.wait()
    children = [int(p) for p in pids.read_text().split()]
    deadline = time.monotonic() + 60
    while True:
        try:
            assert_reaped(children)
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    if signum == signal.SIGINT:
        assert "KeyboardInterrupt" in stderr and "ChildFailed" not in stderr, stderr[-2000:]


def test_the_sweep_gives_the_same_rows_with_one_job_or_several():
    from dynarl.launch.sim.sweep import sweep
    kw = dict(devices=8, seed=0, iterations=2, warmup=1, prompts=4)
    assert sweep(**kw, jobs=1) == sweep(**kw, jobs=3)


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
        done = subprocess.run(command + ["--jobs", jobs], capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        outs.append(done.stdout)
    assert outs[0] == outs[1]
    assert set(json.loads(outs[0])["policies"]) == {"colocated", "spatial", "rlinf-auto", "dynarl"}
    assert marked_processes(marker) == []
    bad = subprocess.run(command + ["--jobs", "0"], capture_output=True, text=True, timeout=300, env=env)
    assert bad.returncode == 2 and "--jobs" in bad.stderr
