"""One owner per run directory, and default run directories of their own.

A job that trains in a run directory (a new run or `--resume`) holds an exclusive
`flock` on DIR/run.lock for as long as it runs, and writes its owner there (pid,
host, start time). A second job on the directory is refused with that owner
named, and nothing in the directory changes. The kernel drops the lock when the
owner dies (SIGKILL included), so on one host a dead owner's lock is never stale.
Across hosts on a shared filesystem the lock holds as far as that filesystem's
locks do: NFS maps flock onto its own locks (a crashed client's lock goes when the
server's lease for it expires, 90 s by default on NFSv4), Lustre mounted with
`-o flock` too; with `-o localflock`, or none, only jobs on the same host see it.
The file is never removed (removing a lock file lets two jobs lock two files).

`new_default` makes `runs/<workflow>-<time>` with an exclusive mkdir, adding -2,
-3, ... when a job started in the same second took the name first.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time

LOCK_FILE = "run.lock"


class RunDirBusy(Exception):
    """Another live job owns the run directory."""

    def __init__(self, run_dir: str, owner: str) -> None:
        super().__init__(f"run directory {run_dir} is in use by {owner}: one job at a time trains in a "
                         "run directory")


class RunDirLock:
    """The lock on a run directory; released by `release()`, or by the kernel when
    this process dies."""

    def __init__(self, run_dir: str, fd: int | None) -> None:
        self.run_dir, self._fd = run_dir, fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # (closing the only descriptor drops the flock)
            self._fd = None

    def __del__(self) -> None:
        self.release()


def claim(run_dir: str) -> RunDirLock:
    """Makes `run_dir` if needed and locks it for this process; RunDirBusy if a live
    job holds it. A filesystem without locks gives an unlocked claim (said on stderr)."""
    os.makedirs(run_dir, exist_ok=True)
    fd = os.open(os.path.join(run_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = _describe(_read(fd))
        os.close(fd)
        raise RunDirBusy(run_dir, owner) from None
    except OSError as exc:
        if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            os.close(fd)
            raise
        print(f"dynarl train: note: the filesystem of {run_dir} has no locks ({exc.strerror}): "
              "nothing stops a second job on it", file=sys.stderr, flush=True)
    record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    return RunDirLock(run_dir, fd)


def owner_of(run_dir: str) -> str | None:
    """Who holds `run_dir` now (as RunDirBusy names them), or None when nobody does;
    creates and changes nothing."""
    try:
        fd = os.open(os.path.join(run_dir, LOCK_FILE), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        return _describe(_read(fd))
    except OSError:  # no locks on this filesystem: nobody can be seen holding it
        return None
    finally:
        os.close(fd)


def is_empty(run_dir: str) -> bool:
    """Nothing in `run_dir` (it may not exist) but a lock file a finished job left."""
    try:
        return not [name for name in os.listdir(run_dir) if name != LOCK_FILE]
    except FileNotFoundError:
        return True


def new_default(root: str, prefix: str) -> str:
    """root/<prefix>, or root/<prefix>-2, -3, ...: the first this call created (an
    exclusive mkdir, so two jobs never get the same one)."""
    os.makedirs(root, exist_ok=True)
    n = 1
    while True:
        path = os.path.join(root, prefix if n == 1 else f"{prefix}-{n}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            n += 1


def _read(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (ValueError, OSError):
        return {}


def _describe(record: dict) -> str:
    if "pid" not in record:
        return "another job (its owner not yet written)"
    return f"pid {record['pid']} on host {record.get('host', '?')} (since {record.get('since', '?')})"
