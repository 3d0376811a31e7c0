NUM_GPUS = 0

import asyncio
import os
import shutil
import tempfile
import time

import pytest

from conftest import assert_reaped
from dynarl.components.tools import PythonSandbox, SandboxUnavailable, ToolConfig


# Drops every option and runs the command bare; only the interpreter's path is
# taken from the last --ro-bind, which carries the staging folder when we are root.
FAKE_BWRAP = """#!/bin/sh
source=; dest=
while [ "$1" != "--" ]; do
    if [ "$1" = "--ro-bind" ]; then source=$2; dest=$3; shift 3; else shift; fi
done
shift
python=$1; shift
case "$python" in "$dest"/*) python="$source${python#"$dest"}";; esac
exec "$python" "$@"
"""


@pytest.fixture
async def sandbox():
    box = PythonSandbox(ToolConfig(timeout_s=60.0, max_concurrency=16))  # a hang bound (16 starts at once)
    yield box
    box.close()
    assert_reaped(list(box.started_pids))


async def test_stdout_comes_back(sandbox):
    result = await sandbox.run("import math\nfor i in range(3):\n    print(i, math.factorial(i + 3))")
    assert (result.ok, result.stdout, result.error) == (True, "0 6\n1 24\n2 120\n", None)
    assert result.latency_s > 0


async def test_exceptions_come_back_as_their_last_line(sandbox):
    result = await sandbox.run("print('before')\n{}['missing']")
    assert (result.ok, result.stdout, result.error) == (False, "before\n", "exit code 1: KeyError: 'missing'")
    syntax = await sandbox.run("def f(:\n    pass")
    assert syntax.error == "exit code 1: SyntaxError: invalid syntax"
    exited = await sandbox.run("import sys\nsys.exit(3)")
    assert exited.error == "exit code 3"


async def test_code_runs_as_main_with_a_clean_environment(sandbox):
    os.environ["DYNARL_TOOL_TEST_SECRET"] = "hunter2"
    try:
        result = await sandbox.run("import os, sys\n"
                                   "print(__name__, sys.modules['__main__'].__dict__ is globals())\n"
                                   "print(sorted(os.environ))\n"
                                   "print(os.getuid() != 0, sys.stdin.read() == '')")
    finally:
        del os.environ["DYNARL_TOOL_TEST_SECRET"]
    name, env, checks = result.stdout.splitlines()
    assert name == "__main__ True"
    assert "DYNARL_TOOL_TEST_SECRET" not in env and "HOME" in env
    assert checks == "True True"  # not root; stdin holds nothing more than the code


async def test_sixteen_concurrent_calls_all_complete(sandbox):
    started = time.perf_counter()
    results = await asyncio.gather(*(sandbox.run(f"print({i} * {i})") for i in range(16)))
    wall = time.perf_counter() - started
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(16)]
    assert all(r.ok and 0 < r.latency_s <= wall for r in results)
    stats = sandbox.latency.stats()["python"]
    assert (stats["calls"], stats["errors"], stats["rejected"]) == (16, 0, 0)
    assert 0 < stats["p50_s"] <= stats["p95_s"] <= stats["max_s"] <= wall


async def test_concurrency_is_bounded_by_the_config():
    box = PythonSandbox(ToolConfig(max_concurrency=2))
    try:
        await box.check()
        started = time.perf_counter()
        results = await asyncio.gather(*(box.run("import time\ntime.sleep(0.4)\nprint('done')") for _ in range(4)))
        assert all(r.stdout == "done\n" for r in results)
        assert time.perf_counter() - started >= 0.8  # two rounds of two
    finally:
        box.close()
    assert_reaped(list(box.started_pids))


async def test_timeout_is_capped_by_the_config():
    box = PythonSandbox(ToolConfig(timeout_s=1.0))
    try:
        result = await box.run("import time\ntime.sleep(30)", timeout_s=100)
        assert result.error == "timeout after 1.0 s"
        with pytest.raises(ValueError, match="timeout_s"):
            await box.run("print(1)", timeout_s=0)
        with pytest.raises(ValueError, match="timeout_s"):
            await box.run("print(1)", timeout_s=float("nan"))
    finally:
        box.close()
    assert_reaped(list(box.started_pids))


@pytest.mark.parametrize("code, error", [
    pytest.param(123, "malformed request: code must be a string, got int", id="not_a_string"),
    pytest.param(None, "malformed request: code must be a string, got NoneType", id="none"),
    pytest.param("", "malformed request: code is empty", id="empty"),
    pytest.param("  \n", "malformed request: code is empty", id="blank"),
    pytest.param("print(1)\x00", "malformed request: code contains a NUL byte", id="nul"),
    pytest.param("x = 1\n" * 200, "malformed request: code is 1200 bytes, over the limit of 1000", id="too_long"),
])
async def test_malformed_requests_are_rejected_and_counted(code, error):
    box = PythonSandbox(ToolConfig(max_code_bytes=1000))
    result = await box.run(code)
    assert (result.ok, result.stdout, result.error, result.rejected) == (False, "", error, True)
    assert list(box.started_pids) == []  # nothing ran
    assert box.latency.stats()["python"]["rejected"] == 1


async def test_missing_bwrap_refuses_to_run_code(tmp_path):
    marker = tmp_path / "ran"
    box = PythonSandbox(ToolConfig(bwrap=str(tmp_path / "no-such-bwrap")))
    with pytest.raises(SandboxUnavailable, match="bubblewrap not found"):
        await box.run(f"open({str(marker)!r}, 'w').write('unsandboxed')")
    assert not marker.exists()
    assert list(box.started_pids) == []


async def test_failing_bwrap_refuses_to_run_code(tmp_path):
    marker = tmp_path / "ran"
    box = PythonSandbox(ToolConfig(bwrap=shutil.which("false")))
    with pytest.raises(SandboxUnavailable, match="cannot start the sandbox"):
        await box.run(f"open({str(marker)!r}, 'w').write('unsandboxed')")
    assert not marker.exists()
    assert_reaped(list(box.started_pids))


async def test_bwrap_that_does_not_isolate_is_refused():
    # A stand-in that runs the code without any isolation, as a broken or hostile
    # installation might. The probe notices; the user code never runs.
    folder = tempfile.mkdtemp(prefix="dynarl-fake-bwrap-")
    try:
        os.chmod(folder, 0o755)  # the sandbox uid must be able to run it
        fake = os.path.join(folder, "bwrap")
        with open(fake, "w") as f:
            f.write(FAKE_BWRAP)
        os.chmod(fake, 0o755)
        marker = os.path.join(folder, "ran")
        box = PythonSandbox(ToolConfig(bwrap=fake))
        # refused either way: the probe sees no isolation, or (an interpreter reached
        # through a link into /root, as a venv has) the stand-in cannot start it
        with pytest.raises(SandboxUnavailable, match="without isolation|cannot start the sandbox"):
            await box.run(f"open({marker!r}, 'w').write('unsandboxed')")
        assert not os.path.exists(marker)
        assert_reaped(list(box.started_pids))
    finally:
        shutil.rmtree(folder)


async def test_close_removes_the_staging_folder(sandbox):
    host = await sandbox.check()
    if os.geteuid() == 0:
        assert os.path.isdir(host.stage) and os.listdir(f"{host.stage}/0") == []  # the bind is private
        sandbox.close()
        assert not os.path.exists(host.stage)
    else:
        assert host.stage is None


async def test_cancelled_call_leaves_nothing_behind(sandbox):
    call = asyncio.ensure_future(sandbox.run("import time\nprint('up', flush=True)\ntime.sleep(30)"))
    await asyncio.sleep(0.5)
    assert not call.done()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert len(sandbox.started_pids) == 4  # probe and call: bwrap and the sandbox's pid 1 each
    assert_reaped(list(sandbox.started_pids))
    assert (await sandbox.run("print('next')")).stdout == "next\n"
