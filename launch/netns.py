"""Hosts as Linux network namespaces on this machine: the multi-host tests
(tests/test_netns.py) and `dynarl bench hosts` run their nodes on them.

    with Hosts(3) as hosts:            # needs root (CAP_NET_ADMIN); else NamespacesUnavailable
        hosts.addr[1]                  # '198.18.0.2': host 1's only address besides loopback
        p = hosts.popen(1, [sys.executable, ...])  # a process on host 1
        hosts.cut(1); hosts.mend(1)    # host 1's link to the switch down / up again

Each host is a namespace with loopback and one veth interface, `eth0`; its peer
sits on a bridge in a namespace of its own (the switch), so nothing is added to
the machine's own network stack and every packet between two hosts crosses two
veth pairs and the bridge. The addresses are in 198.18.0.0/15 (RFC 2544, set aside
for benchmarks), which exists only inside these namespaces. `cut` sets the
switch-side end of a host's link down: its packets are dropped with no reset, as
on a pulled cable. On exit every process left in the namespaces is SIGKILLed and
the namespaces (with their links) are deleted.
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time

SUBNET = "198.18.0"
PREFIX = 24


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


class NamespacesUnavailable(RuntimeError):
    """This machine cannot make network namespaces (not root, no iproute2)."""


def can_make_namespaces() -> str | None:
    """None when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"dynarl-probe-{os.getpid()}"
    try:
        made = _ip("netns", "add", probe, check=False)
    except FileNotFoundError:
        return "the `ip` command (iproute2) is not installed"
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def secret_file(path: str) -> str:
    """Writes a fresh job key (hex) to `path`, mode 0600, as the slurm template does; returns it."""
    key = secrets.token_hex(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, key.encode())
    os.close(fd)
    return key


class Hosts:
    def __init__(self, count: int) -> None:
        self.count = count
        tag = f"{os.getpid()}-{time.monotonic_ns() % 1_000_000}"
        self.switch = f"dynarl-sw-{tag}"
        self.names = [f"dynarl-h{i}-{tag}" for i in range(count)]
        self.addr = [f"{SUBNET}.{i + 1}" for i in range(count)]
        self._procs: list[subprocess.Popen] = []

    def __enter__(self) -> "Hosts":
        why = can_make_namespaces()
        if why is not None:
            raise NamespacesUnavailable(why)
        try:
            self._build()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _build(self) -> None:
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, ns in enumerate(self.names):
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", self.switch, "link", "add", f"h{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", self.switch, "link", "set", f"h{i}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.addr[i]}/{PREFIX}", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
        for i in range(self.count):  # (a bridge with STP off forwards at once)
            state = _ip("-n", self.names[i], "-o", "link", "show", "eth0").stdout
            if "LOWER_UP" not in state:
                raise RuntimeError(f"host {i}'s link did not come up: {state.strip()}")

    def command(self, host: int, argv: list[str]) -> list[str]:
        """`argv` run on `host` (`ip netns exec` execs it: the pid is argv's own)."""
        return ["ip", "netns", "exec", self.names[host], *argv]

    def popen(self, host: int, argv: list[str], **kwargs) -> subprocess.Popen:
        proc = subprocess.Popen(self.command(host, argv), start_new_session=True, **kwargs)
        self._procs.append(proc)
        return proc

    def agents(self, nodes: int, args: list[str], *, env: dict, cwd: str, secret: str, logs: list[str],
               master_port: int = 29500) -> list[subprocess.Popen]:
        """A job's node agents, node k on host k, each under a torchrun of its own
        (`torchrun --nnodes=NODES --node-rank=k ... -m dynarl.launch.agent ARGS`), with
        the job key in the file `secret`; each one's output goes to logs[k]."""
        env = dict(env, DYNARL_SECRET_FILE=secret)
        env.pop("DYNARL_SECRET", None)
        procs = []
        for k in range(nodes):
            with open(logs[k], "w") as log:
                procs.append(self.popen(k, [
                    sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--node-rank={k}",
                    "--nproc-per-node=1", f"--master-addr={self.addr[0]}", f"--master-port={master_port}",
                    "-m", "dynarl.launch.agent", *args], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT))
        return procs

    def run(self, host: int, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(host, argv), **kwargs)

    def pids(self, host: int) -> list[int]:
        """Every process in `host`'s namespace."""
        out = _ip("netns", "pids", self.names[host], check=False).stdout
        return [int(p) for p in out.split()]

    def listeners(self, host: int) -> set[tuple[str, int]]:
        """(address, port) of every TCP socket listening in `host`'s namespace."""
        out = self.run(host, ["ss", "-Hltn"], capture_output=True, text=True, check=True).stdout
        found = set()
        for line in out.splitlines():
            local = line.split()[3]
            addr, _, port = local.rpartition(":")
            found.add((addr.strip("[]"), int(port)))
        return found

    def cut(self, host: int) -> None:
        _ip("-n", self.switch, "link", "set", f"h{host}", "down")

    def mend(self, host: int) -> None:
        _ip("-n", self.switch, "link", "set", f"h{host}", "up")

    def __exit__(self, *exc) -> None:
        for host in range(self.count):
            for pid in self.pids(host):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for ns in [*self.names, self.switch]:
            _ip("netns", "del", ns, check=False)
