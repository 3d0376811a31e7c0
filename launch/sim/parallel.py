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

import ctypes
import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import traceback
from typing import Any, Callable, Sequence

Task = Callable[[], Any]
"""A run: returns JSON-able data."""

PR_SET_PDEATHSIG = 1


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
    in this process, no fork). `on_done(index, result)` as each finishes."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    if jobs == 1 or len(tasks) <= 1:
        results = []
        for i, task in enumerate(tasks):
            results.append(task())
            if on_done is not None:
                on_done(i, results[-1])
        return results
    ctx = multiprocessing.get_context("fork")
    results: list[Any] = [None] * len(tasks)
    running: dict[int, tuple[Any, Any]] = {}  # index -> (process, read end)
    queue = list(range(len(tasks)))
    try:
        while queue or running:
            while queue and len(running) < jobs:
                i = queue.pop(0)
                read, write = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_child, args=(tasks[i], write, os.getpid()), daemon=True)
                proc.start()
                write.close()
                running[i] = (proc, read)
            ready = multiprocessing.connection.wait([read for _, read in running.values()])
            for i, (proc, read) in list(running.items()):
                if read not in ready:
                    continue
                try:
                    status, payload = json.loads(read.recv_bytes())
                except EOFError:
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
            proc.kill()
            proc.join()
            read.close()
    return results


def _child(task: Task, write: Any, parent: int) -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which kills us
    try:
        message = json.dumps(["ok", task()])
    except BaseException:
        message = json.dumps(["error", traceback.format_exc()])
    write.send_bytes(message.encode())
    write.close()
