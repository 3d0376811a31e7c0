"""dynarl: a Ray-free, asyncio-native runtime for RL post-training of LLMs.

    import dynarl

    class Echo(dynarl.Worker):
        async def echo(self, x):
            return x

    async def workflow(ctl):
        group = await ctl.spawn(Echo, num_ranks=2)
        return await group.call(Echo.echo, 1)

    dynarl.run(workflow, dynarl.RuntimeConfig(launcher="local"))
"""
from dynarl.core.config import ClusterConfig, RuntimeConfig
from dynarl.core.controller import Controller
from dynarl.core.run import run
from dynarl.core.worker import Worker
from dynarl.core.worker_group import WorkerGroup
from dynarl.transport.errors import ChannelClosed, ConfigError, RemoteError, SpawnError, WorkerLost
import dynarl.launch  # noqa: E402,F401  registers the built-in launchers

__all__ = ["ChannelClosed", "ClusterConfig", "ConfigError", "Controller", "RemoteError", "RuntimeConfig",
           "SpawnError", "Worker", "WorkerGroup", "WorkerLost", "run"]
