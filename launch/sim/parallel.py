"""Independent simulator runs side by side, one forked child process each.

Each policy of a `dynarl sim` command (and each row of `--sweep`) is its own
deterministic run: a fresh Controller and virtual-time loop over the same
scenario. They share nothing while they run, so on N cores N of them run at
once and the output is byte-identical to running them one after another (a
4096-device math-7b command: colocated ~110 s and dynarl ~220 s, in ~225 s
instead of ~330 s on this 2-core machine).

A child is forked with the scenario already built (copy-on-write) and returns
its result as JSON over a pipe: plain data, no pickle. It dies with the parent
(PR_SET_PDEATHSIG); a child that fails makes the parent kill and reap the others
and raise with the child's traceback.
"""
from __future__ import annotations

import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import traceback
from typing import Any, Callable, Sequence

from dynarl.launch.worker_main import die_with_parent

Task = Callable[[], Any]
"""A run: returns JSON-able data."""


class ChildFailed(RuntimeError):
    """A child run raised; the message holds its traceback."""


def default_jobs(tasks: int) -> int:
    """Runs at once by default: one per core this process may use, at most one per task."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(tasks, cores))


def run_all(tasks: Sequence[Task], jobs: int, on_done: Callable[[int, Any], None] | None = None) -> list[Any]:
    """Each task's result, in task order; at most `jobs` children at a time (jobs 1: all
    in this process, no fork). `on_done(index, result)` as each finishes. Results go
    through JSON either way, so their types do not depend on `jobs`."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    if jobs == 1 or len(tasks) <= 1:
        results = []
        for i, task in enumerate(tasks):
            results.append(json.loads(json.dumps(task())))
            if on_done is not None:
                on_done(i, results[-1])
        return results
    ctx = multiprocessing.get_context("fork")
    results: list[Any] = [None] * len(tasks)
    running: dict[int, tuple[Any, Any]] = {}  # index -> (process, read end)
    queue = list(range(len(tasks)))
    with _CtrlC() as ctrl_c:
        try:
            while queue or running:
                while queue and len(running) < jobs:
                    ctrl_c.check()
                    i = queue.pop(0)
                    _start(ctx, tasks[i], i, running)
                ready = multiprocessing.connection.wait([read for _, read in running.values()] + [ctrl_c.fd],
                                                        timeout=1.0)
                ctrl_c.check()
                for i, (proc, read) in list(running.items()):
                    if read not in ready:
                        continue
                    try:
                        status, payload = json.loads(read.recv_bytes())
                    except EOFError:
                        proc.join()  # the pipe closes before the child can be reaped
                        status, payload = "error", f"the run died without a result (exit code {proc.exitcode})"
                    read.close()
                    proc.join()
                    del running[i]
                    if status != "ok":
                        raise ChildFailed(f"run {i} failed:\n{payload}")
                    results[i] = payload
                    if on_done is not None:
                        on_done(i, payload)
        finally:
            for proc, read in running.values():
                if proc.pid is not None:  # started
                    proc.kill()
                    proc.join()
                read.close()
    return results


class _CtrlC:
    """Ctrl-C while children run: the handler only notes it (and wakes the wait through
    a pipe); the loop raises KeyboardInterrupt where it checks, never inside a fork. (A
    KeyboardInterrupt raised asynchronously inside multiprocessing's fork could leave a
    child started but not recorded, alive and holding the terminal's pipes.) A child
    that takes the signal before it ignores it only writes to the pipe, which the
    parent, not interrupted itself, drains."""

    def __enter__(self) -> "_CtrlC":
        self.hit = False
        self.fd, self._write = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._write, False)
        try:
            self._previous = signal.signal(signal.SIGINT, self._note)
        except ValueError:  # not the main thread: Ctrl-C is not ours to handle
            self._previous = None
        return self

    def _note(self, signum: int, frame: Any) -> None:
        self.hit = True
        try:
            os.write(self._write, b"\0")
        except OSError:  # the pipe is full: it is readable already
            pass

    def check(self) -> None:
        try:
            os.read(self.fd, 4096)
        except BlockingIOError:
            pass
        if self.hit:
            raise KeyboardInterrupt

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        os.close(self.fd)
        os.close(self._write)


def _start(ctx: Any, task: Task, index: int, running: dict[int, tuple[Any, Any]]) -> None:
    """Forks a child for `task`, recorded in `running` before it exists (a Ctrl-C in
    between still finds it). The child ignores Ctrl-C: it is the parent's, which kills it."""
    read, write = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(task, write, os.getpid()), daemon=True)
    running[index] = (proc, read)
    try:
        proc.start()
    finally:
        write.close()


def _child(task: Task, write: Any, parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it kills us
    die_with_parent(parent)
    try:
        message = json.dumps(["ok", task()])
    except BaseException:
        message = json.dumps(["error", traceback.format_exc()])
    write.send_bytes(message.encode())
    write.close()
