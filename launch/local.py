"""The `local` launcher: each rank is a subprocess of the controller on this host.

The job secret and bootstrap data go to the child on its stdin (not argv or the
environment, which other local users can read from /proc). Children start in
their own session, so a kill takes their whole process group down with them (and
reaping a worker that exited takes down what it left in its session), and they die
with the controller (PR_SET_PDEATHSIG, set in worker_main, which also checks that
the controller did not die before that).
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from typing import TYPE_CHECKING

from dynarl.core.launcher import Launcher, register_launcher

PARENT_PID_ENV = "DYNARL_PARENT_PID"
KILLED_EXIT_S = 30.0
TERM_WAIT_S = 1.0
"""After SIGTERM to a worker's process group, how long reap waits before SIGKILL."""

if TYPE_CHECKING:
    from dynarl.core.controller import Controller
    from dynarl.core.worker import WorkerSpec
    from dynarl.core.worker_handle import WorkerHandle


def worker_environment(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    # Same import path as the controller, so classes in tests and user scripts resolve;
    # less any folder that holds a `dynarl` directory other than this package (a run
    # directory named dynarl in the working directory would otherwise be imported as a
    # namespace package ahead of an editable install, and no worker would start).
    paths = [p or os.getcwd() for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(p for p in dict.fromkeys(paths) if not _shadows_dynarl(p))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def bootstrap_line_for(ctl_address: str, secret: bytes, spec: "WorkerSpec", heartbeat_interval_s: float,
                       max_message_bytes: int, data_host: str = "127.0.0.1") -> bytes:
    """`data_host`: where the worker's peer-to-peer payload server binds."""
    return (json.dumps({"address": ctl_address, "secret": secret.hex(), "spec": spec.to_wire(),
                        "heartbeat_interval_s": heartbeat_interval_s, "max_message_bytes": max_message_bytes,
                        "data_host": data_host}) + "\n").encode()


PACKAGE_DIR = os.path.realpath(os.path.join(os.path.dirname(__file__), os.pardir))
"""The folder of the `dynarl` package, which holds launch/."""


def _shadows_dynarl(path: str) -> bool:
    found = os.path.join(path, "dynarl")
    return os.path.isdir(found) and os.path.realpath(found) != PACKAGE_DIR


async def start_worker_process(bootstrap: bytes, env: dict[str, str]) -> asyncio.subprocess.Process:
    # The worker checks that this process is still its parent once it has armed
    # PR_SET_PDEATHSIG: a parent that died during its imports is then noticed too.
    env = {**env, PARENT_PID_ENV: str(os.getpid())}
    proc = await asyncio.create_subprocess_exec(
        # -P: not the working directory first on the path (python -m would put it there,
        # ahead of the import path worker_environment gives)
        sys.executable, "-P", "-m", "dynarl.launch.worker_main", stdin=asyncio.subprocess.PIPE,
        env=env, start_new_session=True)
    proc.stdin.write(bootstrap)
    await proc.stdin.drain()
    proc.stdin.close()
    return proc


async def reap(proc: asyncio.subprocess.Process, grace_s: float) -> int:
    """Waits for exit; then SIGTERM to the process group (the worker outlives it,
    worker_main.after_sigterm: what it started may not); then SIGKILL. Returns the code.
    Whatever the worker started in its session goes too, also when the worker itself
    exited cleanly or was killed alone (the launcher's watcher does the same the moment
    it sees a worker exit; a process that had exited before this call is left to it,
    since its pid may name another session by now)."""
    was_running = proc.returncode is None
    try:
        for sig, wait_s in ((None, grace_s), (signal.SIGTERM, TERM_WAIT_S), (signal.SIGKILL, KILLED_EXIT_S)):
            if sig is not None:
                _signal_group(proc.pid, sig)
            try:
                return await asyncio.wait_for(proc.wait(), wait_s)
            except TimeoutError:
                continue
        # still there after SIGKILL: stuck in the kernel (uninterruptible I/O); say so
        # and go on, rather than hang the shutdown
        raise ProcessLookupError(f"worker process {proc.pid} did not exit {KILLED_EXIT_S:.0f} s after SIGKILL")
    finally:
        if was_running:
            kill_session(proc.pid)


def kill_session(pid: int) -> None:
    """SIGKILL to what is left of a worker's session, right after the worker exited
    (a process group's id is not reused while any member lives)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def free_local_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LocalLauncher(Launcher):
    name = "local"
    uses_sockets = True
    remote_workers = False
    """Every worker is on this host: the controller binds no TCP port."""

    def __init__(self) -> None:
        self._ctl: "Controller | None" = None
        self._procs: dict[str, asyncio.subprocess.Process] = {}

    async def start(self, ctl: "Controller") -> None:
        self._ctl = ctl

    async def spawn(self, handle: "WorkerHandle") -> None:
        ctl = self._ctl
        ctl.expect(handle)
        line = bootstrap_line_for(ctl.router.local_address, ctl.secret, handle.spec, ctl.config.heartbeat_interval_s,
                                  ctl.config.max_message_bytes, ctl.launcher.node_address(handle.spec.node))
        proc = await start_worker_process(line, worker_environment(handle.spec.env()))
        handle.process = proc
        handle.pid = proc.pid
        self._procs[handle.spec.worker_id] = proc
        ctl.spawn_task(self._watch(handle, proc), name=f"watch {handle.name}")

    async def _watch(self, handle: "WorkerHandle", proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        kill_session(proc.pid)
        self._procs.pop(handle.spec.worker_id, None)
        handle.mark_lost(f"process {proc.pid} exited with code {code}")

    async def free_port(self, node: int) -> int:
        return free_local_port()

    async def stop(self, handle: "WorkerHandle", grace_s: float) -> None:
        if handle.process is not None:
            await reap(handle.process, grace_s)

    def kill(self, handle: "WorkerHandle") -> None:
        if handle.process is not None and handle.process.returncode is None:
            _signal_group(handle.process.pid, signal.SIGKILL)

    async def close(self) -> None:
        await asyncio.gather(*(reap(p, 0.0) for p in list(self._procs.values())), return_exceptions=True)


register_launcher("local", LocalLauncher)
