"""The job's private temporary directories, and the sweep of those whose owner died.

A directory is named `dynarl-<kind>-<pid namespace>-<pid>-<random>` (made 0700 by
mkdtemp): the IPC sockets of a controller and of a worker's payload server, a tool
sandbox's stage. Its owner removes it on a clean exit; a SIGKILLed process cannot,
so every controller start sweeps the system temp dir: a directory of this user,
from this pid namespace, whose owner process is gone, is removed (`dynarl train`
says how many). A controller's exit sweeps those of its own workers too (one
SIGKILLed when its grace ran out). A tool stage is
emptied with rmdir only, never rmtree (a bind mount must not be emptied through it).
A reused pid keeps a dead owner's directory until that process is gone too.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
from typing import Collection

_NAME = re.compile(r"^dynarl-([a-z0-9]+)-(\d+)-(\d+)-[A-Za-z0-9_]+$")


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def make(kind: str) -> str:
    """A fresh 0700 directory owned by this process."""
    return tempfile.mkdtemp(prefix=f"dynarl-{kind}-{_pid_namespace()}-{os.getpid()}-")


def sweep(root: str | None = None, owners: Collection[int] | None = None) -> list[str]:
    """Removes the directories under `root` (the system temp dir) whose owner died
    (`owners`: only those of these pids); returns them."""
    root = root or tempfile.gettempdir()
    namespace, removed = _pid_namespace(), []
    for name in os.listdir(root):
        match = _NAME.match(name)
        if match is None or int(match.group(2)) != namespace:
            continue
        pid = int(match.group(3))
        if (owners is not None and pid not in owners) or _alive(pid):
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's
    return True
