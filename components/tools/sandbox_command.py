"""The command line that starts one sandboxed Python call (pure: no I/O here).

bubblewrap always runs unprivileged, in a user namespace of its own:
`--unshare-all` takes away the network (the new network namespace holds only
loopback, so no route leads anywhere), the host's processes and IPC; the mount
namespace shows read-only system folders and the interpreter, plus three small
writable in-memory folders (the working folder, /tmp, /dev/shm); everything else,
/root and the repository included, does not exist. `--disable-userns` stops the
code from making namespaces of its own (which could mount an unbounded tmpfs), and
`--seccomp` refuses the syscalls that get around the rest (seccomp.py).

When we are root (CI, cluster nodes) the kernel would not apply RLIMIT_NPROC, so a
fork bomb would go unchecked: the call drops to a fresh unprivileged uid first.
Root also mounts the three writable folders itself, as tmpfs bounded in bytes and
in files (`disk_mb`, `max_files`): a file's inode is kernel memory no byte bound
counts (a million empty files). bwrap's own tmpfs, the unprivileged path, takes a
size only: there the file count is bounded by the kernel's tmpfs default (half
the machine's pages) alone.
That uid cannot walk into /root (mode 700) where pyenv keeps the interpreter, so a
private mount namespace, seen by nobody else, binds the interpreter's folders onto
a staging folder the uid can reach, and bwrap binds them back at their own paths.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from dynarl.components.tools.config import ToolConfig

WORKDIR = "/sandbox"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")
SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": WORKDIR, "TMPDIR": "/tmp", "LANG": "C.UTF-8",
    # One thread per numeric library: threads count against the process limit.
    "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
}
SCRATCH = {"shm": "/dev/shm", "tmp": "/tmp", "work": WORKDIR}
"""The writable folders (all in memory), by their staging folder's name."""
# Runs as root inside the private mount namespace, then becomes the sandbox uid.
# Arguments: UID SETPRIV MOUNT TMPFS_OPTIONS [SCRATCH]... -- [SOURCE STAGE]... -- BWRAP ARGS...
STAGE_SCRIPT = """set -e
uid=$1; setpriv=$2; mount=$3; options=$4; shift 4
while [ "$1" != "--" ]; do "$mount" -t tmpfs -o "$options,uid=$uid,gid=$uid" tmpfs "$1"; shift; done
shift
while [ "$1" != "--" ]; do "$mount" --bind "$1" "$2"; shift 2; done
shift
exec "$setpriv" --reuid="$uid" --regid="$uid" --clear-groups -- "$@"
"""


@dataclass(kw_only=True, slots=True)
class Host:
    """What the sandbox needs from this machine, found once (python_sandbox.find_host)."""
    bwrap: str
    python: str
    seccomp: bytes
    """The seccomp filter program (seccomp.filter_program) for this machine."""
    """The interpreter to run inside (this process's own, at the same path)."""
    system: list[tuple[str, str, str]]
    """("ro-bind", source, dest) or ("symlink", target, path) for each system folder."""
    prefixes: list[str]
    """Interpreter folders outside /usr, bound read-only at their own paths."""
    stage: str | None = None
    """Root only: a folder with one empty subfolder per prefix (0, 1, ...)."""
    unshare: str | None = None
    setpriv: str | None = None
    mount: str | None = None
    shell: str | None = None


def launcher_args(config: ToolConfig) -> list[str]:
    return [str(config.cpu_s), str(config.memory_mb << 20), str(config.max_processes),
            str(config.max_open_files), str(config.file_mb << 20)]


def bwrap_argv(host: Host, config: ToolConfig, *, info_fd: int, seccomp_fd: int, launcher: str) -> list[str]:
    disk = str(config.disk_mb << 20)
    # --as-pid-1: the launcher is pid 1 and bwrap's direct child. bwrap's own pid 1
    # would tell bwrap the moment the code exits, and bwrap would exit while that pid 1
    # is still killing what the code left behind; this way bwrap reaps the launcher,
    # whose exit the kernel completes only after every process in the namespace is gone.
    args = [host.bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
            "--new-session", "--as-pid-1", "--hostname", "sandbox", "--info-fd", str(info_fd),
            "--seccomp", str(seccomp_fd)]
    for kind, source, dest in host.system:
        args += [f"--{kind}", source, dest]
    # The private /tmp goes first: an interpreter that lives under /tmp (a venv there)
    # is bound on top of it below, instead of being hidden by it.
    args += ["--proc", "/proc", "--dev", "/dev"]
    for name, folder in SCRATCH.items():
        # root: the tmpfs staged_argv mounted, bounded in files too; else bwrap's own
        args += ["--bind", f"{host.stage}/{name}", folder] if host.stage else ["--size", disk, "--tmpfs", folder]
    covered = [dest for kind, _, dest in host.system if kind == "ro-bind"]
    for folder in parent_folders(host.prefixes, covered):
        # bwrap would copy the host's mode (0700 for /root): the sandbox uid must pass through.
        args += ["--perms", "0755", "--dir", folder]
    for index, prefix in enumerate(host.prefixes):
        source = f"{host.stage}/{index}" if host.stage else prefix
        args += ["--ro-bind", source, prefix]
    # Nothing else is writable: a file anywhere else would be memory with no bound.
    args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORKDIR, "--clearenv"]
    for name, value in SANDBOX_ENV.items():
        args += ["--setenv", name, value]
    return args + ["--", host.python, "-I", "-c", launcher, *launcher_args(config)]


def staged_argv(host: Host, config: ToolConfig, uid: int, inner: list[str]) -> list[str]:
    """Wraps `inner` (a bwrap command line) for root: private mounts (the writable
    folders, the interpreter's), then `uid`."""
    assert host.stage and host.unshare and host.setpriv and host.mount and host.shell
    options = f"size={config.disk_mb << 20},nr_inodes={config.max_files},mode=0755"
    binds: list[str] = []
    for index, prefix in enumerate(host.prefixes):
        binds += [prefix, f"{host.stage}/{index}"]
    return [host.unshare, "--mount", "--propagation", "private", "--", host.shell, "-c", STAGE_SCRIPT,
            "stage", str(uid), host.setpriv, host.mount, options, *(f"{host.stage}/{name}" for name in SCRATCH),
            "--", *binds, "--", *inner]


def parent_folders(paths: list[str], covered: list[str]) -> list[str]:
    """The folders above `paths`, outermost first, skipping any inside `covered`."""
    found: list[str] = []
    for path in paths:
        parts = path.strip("/").split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            folder = "/" + "/".join(parts[:depth])
            if folder not in found and not is_inside(folder, covered):
                found.append(folder)
    return found


def interpreter_prefixes(base_prefix: str, prefix: str, covered: list[str]) -> list[str]:
    """The interpreter's own folders that the system binds do not already show."""
    found: list[str] = []
    for path in (base_prefix, prefix):
        path = os.path.normpath(path)
        if not is_inside(path, covered + found):
            found.append(path)
    return found


def is_inside(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)
