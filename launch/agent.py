"""The node agent: one per node, started by torchrun or srun.

    torchrun --nnodes=1 --nproc-per-node=2 -m dynarl.launch.agent CONFIG [key=value ...] [--run-dir DIR] [--resume DIR]

Each agent process stands for one node (its RANK is the node index). The agent
of node 0 also hosts the controller and runs the workflow named in CONFIG; the
others connect to it and start worker processes when asked. Worker processes
connect to the controller directly.

CONFIG (YAML) is either a workflow of your own:
    runtime: {launcher: agent, cluster: {num_nodes: 2, devices_per_node: 1}}
    workflow: package.module:function     # async def function(ctl, **workflow_kwargs)
    workflow_kwargs: {}
or a `dynarl train` config with runtime.launcher agent (overrides, --run-dir and
--resume as for `dynarl train`): agent 0 runs the training job on the cluster.

The job secret is handed to every agent out-of-band: DYNARL_SECRET_FILE (a file
readable only by the job's user on every node; the slurm template makes one) or
DYNARL_SECRET (hex). When every agent runs on one host and neither is set, agent 0
writes a private file under the run's temporary directory for the others.
"""
from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib
import importlib.util
import os
import secrets
import shutil
import stat
import sys
from datetime import timedelta
from typing import Any

import uvloop

from dynarl.core import yaml_config
from dynarl.core.config import RuntimeConfig
from dynarl.core.config_tree import build
from dynarl.core.controller import Controller
from dynarl.core.worker import WorkerSpec
from dynarl.launch.agent_launcher import AgentLauncher
from dynarl.launch.worker_main import TERM_GRACE_S, after_sigterm, die_with_parent
from dynarl.launch.local import bootstrap_line_for, free_local_port, reap, start_worker_process, worker_environment
from dynarl.launch.node_host import advertised_host
from dynarl.transport import tempdirs
from dynarl.transport.endpoints import with_host
from dynarl.transport.errors import ConfigError
from dynarl.transport.rpc import RpcEndpoint
from dynarl.transport.sockets import DealerClient
from dynarl.transport.wire import Codec

STORE_KEY = "dynarl/controller_address"


def load_config(path: str) -> tuple[RuntimeConfig, str, dict]:
    with open(path) as f:
        data = yaml_config.load(f) or {}
    unknown = set(data) - {"runtime", "workflow", "workflow_kwargs"}
    if unknown:
        raise ConfigError(sorted(unknown)[0], "unknown key; allowed: runtime, workflow, workflow_kwargs")
    runtime = build(RuntimeConfig, data.get("runtime"), "runtime")
    if runtime.launcher != "agent":
        raise ConfigError("runtime.launcher", "must be 'agent' under torchrun/srun")
    if not isinstance(data.get("workflow"), str) or ":" not in data["workflow"]:
        raise ConfigError("workflow", "give the workflow as 'module:function' or 'path/file.py:function'")
    return runtime, data["workflow"], dict(data.get("workflow_kwargs") or {})


def is_workflow_config(path: str) -> bool:
    """A `workflow: module:function` config; otherwise a `dynarl train` config (whose
    optional `workflow` field names a built-in flow such as 'agentic')."""
    with open(path) as f:
        data = yaml_config.load(f) or {}
    workflow = data.get("workflow") if isinstance(data, dict) else None
    return isinstance(workflow, str) and ":" in workflow


def train_runtime(argv: list[str], node: int) -> tuple[RuntimeConfig, Any]:
    """A `dynarl train` command line: the runtime, and on node 0 the prepared job
    (validated as `dynarl train` does; other nodes only read the runtime)."""
    from dynarl.launch import train

    parsed = train.parse_args(argv)
    if parsed is None:
        raise train.UsageError(train.USAGE)
    config_path, overrides, run_dir, resume = parsed
    if node == 0:
        job = train.prepare(config_path, overrides, run_dir, resume)
        runtime = job.cfg.runtime
    else:
        job = None
        runtime = train.resolve_config(config_path, overrides, resume).runtime
    if runtime.launcher != "agent":
        raise ConfigError("runtime.launcher", "must be 'agent' under torchrun/srun")
    return runtime, job


def load_workflow(ref: str) -> Any:
    target, _, name = ref.rpartition(":")
    if target.endswith(".py"):
        spec = importlib.util.spec_from_file_location("__dynarl_workflow__", target)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    return getattr(module, name)


def read_secret_file(path: str, what: str) -> bytes:
    """The hex key in `path`, which must be a regular file of this user that nobody else
    may read or write, in a folder nobody else may write (what ssh asks of a key). On
    one host the path comes through the unauthenticated store, where another local user
    could have put one of theirs: they cannot make a file that passes this."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ConfigError(what, f"cannot open the secret file {path!r}: {exc.strerror}") from None
    try:
        info, folder = os.fstat(fd), os.stat(os.path.dirname(os.path.abspath(path)))
        uid = os.getuid()
        if not stat.S_ISREG(info.st_mode) or info.st_uid != uid or info.st_mode & 0o077:
            raise ConfigError(what, f"the secret file {path!r} must be a regular file of uid {uid} with no "
                              f"access for group or others (mode {stat.S_IMODE(info.st_mode):o}, "
                              f"owner {info.st_uid}): chmod 600 it")
        if folder.st_uid not in (uid, 0) or folder.st_mode & 0o022 and not folder.st_mode & stat.S_ISVTX:
            raise ConfigError(what, f"the folder of the secret file {path!r} may be written by others")
        with os.fdopen(fd, "rb") as f:
            fd = -1
            text = f.read().decode(errors="replace").strip()
    finally:
        if fd >= 0:
            os.close(fd)
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ConfigError(what, f"the secret file {path!r} does not hold a hex key") from None


def job_secret(store: Any, node: int, single_host: bool) -> bytes:
    if os.environ.get("DYNARL_SECRET_FILE"):
        return read_secret_file(os.environ["DYNARL_SECRET_FILE"], "DYNARL_SECRET_FILE")
    if os.environ.get("DYNARL_SECRET"):
        return bytes.fromhex(os.environ["DYNARL_SECRET"])
    if not single_host:
        raise ConfigError("DYNARL_SECRET_FILE", "agents on several hosts need a shared secret file "
                          "readable only by the job's user (launch/slurm/dynarl.sbatch creates one)")
    # One host: only the path travels through the (unauthenticated) store, never the secret.
    if node == 0:
        folder = tempdirs.make("agent")
        atexit.register(shutil.rmtree, folder, True)  # read by the other agents at their start only
        path = os.path.join(folder, "secret")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        secret = secrets.token_bytes(32)
        os.write(fd, secret.hex().encode())
        os.close(fd)
        store.set("dynarl/secret_path", path)
        return secret
    return read_secret_file(store.get("dynarl/secret_path").decode(), "dynarl/secret_path (from the store)")


def rendezvous_store(node: int, num_agents: int) -> Any:
    import torch.distributed as dist
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if port == 0:
        raise ConfigError("MASTER_PORT", "is 0: give torchrun a real --master-port (it does not report a chosen one)")
    # torchrun hosts the store itself when it says so; otherwise agent 0 does.
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return dist.TCPStore(host, port, num_agents, is_master=(node == 0 and not agent_store),
                         timeout=timedelta(seconds=120))


@contextlib.asynccontextmanager
async def agent_controller(runtime: RuntimeConfig, store: Any, secret: bytes, host: str):
    """Agent 0's controller: published in the store (at `host`, node 0's advertised
    address: the router may be bound to a wildcard), ready once every other agent said hello."""
    launcher = AgentLauncher(node_host=host)
    async with Controller(runtime, launcher=launcher, secret=secret) as ctl:
        store.set(STORE_KEY, with_host(ctl.router.address, host))
        await launcher.wait_for_agents(runtime.cluster.num_nodes - 1, runtime.spawn_timeout_s)
        yield ctl


async def run_controller(runtime: RuntimeConfig, workflow: Any, kwargs: dict, store: Any, secret: bytes,
                         host: str) -> Any:
    from dynarl.core.run import cancel_on_sigterm
    cancel_on_sigterm()  # SIGTERM (scancel): the workflow is cancelled and its ranks stopped in order
    async with agent_controller(runtime, store, secret, host) as ctl:
        return await workflow(ctl, **kwargs)


async def serve_node(node: int, address: str, secret: bytes, host: str, *, heartbeat_interval_s: float = 0.5,
                     controller_lost_s: float = 5.0) -> int:
    """An agent of node > 0: starts, stops and kills workers when the controller asks.
    Returns 0 after the controller's shutdown call, 1 when it lost the controller:
    unreachable for about `controller_lost_s` (its process died: half that; its host or
    the network did: the heartbeats go unanswered; sockets.DealerClient `liveness`).
    Then the agent kills its workers itself, so a controller gone without a shutdown
    leaves nothing running on this node."""
    dealer = DealerClient(Codec(secret), address, f"agent/{node}".encode(),
                          liveness=(heartbeat_interval_s, controller_lost_s))
    procs: dict[str, asyncio.subprocess.Process] = {}
    watchers: set[asyncio.Task] = set()
    done = asyncio.Event()
    code = 0
    try:
        async with asyncio.TaskGroup() as tg:
            endpoint: RpcEndpoint

            async def watch_worker(worker_id: str, proc: asyncio.subprocess.Process) -> None:
                exit_code = await proc.wait()
                procs.pop(worker_id, None)
                await endpoint.event("worker_exit", {"worker_id": worker_id, "code": exit_code})

            async def serve(method: str, args: list, kwargs: dict) -> Any:
                if method == "spawn_worker":
                    spec = WorkerSpec(**args[0])
                    line = bootstrap_line_for(address, secret, spec, args[1], args[2], host)
                    proc = await start_worker_process(line, worker_environment(spec.env()))
                    procs[spec.worker_id] = proc
                    task = tg.create_task(watch_worker(spec.worker_id, proc))
                    watchers.add(task)
                    task.add_done_callback(watchers.discard)
                    return proc.pid
                if method == "stop_worker":
                    proc = procs.get(args[0])
                    return None if proc is None else await reap(proc, args[1])
                if method == "free_port":
                    return free_local_port(host)
                if method == "shutdown":
                    await asyncio.gather(*(reap(p, 0.0) for p in list(procs.values())), return_exceptions=True)
                    done.set()
                    return None
                raise ValueError(f"unknown agent call {method!r}")

            endpoint = RpcEndpoint("controller", dealer.send, serve=serve, spawn=tg.create_task)
            receiver = tg.create_task(dealer.serve(endpoint.handle))
            await endpoint.event("hello", {"node": node, "pid": os.getpid(), "host": host})
            terminated = asyncio.Event()  # SIGTERM, and the controller did not stop us within the grace
            after_sigterm(asyncio.get_running_loop(), terminated.set)
            shutdown, lost = tg.create_task(done.wait()), tg.create_task(dealer.watch.lost())
            term = tg.create_task(terminated.wait())
            await asyncio.wait([shutdown, lost, term], return_when=asyncio.FIRST_COMPLETED)
            if shutdown.done():
                lost.cancel()
                term.cancel()
                await asyncio.sleep(0.05)  # let the shutdown reply go out
            else:
                shutdown.cancel()
                if lost.done():
                    code, why = 1, f"lost the controller at {address} (unreachable for {lost.result():.1f} s)"
                    term.cancel()
                else:
                    code, why = 143, f"SIGTERM, and no shutdown from the controller within {TERM_GRACE_S:.0f} s"
                    lost.cancel()
                print(f"dynarl agent {node}: {why}; stopping its {len(procs)} worker(s) on this node",
                      file=sys.stderr, flush=True)
                await asyncio.gather(*(reap(p, 0.0) for p in list(procs.values())), return_exceptions=True)
                endpoint.fail(ConnectionError("the controller is gone"))  # ends calls being served
                for task in list(watchers):  # their exit reports have no one to go to
                    task.cancel()
            receiver.cancel()
    finally:
        dealer.close(linger_ms=1000 if code == 0 else 0)
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    die_with_parent()  # torchrun/srun going away takes the agent (and so its workers) along
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: torchrun ... -m dynarl.launch.agent CONFIG [key=value ...] [--run-dir DIR] [--resume DIR]",
              file=sys.stderr)
        return 2
    from dynarl.launch.train import UsageError

    node, num_agents = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    job = None
    try:
        if os.path.isfile(argv[0]) and is_workflow_config(argv[0]):
            if len(argv) != 1:
                raise UsageError("a 'workflow: module:function' config takes no further arguments")
            runtime, workflow_ref, kwargs = load_config(argv[0])
        else:
            runtime, job = train_runtime(argv, node)
    except (ConfigError, UsageError, OSError) as exc:
        print(f"dynarl agent: {exc}", file=sys.stderr)
        return 2
    if num_agents != runtime.cluster.num_nodes:
        print(f"dynarl agent: {num_agents} agents started but runtime.cluster.num_nodes is "
              f"{runtime.cluster.num_nodes}", file=sys.stderr)
        return 2
    try:
        store = rendezvous_store(node, num_agents)
    except ConfigError as exc:
        print(f"dynarl agent: {exc}", file=sys.stderr)
        return 2
    single_host = os.environ.get("LOCAL_WORLD_SIZE") == os.environ.get("WORLD_SIZE")
    secret = job_secret(store, node, single_host)
    try:
        host = advertised_host(runtime.bind_host, node, master_addr=os.environ.get("MASTER_ADDR"),
                               override=os.environ.get("DYNARL_NODE_HOST"))
    except (ValueError, OSError) as exc:
        print(f"dynarl agent: cannot tell this node's address: {exc}", file=sys.stderr)
        return 2
    if node == 0 and job is not None:
        return job.run(controller=lambda rt: agent_controller(rt, store, secret, host))
    if node == 0:
        try:
            result = uvloop.run(run_controller(runtime, load_workflow(workflow_ref), kwargs, store, secret, host))
        except asyncio.CancelledError:
            print("dynarl agent: terminated (SIGTERM); the workflow's ranks were stopped in order", file=sys.stderr)
            return 143
        print(f"dynarl agent: workflow finished: {result!r}")
        return 0
    address = store.get(STORE_KEY).decode()
    return uvloop.run(serve_node(node, address, secret, host, heartbeat_interval_s=runtime.heartbeat_interval_s,
                                 controller_lost_s=runtime.heartbeat_timeout_s))


if __name__ == "__main__":
    sys.exit(main())
