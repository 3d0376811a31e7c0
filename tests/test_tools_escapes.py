NUM_GPUS = 0

# Escapes tried from inside the Python sandbox: each is contained, comes back as
# an error the model can read, and the sandbox keeps serving calls afterwards.
# Where the launcher's audit hook words an error ("forbidden: ..."), a second try
# goes around the hook through libc (ctypes) to show that the namespaces and
# mounts are what contain it, not the hook.
import asyncio
import os
import pathlib
import sys
import time

import pytest

from conftest import assert_reaped
from dynarl.components.tools import PythonSandbox, ToolConfig

ROOT = pathlib.Path(__file__).resolve().parents[1]
# libc calls that the audit hook does not see.
RAW_CONNECT = """
import ctypes, struct
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.socket(2, 1, 0)  # AF_INET, SOCK_STREAM
address = struct.pack("=H", 2) + struct.pack("!H", {port}) + bytes([{ip}]) + bytes(8)
print(libc.connect(fd, address, 16), ctypes.get_errno())
"""
RAW_CREATE = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print(libc.open({path!r}.encode(), 0o101, 0o644), ctypes.get_errno())  # O_WRONLY | O_CREAT
"""


@pytest.fixture
async def sandbox():
    box = PythonSandbox(ToolConfig(timeout_s=5.0, memory_mb=256))
    yield box
    after = await box.run("print('still serving')")
    assert after.stdout == "still serving\n", after
    box.close()
    assert_reaped(list(box.started_pids))


@pytest.mark.parametrize("path", [
    "/etc/passwd", "/etc/hostname", str(pathlib.Path.home() / ".bashrc"), str(ROOT / "README.md"),
    str(ROOT / "components" / "tools" / "launcher.py"),
])
async def test_reading_files_outside_finds_nothing(sandbox, path):
    assert os.path.exists(path), "the host file must exist for the test to mean anything"
    result = await sandbox.run(f"print(open({path!r}).read())")
    assert not result.ok and result.stdout == ""
    assert result.error == f"exit code 1: FileNotFoundError: [Errno 2] No such file or directory: '{path}'"


async def test_only_the_interpreter_is_visible(sandbox):
    result = await sandbox.run("import os, sys\n"
                               "print(sorted(os.listdir('/')))\n"
                               "print(os.listdir(os.path.expanduser('~')), os.getcwd())\n"
                               "print(sorted(os.listdir('/' + sys.prefix.split('/')[1])))")
    top, home, first = result.stdout.splitlines()
    prefixes = {sys.prefix, sys.base_prefix}  # a venv binds its own folder and its base interpreter's
    assert set(eval(top)) <= {"bin", "dev", "lib", "lib32", "lib64", "proc", "sandbox", "sbin", "tmp", "usr",
                              *(p.split("/")[1] for p in prefixes)}
    assert home == "[] /sandbox"
    if not sys.prefix.startswith("/usr/"):
        # e.g. /root shows only the folder that leads to pyenv's interpreter, nothing else of /root
        top_folder = sys.prefix.split("/")[1]
        leading = {p.split("/")[2] for p in prefixes if p.split("/")[1] == top_folder}
        assert set(eval(first)) == leading


async def test_secret_host_file_in_tmp_is_not_reachable(sandbox, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    result = await sandbox.run(f"print(open({str(secret)!r}).read())")
    assert "FileNotFoundError" in result.error and "s3cret" not in result.stdout


@pytest.mark.parametrize("path", ["/root/pwned", str(ROOT / "pwned"), "/usr/pwned", "/etc/cron.d/pwned"])
async def test_writing_outside_the_working_folder_is_forbidden(sandbox, path):
    result = await sandbox.run(f"open({path!r}, 'w').write('x')")
    forbidden = result.error == f"forbidden: write outside the working folder ({path})"
    # A checkout under /tmp (CI may clone there) lies inside the sandbox's own empty,
    # writable /tmp: there the folder simply does not exist.
    missing = path.startswith("/tmp/") and "No such file or directory" in (result.error or "")
    assert forbidden or missing, result
    raw = await sandbox.run(RAW_CREATE.format(path=path))
    # around the hook, the kernel answers: read-only file system (30) or no such folder (2)
    fd, errno = raw.stdout.split()
    assert fd == "-1" and errno in ("30", "2"), raw
    assert not os.path.exists(path)


async def test_working_folder_is_fresh_for_every_call(sandbox):
    first = await sandbox.run("open('state.txt', 'w').write('x'); open('/tmp/t', 'w').write('y'); print('wrote')")
    second = await sandbox.run("import os; print(os.listdir('.'), os.listdir('/tmp'))")
    assert first.stdout == "wrote\n"
    # /tmp is empty but for a folder leading to the interpreter, when it lives there (a venv)
    in_tmp = sorted({p.split("/")[2] for p in {sys.prefix, sys.base_prefix} if p.startswith("/tmp/")})
    assert second.stdout == f"[] {in_tmp}\n"


async def test_connecting_to_a_local_server_fails(sandbox):
    accepted = []
    server = await asyncio.start_server(lambda r, w: (accepted.append(1), w.close()), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        result = await sandbox.run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)")
        assert result.error == "forbidden: no network"
        raw = await sandbox.run(RAW_CONNECT.format(port=port, ip="127, 0, 0, 1"))
        # the sandbox's loopback is its own: nothing listens there
        assert raw.stdout == "-1 111\n", raw  # ECONNREFUSED
        await asyncio.sleep(0.1)
        assert accepted == []
    finally:
        server.close()
        await server.wait_closed()


async def test_no_route_to_a_public_address(sandbox):
    result = await sandbox.run("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)")
    assert result.error == "forbidden: no network"
    raw = await sandbox.run(RAW_CONNECT.format(port=53, ip="1, 1, 1, 1"))
    assert raw.stdout == "-1 101\n", raw  # ENETUNREACH: the namespace has no route at all
    lookup = await sandbox.run("import socket\nsocket.getaddrinfo('pypi.org', 443)")
    assert lookup.error == "forbidden: no network"


async def test_no_namespaces_of_its_own(sandbox):
    # A user namespace of its own would let the code mount a tmpfs with no size bound.
    result = await sandbox.run("import ctypes\n"
                               "libc = ctypes.CDLL(None, use_errno=True)\n"
                               "print(libc.unshare(0x10000000), ctypes.get_errno())  # CLONE_NEWUSER")
    # EPERM: the seccomp filter refuses unshare (behind it, the namespace limit is 0 in
    # the sandbox: --disable-userns, which would answer ENOSPC)
    assert result.stdout == "-1 1\n", result


@pytest.mark.parametrize("nr, name", [(425, "io_uring_setup"), (319, "memfd_create"), (323, "userfaultfd"),
                                      (321, "bpf"), (101, "ptrace")])
async def test_seccomp_refuses_what_the_limits_do_not_contain(sandbox, nr, name):
    if os.uname().machine != "x86_64":
        pytest.skip("x86_64 syscall numbers")
    result = await sandbox.run("import ctypes\n"
                               "libc = ctypes.CDLL(None, use_errno=True)\n"
                               f"print(libc.syscall({nr}, 0, 0, 0, 0), ctypes.get_errno())  # {name}")
    assert result.stdout == "-1 1\n", result  # EPERM, from the filter


async def test_memfd_memory_cannot_get_around_the_memory_limit(sandbox):
    """A memfd's pages are not in the address space RLIMIT_AS bounds: 600 MB held that
    way under the 256 MB limit, before the filter refused memfd_create."""
    # 40 memfds of 15 MB each: every one under the file size limit (16 MB)
    result = await sandbox.run("import os\n"
                               "fds = [os.memfd_create(f'hog{i}') for i in range(40)]\n"
                               "for fd in fds:\n"
                               "    for _ in range(15):\n"
                               "        os.write(fd, b'x' * (1 << 20))\n"
                               "print(sum(os.fstat(fd).st_size for fd in fds) >> 20, 'MB held')\n")
    assert result.error is not None and "PermissionError" in result.error, result


SYSV_SHM_HOG = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
def shmem_mb():  # the host's: /proc/meminfo is not namespaced
    return int(next(line for line in open('/proc/meminfo') if line.startswith('Shmem:')).split()[1]) >> 10
before, held = shmem_mb(), 0
for _ in range(8):
    segment = libc.shmget(0, 256 << 20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
    if segment < 0:
        print('shmget', ctypes.get_errno())
        break
    address = libc.shmat(segment, None, 0)
    if address in (None, 2 ** 64 - 1):
        print('shmat', ctypes.get_errno())
        break
    ctypes.memset(address, 1, 256 << 20)
    libc.shmdt(ctypes.c_void_p(address))  # the segment outlives its mapping
    held += 1
print(held, shmem_mb() - before)
"""


async def test_sysv_shared_memory_cannot_get_around_the_memory_limit():
    """A System V segment is not in the address space once detached: 8 x 256 MB held
    under a 512 MB RLIMIT_AS (host Shmem +2,048 MB per call) before the filter refused
    System V IPC."""
    box = PythonSandbox(ToolConfig(timeout_s=20.0, memory_mb=512))
    try:
        result = await box.run(SYSV_SHM_HOG)
    finally:
        box.close()
    assert_reaped(list(box.started_pids))
    refused, tally = result.stdout.splitlines()
    assert refused == "shmget 1", result  # EPERM, from the filter
    held, grown_mb = map(int, tally.split())
    assert held == 0 and grown_mb < 128, result  # other jobs on the host move Shmem a little


@pytest.mark.parametrize("nr, name", [(29, "shmget"), (30, "shmat"), (64, "semget"), (68, "msgget")])
async def test_seccomp_refuses_sysv_ipc(sandbox, nr, name):
    if os.uname().machine != "x86_64":
        pytest.skip("x86_64 syscall numbers")
    result = await sandbox.run("import ctypes\n"
                               "libc = ctypes.CDLL(None, use_errno=True)\n"
                               f"print(libc.syscall({nr}, 0, 4096, 0o1600, 0), ctypes.get_errno())  # {name}")
    assert result.stdout == "-1 1\n", result


async def test_posix_shared_memory_is_the_bounded_dev_shm(sandbox):
    """shm_open (multiprocessing's shared memory) makes files in /dev/shm: its tmpfs
    bounds them (disk_mb, 64 MB here) where the address-space limit does not (each
    block unmapped once filled)."""
    result = await sandbox.run("from multiprocessing import shared_memory\n"
                               "for i in range(8):\n"
                               "    block = shared_memory.SharedMemory(name=f'hog{i}', create=True, size=12 << 20)\n"
                               "    block.buf[:] = b'x' * (12 << 20)\n"
                               "    block.close()\n"
                               "    print(i, flush=True)\n")
    assert result.stdout.split() == ["0", "1", "2", "3", "4"], result  # 60 MB held, the 6th block does not fit
    assert result.error == "crashed: SIGBUS", result  # a page of a full tmpfs, touched through the mapping


async def test_fork_bomb_hits_the_process_limit(sandbox):
    started = time.perf_counter()
    result = await sandbox.run("import os\nwhile True:\n    os.fork()")
    assert result.error == "process limit hit (16 processes and threads)"
    assert time.perf_counter() - started < 30  # (a hang bound: the error above names the process limit)


async def test_infinite_loop_times_out(sandbox):
    result = await sandbox.run("while True:\n    pass", timeout_s=1.5)
    assert result.error == "timeout after 1.5 s"
    assert 1.5 <= result.latency_s < 1.5 + 30  # the timeout, then the kill (slow on a loaded host)


async def test_busy_loop_hits_the_cpu_limit():
    box = PythonSandbox(ToolConfig(timeout_s=5.0, cpu_s=1))
    try:
        result = await box.run("while True:\n    pass")
        assert result.error == "cpu time limit hit (1 s)"
    finally:
        box.close()
    assert_reaped(list(box.started_pids))


async def test_huge_output_is_cut(sandbox):
    result = await sandbox.run("while True:\n    print('y' * 1000)")
    assert result.error == "output truncated at 65536 bytes"
    assert len(result.stdout) == 65536 and set(result.stdout) == {"y", "\n"}
    noisy = await sandbox.run("import sys\nsys.stderr.write('z' * 10**6)")
    assert noisy.error == "output truncated at 65536 bytes"


@pytest.mark.parametrize("code", [
    pytest.param("a = bytearray(2 ** 30)", id="one_block"),
    pytest.param("a = []\nwhile True:\n    a.append(bytearray(10 ** 6))", id="growing"),
])
async def test_memory_hog_hits_the_memory_limit(sandbox, code):
    result = await sandbox.run(code)
    assert result.error == "memory limit hit (256 MB)"


async def test_tmpfs_is_bounded(sandbox):
    result = await sandbox.run("f = open('/tmp/big', 'wb')\nwhile True:\n    f.write(bytes(1 << 20))")
    assert result.error in ("file size limit hit (16 MB)", "disk limit hit (64 MB)", "disk limit hit (64 MB or 4096 files)")


async def test_empty_files_hit_the_file_count_limit():
    """An inode is kernel memory no byte bound counts: a flood of empty files stops at
    max_files (root mounts the writable folders itself, bounded in files)."""
    if os.geteuid() != 0:
        pytest.skip("the file count is bounded when the runtime runs as root (sandbox_command.py)")
    box = PythonSandbox(ToolConfig(timeout_s=10.0, max_files=500))
    try:
        result = await box.run("import os\n"
                               "n = 0\n"
                               "try:\n"
                               "    while n < 100_000:\n"
                               "        open(f'f{n}', 'w').close()\n"
                               "        n += 1\n"
                               "finally:\n"
                               "    print(n)\n")
        assert result.error == "disk limit hit (64 MB or 500 files)", result
        assert 490 <= int(result.stdout) < 500, result  # the folder's own inode counts too
    finally:
        box.close()
    assert_reaped(list(box.started_pids))


def _pids_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


async def test_daemonized_child_does_not_outlive_the_call(sandbox):
    marker = f"{os.getpid() % 1000}.4172"  # sleep's argument: unique among host processes
    code = ("import os, time\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            f"        os.execv('/bin/sleep', ['sleep', '{marker}'])\n"
            "    os._exit(0)\n"
            "time.sleep(1.0)\n"
            "print('parent exits')\n")
    call = asyncio.ensure_future(sandbox.run(code))
    seen: set[int] = set()
    while not call.done():
        seen.update(_pids_with(marker))
        await asyncio.sleep(0.05)
    assert call.result().stdout == "parent exits\n"
    assert seen, "the daemon should have been visible while the call ran"
    assert_reaped(sorted(seen))
    assert _pids_with(marker) == []


async def test_daemonized_child_dies_on_timeout_too(sandbox):
    marker = f"{os.getpid() % 1000}.4173"
    code = ("import subprocess, time\n"
            f"subprocess.Popen(['/bin/sleep', '{marker}'], start_new_session=True)\n"
            "time.sleep(60)\n")
    call = asyncio.ensure_future(sandbox.run(code, timeout_s=1.0))
    seen: set[int] = set()
    while not call.done():
        seen.update(_pids_with(marker))
        await asyncio.sleep(0.05)
    assert call.result().error == "timeout after 1.0 s"
    assert seen
    assert_reaped(sorted(seen))
