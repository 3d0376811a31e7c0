"""PythonSandbox: runs model-generated Python, a fresh sandbox per call.

    sandbox = PythonSandbox(ToolConfig(timeout_s=5))
    result = await sandbox.run("print(6 * 7)")   # ToolResult(ok=True, stdout="42\\n", error=None)

Each call is one bubblewrap sandbox (sandbox_command.py) holding a Python process
with resource limits (launcher.py). Calls run concurrently as asyncio subprocesses,
at most `max_concurrency` at once; the others wait for a slot.

A call ends when the code exits, when the wall-clock timeout passes, or when its
output passes the cap; for the last two we SIGKILL the sandbox's pid 1 (the
launcher; bwrap reports its host pid on --info-fd). When pid 1 of a pid namespace
exits, the kernel kills every process left in it, daemonized ones included, and
completes pid 1's exit only after they are gone; bwrap reaps pid 1 and then exits.
So once we have reaped bwrap, nothing of the call is left.

Without a working bubblewrap no code runs: `check()` (done by the first call)
runs a probe that must show the isolation (its own pid namespace, loopback only,
no /etc, not root), and raises SandboxUnavailable otherwise.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import sys
import time
import weakref
from collections import deque
from pathlib import Path
from typing import Any

from dynarl.components.tools.config import ToolConfig
from dynarl.components.tools.latency import LatencyLog
from dynarl.components.tools.outcome import Limits, ToolResult, code_problem, describe_failure, reject
from dynarl.components.tools.seccomp import filter_program, supported
from dynarl.components.tools.sandbox_command import (SCRATCH, SYSTEM_DIRS, Host, bwrap_argv, is_inside,
                                                     interpreter_prefixes, staged_argv)
from dynarl.transport import tempdirs

LAUNCHER = (Path(__file__).parent / "launcher.py").read_text()
PROBE = ("import json, os, socket\n"
         "print(json.dumps({'pid': os.getpid(), 'uid': os.getuid(), 'root': sorted(os.listdir('/')),\n"
         "                  'net': [name for _, name in socket.if_nameindex()]}))\n")
PROBE_TIMEOUT_S = 30.0
# Sandbox uids when we are root: far from login users, container subuid ranges and
# systemd's dynamic users. A fresh one per call keeps calls from sharing a process count.
UID_RANGE = (1_000_000_000, 2_000_000_000)
HOST_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or does not isolate: code is refused, never run bare."""


class PythonSandbox:
    def __init__(self, config: ToolConfig | None = None, *, latency: LatencyLog | None = None) -> None:
        self.config = config or ToolConfig()
        self.latency = latency or LatencyLog()
        self.started_pids: deque[int] = deque(maxlen=4096)
        """bwrap and the sandbox's pid 1 of recent calls (tests check each was reaped)."""
        self._slots = asyncio.Semaphore(self.config.max_concurrency)
        self._checking = asyncio.Lock()
        self._host: Host | None = None
        self._cleanup: weakref.finalize | None = None

    async def run(self, code: Any, timeout_s: float | None = None) -> ToolResult:
        """Runs `code`; the result carries its stdout or a short error text. A
        malformed request is answered (and counted) without running anything."""
        started = time.perf_counter()
        timeout = self._timeout(timeout_s)
        problem = code_problem(code, self.config.max_code_bytes)
        if problem is not None:
            result = reject(problem)
        else:
            host = await self.check()
            async with self._slots:
                result = await self._execute(host, code, timeout)
        result.latency_s = time.perf_counter() - started
        self.latency.record("python", result.latency_s, ok=result.ok, rejected=result.rejected)
        return result

    async def check(self) -> Host:
        """Finds bubblewrap and proves once that it isolates; raises SandboxUnavailable."""
        async with self._checking:
            if self._host is None:
                host = find_host(self.config)
                try:
                    await self._probe(host)
                except BaseException:
                    _remove_stage(host.stage)
                    raise
                self._host = host
                self._cleanup = weakref.finalize(self, _remove_stage, host.stage)
        return self._host

    def close(self) -> None:
        if self._cleanup is not None:
            self._cleanup()
        self._host = None

    def _timeout(self, timeout_s: Any) -> float:
        if timeout_s is None:
            return float(self.config.timeout_s)
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"timeout_s must be a number > 0, got {timeout_s!r}")
        return min(float(timeout_s), float(self.config.timeout_s))  # the config is the ceiling

    async def _probe(self, host: Host) -> None:
        result = await self._execute(host, PROBE, PROBE_TIMEOUT_S)
        if not result.ok:
            raise SandboxUnavailable(f"{host.bwrap} cannot start the sandbox ({result.error}); "
                                     "code is not run without it")
        facts = json.loads(result.stdout)
        # The launcher is pid 1 of its own pid namespace (--as-pid-1); without one the pid is larger.
        if facts["pid"] != 1 or set(facts["net"]) - {"lo"} or "etc" in facts["root"] or facts["uid"] == 0:
            raise SandboxUnavailable(f"{host.bwrap} ran the code without isolation ({facts}); "
                                     "code is not run without the sandbox")

    async def _execute(self, host: Host, code: str, timeout: float) -> ToolResult:
        info_read, info_write = os.pipe()
        seccomp_read, seccomp_write = os.pipe()  # the program fits a pipe's buffer: written whole here
        with os.fdopen(seccomp_write, "wb") as program:
            program.write(host.seccomp)
        argv = bwrap_argv(host, self.config, info_fd=info_write, seccomp_fd=seccomp_read, launcher=LAUNCHER)
        if host.stage is not None:
            argv = staged_argv(host, self.config, UID_RANGE[0] + secrets.randbelow(UID_RANGE[1] - UID_RANGE[0]),
                               argv)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, pass_fds=(info_write, seccomp_read), env=HOST_ENV)
        except OSError as exc:
            os.close(info_read)
            raise SandboxUnavailable(f"cannot start {argv[0]}: {exc}") from None
        finally:
            os.close(info_write)
            os.close(seccomp_read)
        call = _Call(proc, self.config.max_output_bytes, self.started_pids)
        call.info = asyncio.ensure_future(call.read_info(info_read))
        out = asyncio.ensure_future(call.read_capped(proc.stdout))
        err = asyncio.ensure_future(call.read_capped(proc.stderr))
        exited = asyncio.ensure_future(proc.wait())
        timed_out = False
        try:
            async with asyncio.timeout(timeout):
                await call.feed(code.encode("utf-8"))
                await asyncio.wait([out, err, exited])  # wait() leaves the tasks running when cancelled
        except TimeoutError:
            timed_out = True
        finally:
            # Shielded: a second cancel must not leave the sandbox running.
            await asyncio.shield(call.finish(out, err, exited))
        error = describe_failure(returncode=proc.returncode, stderr=err.result().decode("utf-8", "replace"),
                                 timed_out=timed_out, overflow=call.overflow, limits=self._limits(timeout))
        return ToolResult(ok=error is None, stdout=out.result().decode("utf-8", "replace"), error=error)

    def _limits(self, timeout: float) -> Limits:
        c = self.config
        return Limits(timeout_s=timeout, cpu_s=c.cpu_s, memory_mb=c.memory_mb, max_output_bytes=c.max_output_bytes,
                      max_processes=c.max_processes, file_mb=c.file_mb, disk_mb=c.disk_mb,
                      max_files=c.max_files if self._host is not None and self._host.stage else None)


class _Call:
    """One running sandbox: its output readers and the kill switch."""

    def __init__(self, proc: asyncio.subprocess.Process, cap: int, started_pids: deque[int]) -> None:
        self.proc = proc
        self.cap = cap
        self.overflow = False
        self.pidfd: int | None = None
        self.info: asyncio.Future | None = None
        """read_info's task; the kill waits for it (see stop)."""
        self.started_pids = started_pids
        started_pids.append(proc.pid)

    async def feed(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the sandbox died before reading its code; its exit status says why
        finally:
            self.proc.stdin.close()

    async def read_info(self, fd: int) -> None:
        """Reads bwrap's {"child-pid": N, ...} and holds a pidfd on N, so the kill
        cannot hit a recycled pid."""
        reader = asyncio.StreamReader()
        loop = asyncio.get_running_loop()
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                    os.fdopen(fd, "rb", buffering=0))
        try:
            data = b""
            while chunk := await reader.read(4096):
                data += chunk
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    pid = int(json.loads(data)["child-pid"])
                    self.started_pids.append(pid)
                    with contextlib.suppress(ProcessLookupError):
                        self.pidfd = os.pidfd_open(pid)
                    return
        finally:
            transport.close()

    async def read_capped(self, stream: asyncio.StreamReader) -> bytes:
        data = bytearray()
        while chunk := await stream.read(65536):
            if self.overflow:
                continue  # drain to EOF: the subprocess transport finishes only when its pipes close
            room = self.cap - len(data)
            data += chunk[:room]
            if len(chunk) > room:
                self.overflow = True
                await self.stop()
        return bytes(data)

    async def stop(self) -> None:
        if self.proc.returncode is not None:
            return
        if self.info is not None and not self.info.done():
            # bwrap writes the pid right after creating the sandbox: wait for it
            # briefly, so the kill goes to the sandbox's pid 1 rather than to bwrap.
            await asyncio.wait([self.info], timeout=0.5)
        self.kill()

    def kill(self) -> None:
        if self.proc.returncode is not None:
            return
        if self.pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        else:
            # Not yet inside the sandbox (or bwrap never said): bwrap's own death
            # takes the sandbox with it (--die-with-parent).
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    async def finish(self, *readers: asyncio.Future) -> None:
        await self.stop()  # a no-op when the code has exited
        await asyncio.wait(readers)
        self.info.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.info
        if self.pidfd is not None:
            os.close(self.pidfd)


def find_host(config: ToolConfig) -> Host:
    bwrap = shutil.which(config.bwrap)
    if bwrap is None:
        raise SandboxUnavailable(f"bubblewrap not found ({config.bwrap!r}): install the Debian package "
                                 "bubblewrap; code is not run without the sandbox")
    system = []
    for folder in SYSTEM_DIRS:
        if os.path.islink(folder):
            system.append(("symlink", os.readlink(folder), folder))
        elif os.path.isdir(folder):
            system.append(("ro-bind", folder, folder))
    covered = [dest for kind, _, dest in system if kind == "ro-bind"]
    prefixes = interpreter_prefixes(sys.base_prefix, sys.prefix, covered)
    if not is_inside(sys.executable, covered + prefixes):
        raise SandboxUnavailable(f"the interpreter {sys.executable} lies outside {covered + prefixes}")
    machine = os.uname().machine
    if not supported(machine):
        raise SandboxUnavailable(f"no seccomp filter for this machine ({machine}); code is not run without it")
    host = Host(bwrap=bwrap, python=sys.executable, seccomp=filter_program(machine), system=system,
                prefixes=prefixes)
    if os.geteuid() == 0:
        tools = {name: shutil.which(name, path=HOST_ENV["PATH"]) for name in ("unshare", "setpriv", "mount", "sh")}
        missing = [name for name, path in tools.items() if path is None]
        if missing:
            raise SandboxUnavailable(f"running as root needs {', '.join(missing)} (util-linux) to drop privileges")
        host.unshare, host.setpriv, host.mount, host.shell = (tools[n] for n in ("unshare", "setpriv", "mount", "sh"))
        host.stage = _make_stage(len(prefixes))
    return host


def _make_stage(count: int) -> str:
    stage = tempdirs.make("tool")
    os.chmod(stage, 0o755)  # the sandbox uid walks through it to reach the bound interpreter
    for name in [*map(str, range(count)), *SCRATCH]:  # mount points, in each call's own namespace
        os.mkdir(f"{stage}/{name}", 0o755)
    return stage


def _remove_stage(stage: str | None) -> None:
    # rmdir, never rmtree: should a bind ever show through here, it must not be emptied.
    if stage is not None and os.path.isdir(stage):
        tempdirs.remove_empty(stage)
