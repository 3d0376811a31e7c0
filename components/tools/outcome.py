"""What a tool call gives back, and the short error texts the model reads.

Pure functions of what the sandbox reported (exit status, the last line of
stderr, whether a limit of ours stopped it), so the wording is tested with plain
tables. An error names the limit that was hit and the value of that limit: the
model can act on "memory limit hit (512 MB)"; it cannot act on "exit code 1".
"""
from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any

from dynarl.transport.wire import register_struct

MAX_ERROR_CHARS = 300


@register_struct(63)
@dataclass(slots=True)
class ToolResult:
    """What a tool call gives back (a registered wire record: ToolWorker's python and calculator)."""
    ok: bool
    stdout: str
    """The text the model reads: the code's stdout, or the calculator's value."""
    error: str | None = None
    latency_s: float = 0.0
    """From the call's arrival to its answer, waiting for a free slot included."""
    rejected: bool = False
    """A malformed request, answered without running anything."""


def reject(reason: str) -> ToolResult:
    return ToolResult(ok=False, stdout="", error=f"malformed request: {reason}", rejected=True)


def code_problem(code: Any, max_code_bytes: int) -> str | None:
    """Why `code` is not a runnable request, or None."""
    if not isinstance(code, str):
        return f"code must be a string, got {type(code).__name__}"
    if not code.strip():
        return "code is empty"
    if "\x00" in code:
        return "code contains a NUL byte"
    try:
        size = len(code.encode("utf-8"))
    except UnicodeEncodeError:
        return "code is not valid UTF-8 text"
    if size > max_code_bytes:
        return f"code is {size} bytes, over the limit of {max_code_bytes}"
    return None


@dataclass(kw_only=True, slots=True)
class Limits:
    """The limits one call ran under (for wording the error)."""
    timeout_s: float
    cpu_s: int
    memory_mb: int
    max_output_bytes: int
    max_processes: int
    file_mb: int
    disk_mb: int
    max_files: int | None = None
    """None: not bounded (the unprivileged sandbox)."""


def describe_failure(*, returncode: int | None, stderr: str, timed_out: bool, overflow: bool,
                     limits: Limits) -> str | None:
    """The error text for one finished call, or None when it succeeded."""
    if timed_out:
        return f"timeout after {limits.timeout_s:.1f} s"
    if overflow:
        return f"output truncated at {limits.max_output_bytes} bytes"
    if returncode == 0:
        return None
    last = last_line(stderr)
    if returncode is not None and returncode > 128:
        return _signal_text(returncode - 128, limits)
    return _exception_text(last, limits) or f"exit code {returncode}" + (f": {last}" if last else "")


def last_line(text: str) -> str:
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()[:MAX_ERROR_CHARS]
    return ""


def _signal_text(number: int, limits: Limits) -> str:
    if number == signal.SIGXCPU:
        return f"cpu time limit hit ({limits.cpu_s} s)"
    if number == signal.SIGKILL:
        # Ours kills are reported as timeout/overflow above; this is the hard CPU
        # limit or the kernel's out-of-memory killer.
        return f"killed: cpu ({limits.cpu_s} s) or memory ({limits.memory_mb} MB) limit hit"
    if number == signal.SIGXFSZ:
        return f"file size limit hit ({limits.file_mb} MB)"
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    return f"crashed: {name}"


def _exception_text(last: str, limits: Limits) -> str | None:
    if "forbidden: " in last:
        return last[last.index("forbidden: "):]
    if "MemoryError" in last or "[Errno 12]" in last:
        return f"memory limit hit ({limits.memory_mb} MB)"
    if (last.startswith("BlockingIOError") and "[Errno 11]" in last) or "can't start new thread" in last:
        return f"process limit hit ({limits.max_processes} processes and threads)"
    if "[Errno 27]" in last:
        return f"file size limit hit ({limits.file_mb} MB)"
    if "[Errno 28]" in last:
        files = f" or {limits.max_files} files" if limits.max_files is not None else ""
        return f"disk limit hit ({limits.disk_mb} MB{files})"
    if "[Errno 24]" in last:
        return f"open file limit hit: {last}"
    return None
