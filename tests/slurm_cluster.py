"""A real slurm cluster of two nodes on this machine, for tests/test_slurm_real.py.

    with SlurmCluster(folder) as cluster:       # needs root and slurm-wlm; else pytest.skip
        job = cluster.sbatch(["--nodes=2", ..., script, ...], cwd=folder)
        cluster.wait_state(job, {"COMPLETED", "FAILED"}, timeout_s=120)

Each node is a network namespace (launch/netns.py) with a hostname of its own (a UTS
namespace: node0, node1) and its own /etc/hosts (bind-mounted in a mount namespace
of its own, which keeps this machine's /sys/fs/cgroup: slurmd needs it), running
Debian's slurmd. slurmctld runs on node0 and
munged (the authentication slurm uses) on this machine, its socket reached by path
from every namespace. Everything lives in one folder; on exit the daemons are
stopped and the namespaces deleted (launch/netns.py).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from dynarl.launch import netns

NEEDED = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo", "scancel", "scontrol", "nsenter", "unshare")
"""slurm-wlm's daemons and clients, munge, and util-linux's namespace tools."""


def why_not() -> str | None:
    missing = [d for d in NEEDED if shutil.which(d) is None]
    if missing:
        return f"slurm-wlm and munge are not installed (no {', '.join(missing)})"
    return netns.can_make_namespaces()


SLURM_CONF = """\
ClusterName=dynarltest
SlurmctldHost=node0({addr0})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge},cred_expire=10
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool/%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
ReturnToService=2
KillWait=30
{nodes}
PartitionName=test Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    def __init__(self, folder, nodes: int = 2) -> None:
        self.dir = str(folder)
        self.count = nodes
        self.names = [f"node{i}" for i in range(nodes)]
        self.hosts = netns.Hosts(nodes)
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.munge = os.path.join(self.dir, "munge", "munge.socket")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        self.etc_hosts = os.path.join(self.dir, "hosts")
        self._daemons: list[subprocess.Popen] = []
        self.daemon_pids: dict[int, set[int]] = {}
        """Per node, the processes in its namespace once the cluster is up (slurmd, and slurmctld on node0)."""

    def __enter__(self) -> "SlurmCluster":
        why = why_not()
        if why is not None:
            pytest.skip(why)
        self.hosts.__enter__()
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self) -> None:
        munge_dir = os.path.dirname(self.munge)
        for sub in ("state", "spool", munge_dir):
            os.makedirs(os.path.join(self.dir, sub), mode=0o700, exist_ok=True)
        key = os.path.join(munge_dir, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o600)
        self._daemons.append(subprocess.Popen(
            ["munged", "--foreground", "--force", f"--socket={self.munge}", f"--key-file={key}",
             f"--pid-file={munge_dir}/munged.pid", f"--log-file={munge_dir}/munged.log",
             f"--seed-file={munge_dir}/munged.seed"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        self._wait(lambda: os.path.exists(self.munge), "munged's socket")
        cpus = os.cpu_count() or 1
        nodes = "\n".join(f"NodeName={n} NodeAddr={a} CPUs={cpus} RealMemory=1000 State=UNKNOWN"
                          for n, a in zip(self.names, self.hosts.addr))
        with open(self.conf, "w") as f:
            f.write(SLURM_CONF.format(addr0=self.hosts.addr[0], munge=self.munge, dir=self.dir, nodes=nodes,
                                      names=",".join(self.names)))
        with open(self.etc_hosts, "w") as f:
            f.write("127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in zip(self.names, self.hosts.addr)))
        for k in range(self.count):
            os.makedirs(os.path.join(self.dir, "spool", self.names[k]), mode=0o700, exist_ok=True)
        self._daemons.append(self.popen(0, ["slurmctld", "-D", "-i", "-f", self.conf]))
        for k, name in enumerate(self.names):
            self._daemons.append(self.popen(k, ["slurmd", "-D", "-f", self.conf, "-N", name]))
        self._wait(self._nodes_idle, "both slurmd nodes idle", timeout_s=60)
        self.daemon_pids = {k: set(self.hosts.pids(k)) for k in range(self.count)}

    def command(self, host: int, argv: list[str]) -> list[str]:
        """`argv` on node `host`: its network namespace, its hostname, the cluster's /etc/hosts."""
        setup = f'hostname {self.names[host]} && mount --bind {self.etc_hosts} /etc/hosts && exec "$@"'
        return ["nsenter", f"--net=/run/netns/{self.hosts.names[host]}", "unshare", "--uts", "--mount",
                "sh", "-c", setup, "sh", *argv]

    def popen(self, host: int, argv: list[str]) -> subprocess.Popen:
        return subprocess.Popen(self.command(host, argv), env=self.env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)

    def _nodes_idle(self) -> bool:
        out = self.run(0, ["sinfo", "-h", "-N", "-o", "%N %t"])
        states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
        return all(states.get(n) == "idle" for n in self.names)

    def run(self, host: int, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """A slurm client command on `host` (as on a login node: node0)."""
        return subprocess.run(self.command(host, argv), env=self.env, capture_output=True, text=True, **kwargs)

    def sbatch(self, argv: list[str], cwd: str) -> int:
        done = self.run(0, ["sbatch", "--parsable", *argv], cwd=cwd, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"sbatch failed: {done.stderr.strip()}")
        return int(done.stdout.strip().split(";")[0])

    def state(self, job: int) -> str:
        out = self.run(0, ["scontrol", "-o", "show", "job", str(job)], timeout=30).stdout
        for part in out.split():
            if part.startswith("JobState="):
                return part.split("=", 1)[1]
        return "UNKNOWN"

    def wait_state(self, job: int, states: set[str], timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while (state := self.state(job)) not in states:
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job} is {state} after {timeout_s} s, not one of {sorted(states)}\n"
                                     + self.log("slurmctld.log")[-2000:])
            time.sleep(0.3)
        return state

    def log(self, name: str) -> str:
        path = os.path.join(self.dir, name)
        return open(path).read() if os.path.exists(path) else ""

    def _wait(self, ready, what: str, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"slurm test cluster: no {what} within {timeout_s} s\n"
                                   + self.log("slurmctld.log")[-2000:])
            time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        self.hosts.__exit__(*exc)  # SIGKILLs slurmctld, the slurmds and whatever they left
        for proc in self._daemons:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
