NUM_GPUS = 0
"""Signals after the first leave the ordered stop running to its end (core/run.py
OrderedStop): a second Ctrl-C 50 ms after the first used to raise KeyboardInterrupt
inside the stop (tracebacks, a gather's exception never retrieved, a launcher's stop
never awaited, a worker's temp dir left behind)."""

import glob
import os
import signal
import subprocess
import sys
import tempfile
import time

from dynarl.transport import tempdirs
from conftest import assert_reaped, children, marked_processes
from grpo_tiny import TINY

NOISE = ("Traceback", "KeyboardInterrupt", "CancelledError", "never awaited", "never retrieved")


def left_temp_dirs(pids):
    """The temp dirs (tempdirs.make) that any of `pids` still owns."""
    ns = tempdirs._pid_namespace()
    return [path for pid in pids for path in glob.glob(os.path.join(tempfile.gettempdir(), f"dynarl-*-{ns}-{pid}-*"))]


def signal_repeatedly(proc, signals, gap_s):
    for sig in signals:
        if proc.poll() is not None:
            return
        proc.send_signal(sig)
        time.sleep(gap_s)


def test_sigint_twice_mid_run_stops_in_order_and_leaves_nothing(tmp_path):
    run, marker, log = str(tmp_path / "run"), f"sigint-{os.getpid()}", tmp_path / "train.log"
    env = dict(os.environ, DYNARL_TEST_MARKER=marker)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "dynarl.launch.cli", "train", *TINY, "run.steps=200",
                                 "--run-dir", run], cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        metrics = os.path.join(run, "metrics.jsonl")
        deadline = time.monotonic() + 180
        while not (os.path.exists(metrics) and os.path.getsize(metrics) > 0):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
        workers = children(proc.pid)
        assert len(workers) == 3  # rollout, reward, trainer (no inference stage: old_logprobs.py)
        signal_repeatedly(proc, [signal.SIGINT, signal.SIGINT], 0.05)
        assert proc.wait(timeout=120) == 130
    finally:
        proc.kill()
        proc.wait()
    text = log.read_text()
    assert not [n for n in NOISE if n in text], text[-3000:]
    assert "dynarl train: SIGINT: already stopping the workers in order" in text
    assert text.count("dynarl train: interrupted; ") == 1
    assert_reaped(workers)
    assert marked_processes(marker) == []
    assert left_temp_dirs([proc.pid] + workers) == []


SCRIPT = """
import asyncio, sys
sys.path.insert(0, {tests!r})
import dynarl
from workers import SlowTeardown

async def workflow(ctl):
    groups = [await ctl.spawn(SlowTeardown, name=f"g{{i}}", num_ranks=1, init={{"path": f"{path}.{{i}}"}})
              for i in range(2)]
    print(" ".join(str(pid) for g in groups for pid in g.pids), flush=True)
    await asyncio.sleep(60)

try:
    dynarl.run(workflow, dynarl.RuntimeConfig(launcher="local"))
except KeyboardInterrupt:
    sys.exit(130)
"""


def test_any_number_of_signals_after_the_first_leave_every_teardown_to_run(tmp_path):
    """dynarl.run: a teardown takes 1 s; Ctrl-C and SIGTERM keep coming meanwhile."""
    path = str(tmp_path / "torn")
    script = SCRIPT.format(tests=os.path.dirname(__file__), path=path)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2
        signal_repeatedly(proc, [signal.SIGINT, signal.SIGINT] + [signal.SIGTERM, signal.SIGINT] * 5, 0.05)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, err[-3000:]
    assert not [n for n in NOISE if n in err], err[-3000:]
    assert all(len(open(f"{path}.{i}").read().split()) == 2 for i in range(2))  # each teardown ran to its end
    assert_reaped(pids)
    assert left_temp_dirs([proc.pid] + pids) == []
