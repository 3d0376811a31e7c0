NUM_GPUS = 0

import dataclasses

import pytest

from dynarl.components.tools.config import ToolConfig
from dynarl.components.tools.latency import LatencyLog
from dynarl.components.tools.outcome import Limits, code_problem, describe_failure
from dynarl.components.tools.sandbox_command import Host, bwrap_argv, interpreter_prefixes, parent_folders, staged_argv

LIMITS = Limits(timeout_s=2.0, cpu_s=10, memory_mb=512, max_output_bytes=65536, max_processes=32,
                file_mb=16, disk_mb=64)


@pytest.mark.parametrize("returncode, stderr, timed_out, overflow, error", [
    pytest.param(0, "", False, False, None, id="ok"),
    pytest.param(137, "", True, False, "timeout after 2.0 s", id="timeout_wins"),
    pytest.param(137, "", False, True, "output truncated at 65536 bytes", id="overflow"),
    pytest.param(1, "Traceback...\nValueError: boom\n", False, False, "exit code 1: ValueError: boom", id="exception"),
    pytest.param(3, "", False, False, "exit code 3", id="exit_code"),
    pytest.param(1, "Traceback\nMemoryError\n", False, False, "memory limit hit (512 MB)", id="memory"),
    pytest.param(1, "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 8 GiB", False, False,
                 "memory limit hit (512 MB)", id="numpy_memory"),
    pytest.param(1, "PermissionError: forbidden: no network\n", False, False, "forbidden: no network", id="forbidden"),
    pytest.param(1, "BlockingIOError: [Errno 11] Resource temporarily unavailable", False, False,
                 "process limit hit (32 processes and threads)", id="fork_limit"),
    pytest.param(1, "RuntimeError: can't start new thread", False, False,
                 "process limit hit (32 processes and threads)", id="thread_limit"),
    pytest.param(1, "OSError: [Errno 27] File too large", False, False, "file size limit hit (16 MB)", id="file_size"),
    pytest.param(1, "OSError: [Errno 28] No space left on device", False, False, "disk limit hit (64 MB)", id="disk"),
    pytest.param(152, "", False, False, "cpu time limit hit (10 s)", id="sigxcpu"),
    pytest.param(137, "", False, False, "killed: cpu (10 s) or memory (512 MB) limit hit", id="sigkill"),
    pytest.param(139, "", False, False, "crashed: SIGSEGV", id="segfault"),
])
def test_errors_name_what_happened(returncode, stderr, timed_out, overflow, error):
    assert describe_failure(returncode=returncode, stderr=stderr, timed_out=timed_out, overflow=overflow,
                            limits=LIMITS) == error


def test_a_full_folder_names_both_its_bounds_where_both_apply():
    limits = dataclasses.replace(LIMITS, max_files=500)  # root: tmpfs bounded in files too
    assert describe_failure(returncode=1, stderr="OSError: [Errno 28] No space left on device", timed_out=False,
                            overflow=False, limits=limits) == "disk limit hit (64 MB or 500 files)"


def test_long_error_lines_are_cut():
    error = describe_failure(returncode=1, stderr="ValueError: " + "x" * 5000, timed_out=False, overflow=False,
                             limits=LIMITS)
    assert len(error) < 400


@pytest.mark.parametrize("code, problem", [
    pytest.param("print(1)", None, id="fine"),
    pytest.param(b"print(1)", "code must be a string, got bytes", id="bytes"),
    pytest.param(None, "code must be a string, got NoneType", id="none"),
    pytest.param(" \n\t", "code is empty", id="blank"),
    pytest.param("print(1)\x00", "code contains a NUL byte", id="nul"),
    pytest.param("print('\ud800')", "code is not valid UTF-8 text", id="surrogate"),
    pytest.param("#" * 101, "code is 101 bytes, over the limit of 100", id="too_long"),
])
def test_code_problems(code, problem):
    assert code_problem(code, max_code_bytes=100) == problem


@pytest.mark.parametrize("field, value", [
    ("timeout_s", 0), ("timeout_s", -1.0), ("cpu_s", 0), ("memory_mb", 10), ("max_output_bytes", 0),
    ("max_concurrency", 0), ("max_processes", 0), ("max_open_files", 3), ("file_mb", 0), ("disk_mb", 1.5),
    ("max_code_bytes", True), ("bwrap", ""),
])
def test_config_errors_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        ToolConfig(**{field: value})


def test_latency_log_counts_and_percentiles():
    log = LatencyLog()
    for i in range(1, 101):
        log.record("python", i / 100, ok=i % 10 != 0)
    log.record("python", 0.0, ok=False, rejected=True)
    stats = log.stats()["python"]
    assert (stats["calls"], stats["errors"], stats["rejected"]) == (101, 10, 1)
    assert (stats["p50_s"], stats["p95_s"], stats["max_s"]) == (0.5, 0.95, 1.0)


def test_parent_folders_skip_what_system_binds_show():
    assert parent_folders(["/root/.pyenv/versions/3.11.7"], ["/usr"]) == [
        "/root", "/root/.pyenv", "/root/.pyenv/versions"]
    assert parent_folders(["/usr/local/py"], ["/usr"]) == []
    assert interpreter_prefixes("/usr", "/usr", ["/usr"]) == []
    assert interpreter_prefixes("/opt/py", "/opt/py/venv", ["/usr"]) == ["/opt/py"]
    assert interpreter_prefixes("/opt/py", "/srv/venv", ["/usr"]) == ["/opt/py", "/srv/venv"]


def test_command_isolates_and_drops_root():
    host = Host(bwrap="/usr/bin/bwrap", python="/opt/py/bin/python3", prefixes=["/opt/py"], seccomp=b"",
                system=[("ro-bind", "/usr", "/usr"), ("symlink", "usr/lib", "/lib")], stage="/tmp/stage",
                unshare="/usr/bin/unshare", setpriv="/usr/bin/setpriv", mount="/usr/bin/mount", shell="/bin/sh")
    inner = bwrap_argv(host, ToolConfig(), info_fd=7, seccomp_fd=8, launcher="LAUNCHER")
    for flag in ("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
                 "--clearenv"):
        assert flag in inner
    assert inner[inner.index("--info-fd") + 1] == "7" and inner[inner.index("--seccomp") + 1] == "8"
    # the prefix comes from the staging folder, back at its own path, read-only
    assert ["--ro-bind", "/tmp/stage/0", "/opt/py"] == inner[inner.index("/tmp/stage/0") - 1:][:3]
    assert inner[-10:] == ["--", "/opt/py/bin/python3", "-I", "-c", "LAUNCHER",
                           "10", str(512 << 20), "16", "64", str(16 << 20)]
    # root: the writable folders are the tmpfs the staging script mounts, bounded in
    # bytes and in files, bound at their places
    for name, folder in (("work", "/sandbox"), ("tmp", "/tmp"), ("shm", "/dev/shm")):
        assert ["--bind", f"/tmp/stage/{name}", folder] == inner[inner.index(f"/tmp/stage/{name}") - 1:][:3]
    assert "--tmpfs" not in inner
    outer = staged_argv(host, ToolConfig(disk_mb=8, max_files=100), 1234567890, inner)
    assert outer[:4] == ["/usr/bin/unshare", "--mount", "--propagation", "private"]
    assert outer[outer.index("stage") + 1:][:11] == [
        "1234567890", "/usr/bin/setpriv", "/usr/bin/mount", f"size={8 << 20},nr_inodes=100,mode=0755",
        "/tmp/stage/shm", "/tmp/stage/tmp", "/tmp/stage/work", "--", "/opt/py", "/tmp/stage/0", "--"]
    assert outer[-len(inner):] == inner
