NUM_GPUS = 0
"""`kill -USR1` on a running `dynarl train` prints where each controller task waits
(core/run.py dump_tasks_on_sigusr1): the chain of awaits of a stuck run."""
import asyncio
import os
import signal

from dynarl.core.run import await_chain, dump_tasks_on_sigusr1


async def _inner(event: asyncio.Event) -> None:
    await event.wait()


async def _outer(event: asyncio.Event) -> None:
    await _inner(event)


async def test_sigusr1_prints_each_tasks_chain_of_awaits(capfd):
    event = asyncio.Event()
    task = asyncio.ensure_future(_outer(event), )
    task.set_name("stuck-step")
    await asyncio.sleep(0)
    assert [line.rsplit(" ", 1)[1] for line in await_chain(task.get_coro())][:2] == ["_outer", "_inner"]
    dump_tasks_on_sigusr1()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        await asyncio.sleep(0.1)
    finally:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR1)
        event.set()
        await task
    err = capfd.readouterr().err
    line = next(ln for ln in err.splitlines() if ln.startswith("--- task stuck-step"))
    assert "_inner" in line and "_outer" in line and line.index("_inner") < line.index("_outer")  # innermost first
