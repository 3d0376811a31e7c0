import os

from dynarl.core.virtual_time import loop_factories_for


def pytest_configure(config):
    config.addinivalue_line("markers", "virtual_time: run the async test on the virtual-time loop")


def pytest_asyncio_loop_factories(config, item):
    return loop_factories_for(item)


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
