"""dynarl: a Ray-free, asyncio-native runtime for RL post-training of LLMs.

    import dynarl

    class Echo(dynarl.Worker):
        async def echo(self, x):
            return x

    async def workflow(ctl):
        group = await ctl.spawn(Echo, num_ranks=2)
        return await group.call(Echo.echo, 1)

    if __name__ == "__main__":
        print(dynarl.run(workflow, dynarl.RuntimeConfig(launcher="local")))  # [1, 1]

Save it as a script and run it. The `if __name__ == "__main__":` guard is needed:
each worker process imports the script to find Echo (as multiprocessing's spawn
does), and code outside the guard would run again there (a script without it fails
with MainGuardMissing, naming the script). Workers pass data over channels
(`ctl.channel(name)`, `self.channel(name)`: put, get, flush, close), and a dataclass
crosses as itself once registered (`@dynarl.register_struct(code)`): see
docs/architecture.md, "Channels and records".
"""
from dynarl.core.config import ClusterConfig, RuntimeConfig
from dynarl.core.controller import Controller
from dynarl.core.run import run
from dynarl.core.script_guard import MainGuardMissing
from dynarl.core.worker import Worker
from dynarl.core.worker_group import WorkerGroup
from dynarl.transport.errors import ChannelClosed, ConfigError, RemoteError, SpawnError, WorkerLost
from dynarl.transport.wire import register_struct
import dynarl.launch  # noqa: E402,F401  registers the built-in launchers

__all__ = ["ChannelClosed", "ClusterConfig", "ConfigError", "Controller", "MainGuardMissing", "RemoteError",
           "RuntimeConfig", "SpawnError", "Worker", "WorkerGroup", "WorkerLost", "register_struct", "run"]
