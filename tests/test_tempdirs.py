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
    deadline = time.monotonic() + 10
    while running(int(worker)) and time.monotonic() < deadline:  # it dies with its parent
        time.sleep(0.02)
    assert not running(int(worker))
    async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
        assert not os.path.exists(folder)
        assert os.path.isdir(os.path.dirname(ctl.router.local_address[len("ipc://"):]))
