"""The job's private temporary directories, and the sweep of those whose owner died.

A directory is named `dynarl-<kind>-<pid namespace>-<pid>-s<start>-<random>` (made
0700 by mkdtemp; `start`: the owner's start time in clock ticks since boot): the IPC
sockets of a controller and of a worker's payload server, a tool sandbox's stage.
Its owner removes it on a clean exit; a SIGKILLed process cannot, so every controller
start sweeps the system temp dir: a directory of this user, from this pid namespace,
whose owner process is gone, is removed (`dynarl train` says how many). A
controller's exit sweeps those of its own workers too (one SIGKILLed when its grace
ran out). A tool stage is emptied with rmdir only, never rmtree (a bind mount must
not be emptied through it).

Gone means: no such pid; a zombie (a container whose pid 1 does not reap leaves the
workers of a killed controller so); or a process under a reused pid that started at
another time (pids wrap at 32768 on many hosts). A name without the start time (an
older dynarl's) keeps its directory while any live process has that pid.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
from typing import Collection

_NAME = re.compile(r"^dynarl-([a-z0-9]+)-(\d+)-(\d+)(?:-s(\d+))?-[A-Za-z0-9_]+$")


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def make(kind: str) -> str:
    """A fresh 0700 directory owned by this process."""
    pid = os.getpid()
    start = _start_time(pid)
    stamp = "" if start is None else f"-s{start}"
    return tempfile.mkdtemp(prefix=f"dynarl-{kind}-{_pid_namespace()}-{pid}{stamp}-")


def sweep(root: str | None = None, owners: Collection[int] | None = None) -> list[str]:
    """Removes the directories under `root` (the system temp dir) whose owner died
    (`owners`: only those of these pids); returns them."""
    root = root or tempfile.gettempdir()
    namespace, removed = _pid_namespace(), []
    for name in os.listdir(root):
        match = _NAME.match(name)
        if match is None or int(match.group(2)) != namespace:
            continue
        pid, start = int(match.group(3)), match.group(4)
        if (owners is not None and pid not in owners) or _alive(pid, None if start is None else int(start)):
            continue
        path = os.path.join(root, name)
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue  # another sweep was first
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            continue
        if match.group(1) == "tool":
            remove_empty(path)
        else:
            shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            removed.append(path)
    return removed


def remove_empty(path: str) -> None:
    """Removes `path` and its empty subdirectories, with rmdir only."""
    with contextlib.suppress(OSError):
        for name in os.listdir(path):
            os.rmdir(os.path.join(path, name))
        os.rmdir(path)


def _alive(pid: int, start: int | None = None) -> bool:
    """Whether the process `pid` runs (a zombie, unreaped after its parent died, does
    not), and is the one that started at `start` (if given)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process (a reused pid?): /proc still tells its state and start
    state = _proc_stat(pid)
    if state is None:
        return True  # no /proc to ask: taken as the owner
    return state[0] != "Z" and (start is None or state[1] == start)


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot."""
    state = _proc_stat(pid)
    return None if state is None else state[1]


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """The process's state letter and start time (/proc/<pid>/stat fields 3 and 22)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None
