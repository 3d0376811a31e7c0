import os

from dynarl.core.virtual_time import loop_factories_for


def pytest_configure(config):
    config.addinivalue_line("markers", "virtual_time: run the async test on the virtual-time loop")


def pytest_asyncio_loop_factories(config, item):
    return loop_factories_for(item)


def marked_processes(marker):
    """Live processes whose environment holds DYNARL_TEST_MARKER=marker: a test sets it
    on the command it starts, and every process below inherits it."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"DYNARL_TEST_MARKER={marker}".encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def assert_reaped(pids):
    """Every pid is gone: not running and not a zombie (the controller waited on it)."""
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        alive.append(pid)
    assert not alive, f"processes left behind: {alive}"


def children(pid):
    """The pids of `pid`'s child processes."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def running(pid):
    """Alive and not a zombie (a zombie of a dead parent may wait for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def kill_9_mid_run(argv, run_dir, after_steps, tmp_path, workers=None):
    """Starts `dynarl train` (argv), waits until metrics.jsonl has `after_steps` steps,
    SIGKILLs the controller and checks that its workers die with it (`workers`: how
    many there must be, if given). Returns how many steps metrics.jsonl then holds."""
    import signal
    import subprocess
    import time
    log = open(tmp_path / "first.log", "w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    deadline = time.monotonic() + 300  # a hang bound (a loaded host takes a minute to start the run)
    while time.monotonic() < deadline:  # past a checkpoint, inside a later step
        if os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= after_steps:
            break
        assert proc.poll() is None, open(tmp_path / "first.log").read()[-2000:]
        time.sleep(0.05)
    pids = children(proc.pid)
    if workers is not None:
        assert len(pids) == workers
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 60
    while any(running(w) for w in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [w for w in pids if running(w)], "workers outlived the killed controller"
    return sum(1 for _ in open(metrics))
