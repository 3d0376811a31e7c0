"""Limits of the tool component: one sandboxed Python call, and how many run at once."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True, slots=True)
class ToolConfig:
    timeout_s: float = 10.0
    """Wall-clock limit of one Python call; also the ceiling for a per-call timeout."""
    cpu_s: int = 10
    """CPU seconds per sandbox process (RLIMIT_CPU); a busy loop is stopped by the
    smaller of this and timeout_s."""
    memory_mb: int = 512
    """Address space per sandbox process (RLIMIT_AS)."""
    max_output_bytes: int = 65536
    """stdout (and, separately, stderr) beyond this stops the call."""
    max_concurrency: int = 8
    """Python calls running at once; more wait their turn."""
    max_processes: int = 16
    """Processes and threads the sandbox may hold at once (RLIMIT_NPROC): stops fork bombs.
    Memory is bounded per process, so a call's worst case is max_processes * memory_mb."""
    max_open_files: int = 64
    """RLIMIT_NOFILE per sandbox process."""
    file_mb: int = 16
    """Largest file the code may write (RLIMIT_FSIZE)."""
    disk_mb: int = 64
    """Size of each of the sandbox's writable in-memory folders (the working folder, /tmp
    and /dev/shm)."""
    max_files: int = 4096
    """Files and folders each writable folder may hold (tmpfs nr_inodes; an inode is kernel
    memory that disk_mb does not count). Enforced when the runtime runs as root
    (sandbox_command.py); bwrap's unprivileged tmpfs takes no such bound."""
    max_code_bytes: int = 1 << 20
    """Longer code is rejected as a malformed request."""
    bwrap: str = "bwrap"
    """The bubblewrap binary (a name on PATH or a path). Without a working one no code runs."""

    def __post_init__(self) -> None:
        if not isinstance(self.timeout_s, (int, float)) or not 0 < self.timeout_s <= 3600:
            raise ValueError(f"timeout_s must be in (0, 3600], got {self.timeout_s!r}")
        for name in ("cpu_s", "memory_mb", "max_output_bytes", "max_concurrency", "max_processes",
                     "max_open_files", "file_mb", "disk_mb", "max_files", "max_code_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        # Python itself needs room to start: an interpreter, a few imports, stdio.
        if self.memory_mb < 64:
            raise ValueError(f"memory_mb must be >= 64 (the interpreter needs it to start), got {self.memory_mb}")
        if self.max_open_files < 16:
            raise ValueError(f"max_open_files must be >= 16, got {self.max_open_files}")
        if not isinstance(self.bwrap, str) or not self.bwrap:
            raise ValueError(f"bwrap must be a non-empty path or command name, got {self.bwrap!r}")
