NUM_GPUS = 0
"""Temp dirs of processes that died (a SIGKILLed controller cannot clean up) go at
the next controller start; a live owner's, another user's or another pid
namespace's stay."""

import os
import signal
import subprocess
import sys
import time

import dynarl
from dynarl import RuntimeConfig
from dynarl.transport import tempdirs
from conftest import running


def dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_sweep_removes_only_the_dead_owners_dirs(tmp_path):
    ns = tempdirs._pid_namespace()
    dead, alive = dead_pid(), os.getpid()
    made = {name: tmp_path / name for name in (
        f"dynarl-ctl-{ns}-{dead}-abc", f"dynarl-p2p-{ns}-{alive}-abc", f"dynarl-ctl-{ns + 1}-{dead}-abc",
        f"dynarl-tool-{ns}-{dead}-abc", "dynarl-oldstyle", f"other-ctl-{ns}-{dead}-abc")}
    for path in made.values():
        (path / "0").mkdir(parents=True)
    (made[f"dynarl-ctl-{ns}-{dead}-abc"] / "controller").write_text("")  # a socket file, say
    (made[f"dynarl-tool-{ns}-{dead}-abc"] / "0" / "kept").write_text("")  # a tool stage: rmdir only
    removed = tempdirs.sweep(str(tmp_path))
    assert removed == [str(made[f"dynarl-ctl-{ns}-{dead}-abc"])]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for n in made if n != f"dynarl-ctl-{ns}-{dead}-abc")
    os.remove(made[f"dynarl-tool-{ns}-{dead}-abc"] / "0" / "kept")
    assert tempdirs.sweep(str(tmp_path)) == [str(made[f"dynarl-tool-{ns}-{dead}-abc"])]


def test_a_reused_pid_or_a_zombie_does_not_keep_the_dead_owners_dir(tmp_path):
    """The name carries the owner's start time: a live process under the same pid
    that started at another time is not the owner; nor is a zombie."""
    ns, pid = tempdirs._pid_namespace(), os.getpid()
    start = tempdirs._start_time(pid)
    assert start is not None
    reused, own = tmp_path / f"dynarl-ctl-{ns}-{pid}-s{start - 1}-abc", tmp_path / f"dynarl-ctl-{ns}-{pid}-s{start}-abc"
    reused.mkdir()
    own.mkdir()
    assert tempdirs.sweep(str(tmp_path)) == [str(reused)]
    assert [p.name for p in tmp_path.iterdir()] == [own.name]
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # exits, and nobody waits for it yet
    try:
        deadline = time.monotonic() + 60
        while running(zombie.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert os.path.exists(f"/proc/{zombie.pid}") and not running(zombie.pid)
        undead = tmp_path / f"dynarl-p2p-{ns}-{zombie.pid}-s{tempdirs._start_time(zombie.pid)}-abc"
        undead.mkdir()
        assert tempdirs.sweep(str(tmp_path)) == [str(undead)]
    finally:
        zombie.wait()
    made = tempdirs.make("ctl")
    try:
        assert os.path.basename(made).startswith(f"dynarl-ctl-{ns}-{pid}-s{start}-")
    finally:
        os.rmdir(made)


KILLED = """
import asyncio, os, sys, time
sys.path.insert(0, {tests!r})
import dynarl
from dynarl import RuntimeConfig
from workers import Echo

async def main():
    async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
        group = await ctl.spawn(Echo, num_ranks=1)
        print(os.path.dirname(ctl.router.local_address[len("ipc://"):]), group.pids[0], flush=True)
        await asyncio.sleep(60)
asyncio.run(main())
"""


async def test_a_killed_controllers_socket_dir_goes_at_the_next_start():
    tests = os.path.dirname(__file__)
    proc = subprocess.Popen([sys.executable, "-c", KILLED.format(tests=tests)], stdout=subprocess.PIPE, text=True)
    try:
        folder, worker = proc.stdout.readline().split()
        assert os.path.isdir(folder) and os.path.basename(folder).startswith("dynarl-ctl-")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert os.path.isdir(folder)  # nobody could clean up
    deadline = time.monotonic() + 60
    while running(int(worker)) and time.monotonic() < deadline:  # it dies with its parent
        time.sleep(0.02)
    assert not running(int(worker))
    async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
        assert not os.path.exists(folder)
        assert os.path.isdir(os.path.dirname(ctl.router.local_address[len("ipc://"):]))


def test_a_killed_trains_temp_dirs_go_at_the_next_start_which_says_so(tmp_path, monkeypatch):
    """kill -9 of `dynarl train` leaves its and its workers' socket dirs (nobody can
    clean up); the next run removes them and prints how many."""
    import pathlib
    import shutil
    import tempfile
    from conftest import kill_9_mid_run
    from grpo_tiny import TINY
    # a temp dir of its own (other jobs on this host sweep the system one too), short
    # enough for a socket path
    private = pathlib.Path(tempfile.mkdtemp(prefix="td"))
    monkeypatch.setenv("TMPDIR", str(private))
    train = [sys.executable, "-m", "dynarl.launch.cli", "train", *TINY]
    try:
        kill_9_mid_run(train + ["run.steps=200", "--run-dir", str(tmp_path / "a")], str(tmp_path / "a"), 1,
                       tmp_path, workers=3)  # rollout, reward, trainer (no inference stage: old_logprobs.py)
        left = [p.name for p in private.iterdir() if p.name.startswith("dynarl-")]
        assert len(left) == 4  # the controller's and each worker's
        result = subprocess.run(train + ["run.steps=1", "--run-dir", str(tmp_path / "b")], capture_output=True,
                                text=True, timeout=300, cwd=tmp_path)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        assert f"removed 4 temp dirs that dead dynarl processes left in {private} (" in result.stdout
        assert not [p.name for p in private.iterdir() if p.name.startswith("dynarl-")]
    finally:
        shutil.rmtree(private, ignore_errors=True)
