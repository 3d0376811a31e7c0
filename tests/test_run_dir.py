NUM_GPUS = 0
"""One owner per run directory (launch/run_dir.py): a second job on a directory a live
job holds is refused, naming the owner, and changes nothing there; a dead owner's lock
is gone with it; default run directories and temp files are each writer's own."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from dynarl.components.workflows.checkpoints import latest_checkpoint
from dynarl.core.files import atomic_open
from dynarl.launch import run_dir as owned
from dynarl.launch.train import UsageError, prepare
from conftest import marked_processes
from grpo_tiny import TINY, overrides

HOLD = """
import sys, time
from dynarl.launch.run_dir import claim
lock = claim(sys.argv[1])
print("held", flush=True)
time.sleep(120)
"""


def test_a_claimed_directory_is_refused_naming_its_owner_until_released(tmp_path):
    run = str(tmp_path / "run")
    lock = owned.claim(run)
    record = json.loads(open(os.path.join(run, owned.LOCK_FILE)).read())
    assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
    with pytest.raises(owned.RunDirBusy, match=f"run directory {run} is in use by pid {os.getpid()} on host "):
        owned.claim(run)
    assert owned.owner_of(run).startswith(f"pid {os.getpid()} on host")
    lock.release()
    assert owned.owner_of(run) is None
    owned.claim(run).release()
    assert owned.is_empty(run)  # (the lock file a finished job leaves counts as nothing)


def test_a_killed_owners_lock_goes_with_it(tmp_path):
    run = str(tmp_path / "run")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, run], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(owned.RunDirBusy, match=f"pid {holder.pid} "):
            owned.claim(run)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdout.close()
    owned.claim(run).release()  # no stale lock: the kernel dropped it


def test_default_run_directories_made_in_one_second_are_each_jobs_own(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("time.strftime", lambda fmt, *a: "grpo-20260101-000000")  # both in one second
    first = prepare(None, overrides("run.steps=1"), None, None)
    second = prepare(None, overrides("run.steps=1"), None, None)
    assert (first.run_dir, second.run_dir) == (os.path.join("runs", "grpo-20260101-000000"),
                                               os.path.join("runs", "grpo-20260101-000000-2"))
    assert owned.owner_of(first.run_dir) and owned.owner_of(second.run_dir)  # each held by its job
    first.lock.release()
    second.lock.release()


def test_a_new_run_in_a_directory_another_job_holds_is_refused(tmp_path):
    run = str(tmp_path / "run")
    lock = owned.claim(run)
    try:
        with pytest.raises(UsageError, match=f"run directory {run} is in use by pid {os.getpid()}"):
            prepare(None, overrides("run.steps=1"), run, None)
    finally:
        lock.release()
    assert os.listdir(run) == [owned.LOCK_FILE]


def test_writers_of_one_file_never_share_a_temp_file(tmp_path):
    """Both inside atomic_open at once: with one fixed temp name the second open
    truncated the first's file and the second replace found nothing to move."""
    path = str(tmp_path / "config.yaml")
    both_open = threading.Barrier(2)
    failures = []

    def write(text):
        try:
            with atomic_open(path) as f:
                both_open.wait(10)
                f.write(text)
        except Exception as exc:  # (the test fails below, naming it)
            failures.append(exc)
    threads = [threading.Thread(target=write, args=(t * 1000,)) for t in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert failures == []
    assert open(path).read() in ("a" * 1000, "b" * 1000)
    assert os.listdir(tmp_path) == ["config.yaml"]


def _train(argv, cwd, marker, log, env=None):
    """`dynarl train` on the tiny config, its output (both streams) in `log`."""
    env = dict(env or os.environ, DYNARL_TEST_MARKER=marker)
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "dynarl.launch.cli", "train", *TINY, *argv], cwd=cwd,
                                env=env, stdout=out, stderr=subprocess.STDOUT)


def _steps(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line)["step"] for line in f if line.endswith("\n")]


def _wait_gone(marker, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while marked_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marked_processes(marker) == []


def test_resume_of_a_live_run_is_refused_and_changes_nothing(tmp_path):
    """A --resume beside the running job rolled the ledger back to its checkpoint while
    the first kept appending: steps trained twice, sample ids twice."""
    run, marker = str(tmp_path / "run"), f"live-{os.getpid()}"
    log = tmp_path / "first.log"
    first = _train(["run.steps=200", "run.checkpoint_every=1", "--run-dir", run], tmp_path, marker, log)
    ledger = os.path.join(run, "ledger.jsonl")
    try:
        deadline = time.monotonic() + 180
        while latest_checkpoint(run) is None or len(_steps(ledger)) < 2:
            assert first.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
        kept = {name: open(os.path.join(run, name), "rb").read() for name in ("config.yaml", owned.LOCK_FILE)}
        before = _steps(ledger)
        second = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "train", "--resume", run],
                                capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
        assert second.stderr.splitlines() == [
            f"dynarl train: error: run directory {run} is in use by pid {first.pid} on host {socket.gethostname()} "
            f"(since {json.loads(kept[owned.LOCK_FILE])['since']}): one job at a time trains in a run directory"]
        assert {name: open(os.path.join(run, name), "rb").read() for name in kept} == kept
        assert not os.path.exists(os.path.join(run, "ledger.rolled_back.jsonl"))
        after = _steps(ledger)
        assert after[:len(before)] == before and after == list(range(len(after)))
        assert first.poll() is None  # the owner trains on
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(timeout=120)
    assert first.returncode == 130, log.read_text()[-2000:]
    with open(ledger) as f:
        entries = [json.loads(line) for line in f]
    ids = [i for e in entries for i in e["samples"]]
    assert [e["step"] for e in entries] == list(range(len(entries))) and len(ids) == len(set(ids))
    _wait_gone(marker)


FROZEN_SECOND = """
import time
_strftime, _second = time.strftime, time.localtime(1767225600)
time.strftime = lambda fmt, t=None: _strftime(fmt, _second if t is None else t)
"""


def test_two_jobs_started_together_on_defaults_both_finish(tmp_path):
    """Both read the clock in the same second (a sitecustomize freezes time.strftime):
    both chose runs/grpo-<that second>, and one of them failed."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(FROZEN_SECOND)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), *sys.path]))
    marker = f"defaults-{os.getpid()}"
    logs = [tmp_path / f"job{n}.log" for n in range(2)]
    jobs = [_train(["run.steps=1"], tmp_path, marker, log, env) for log in logs]
    for job, log in zip(jobs, logs):
        assert job.wait(timeout=400) == 0, log.read_text()[-2000:]
    outs = [log.read_text() for log in logs]
    made = sorted(os.listdir(tmp_path / "runs"))
    second = time.strftime("grpo-%Y%m%d-%H%M%S", time.localtime(1767225600))
    assert made == [second, f"{second}-2"]
    for name in made:
        assert _steps(tmp_path / "runs" / name / "metrics.jsonl") == [0]
        assert os.path.isfile(tmp_path / "runs" / name / "summary.json")
    assert sorted(out.rsplit("run directory ", 1)[1].strip() for out in outs) == [
        os.path.join("runs", name) for name in made]
    _wait_gone(marker)
