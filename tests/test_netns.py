"""Multi-host across a real network boundary: each node is a network namespace with
an address of its own (launch/netns.py), its node agent started by torchrun there.
Runs as root (CI); skips with the reason elsewhere."""
NUM_GPUS = 0

import json
import os
import secrets
import subprocess
import sys
import time

import pytest

from agent_workflow import two_node_train_config
from dynarl.launch import netns


def hosts_or_skip(count: int) -> netns.Hosts:
    why = netns.can_make_namespaces()
    if why is not None:
        pytest.skip(why)
    return netns.Hosts(count)


TESTS = os.path.dirname(os.path.abspath(__file__))
MASTER_PORT = 29500
"""torchrun's rendezvous port on host 0 (each namespace has its own ports)."""


def start_agents(hosts: netns.Hosts, tmp_path, *args: str, nodes: int = 2, **env: str) -> list[subprocess.Popen]:
    """One torchrun per host, each starting that node's agent (node k on host k); `env`
    is added to their environment."""
    if not (tmp_path / "secret").exists():
        netns.secret_file(str(tmp_path / "secret"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]), **env)
    return hosts.agents(nodes, list(args), env=env, cwd=str(tmp_path), secret=str(tmp_path / "secret"),
                        logs=[str(tmp_path / f"node{k}.log") for k in range(nodes)], master_port=MASTER_PORT)


def log_of(tmp_path, node: int) -> str:
    return (tmp_path / f"node{node}.log").read_text()


def wait_all(procs: list[subprocess.Popen], tmp_path, timeout_s: float, while_running=None) -> None:
    deadline = time.monotonic() + timeout_s
    while any(p.poll() is None for p in procs):
        if time.monotonic() > deadline:
            raise AssertionError("the agents did not finish in time:\n" + log_of(tmp_path, 0)[-3000:])
        if while_running is not None:
            while_running()
        time.sleep(0.3)


def assert_nothing_left(hosts: netns.Hosts, nodes: int) -> None:
    """No process is left in the hosts' namespaces (agents, workers, torchrun)."""
    deadline = time.monotonic() + 60
    while any(hosts.pids(k) for k in range(nodes)):
        assert time.monotonic() < deadline, {k: hosts.pids(k) for k in range(nodes)}
        time.sleep(0.1)


def wait_for_file(path, procs, tmp_path, timeout_s: float = 90, key: str | None = None) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        if path.exists():
            data = json.loads(path.read_text())
            if key is None or key in data:
                return data
        assert all(p.poll() is None for p in procs), log_of(tmp_path, 0)[-3000:] + log_of(tmp_path, 1)[-2000:]
        assert time.monotonic() < deadline, log_of(tmp_path, 0)[-3000:]
        time.sleep(0.1)


def workflow_config(tmp_path, hosts: netns.Hosts, workflow: str, devices_per_node: int = 1, extra: str = "") -> str:
    out = tmp_path / "result.json"
    config = tmp_path / "job.yaml"
    config.write_text(f"""
runtime:
  launcher: agent
  bind_host: {hosts.addr[0]}
  cluster: {{num_nodes: 2, devices_per_node: {devices_per_node}}}
{extra}workflow: agent_workflow:{workflow}
workflow_kwargs: {{out: "{out}"{', release: "' + str(tmp_path / 'release') + '"' if workflow == 'spread_until' else ''}}}
""")
    return str(config)


def test_netns_a_train_job_with_its_trainer_on_another_host(tmp_path):
    """`dynarl train` with rollout and inference on host 0 and the trainer's two ranks
    on host 1: every step's weight sync crosses the hosts. Every socket of the job
    listens on its own host's address (or loopback), none on a wildcard."""
    with hosts_or_skip(2) as hosts:
        config = tmp_path / "train.yaml"
        config.write_text(two_node_train_config(2, bind_host=hosts.addr[0]))
        run_dir = tmp_path / "run"
        procs = start_agents(hosts, tmp_path, str(config), "--run-dir", str(run_dir))
        seen: list[set] = [set(), set()]

        def sample() -> None:
            for k in range(2):
                seen[k] |= hosts.listeners(k)
        wait_all(procs, tmp_path, 180, sample)
        assert [p.returncode for p in procs] == [0, 0], log_of(tmp_path, 0)[-3000:] + log_of(tmp_path, 1)[-3000:]
        assert "rollout [0], inference [1], trainer [2, 3] on 4 devices" in log_of(tmp_path, 0)
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [0, 1]
        assert_nothing_left(hosts, 2)
    for k in range(2):
        ours = {(a, p) for a, p in seen[k] if not (k == 0 and p == MASTER_PORT)}
        assert ours, f"no listener seen on host {k}"
        assert {a for a, _ in ours} <= {hosts.addr[k], "127.0.0.1"}, (k, sorted(ours))
    assert any(a == hosts.addr[1] for a, _ in seen[1])  # host 1's workers serve their peers there
    # torchrun's own rendezvous store (not the job's) listens on every interface of host 0
    assert {a for a, p in seen[0] if p == MASTER_PORT} in ({"*"}, {"0.0.0.0"})


def test_netns_a_third_host_without_the_job_key_gets_no_answer(tmp_path):
    """While a group spreads over hosts 0 and 1, host 2 knocks on every port they listen
    on: signed with a key of its own, nothing answers; signed with the job's key, the
    payload servers do (so the probe can tell). The job goes on unharmed. (The
    controller answers no unknown peer whatever the key: for it the probe shows only
    that a stranger's frames change nothing.)"""
    with hosts_or_skip(3) as hosts:
        key = netns.secret_file(str(tmp_path / "secret"))
        procs = start_agents(hosts, tmp_path, workflow_config(tmp_path, hosts, "spread_until"))
        out = tmp_path / "result.json"
        first = wait_for_file(out, procs, tmp_path)
        targets = [f"{a}:{p}" for k in range(2) for a, p in sorted(hosts.listeners(k))
                   if a == hosts.addr[k]]

        def probe(with_key: str) -> dict:
            done = hosts.run(2, [sys.executable, os.path.join(TESTS, "netns_probe.py"), with_key, *targets],
                             capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr[-2000:]
            return json.loads(done.stdout)
        stranger, member = probe(secrets.token_hex(32)), probe(key)
        (tmp_path / "release").write_text("")
        wait_all(procs, tmp_path, 60)
        assert [p.returncode for p in procs] == [0, 0], log_of(tmp_path, 0)[-3000:]
        assert json.loads(out.read_text())["after"] == [2, 2]  # both ranks answered after the probes
        assert_nothing_left(hosts, 2)
    controller_port = first["controller"].rpartition(":")[2]
    assert f"{hosts.addr[0]}:{controller_port}" in stranger["zmtp"]
    assert len(stranger["zmtp"]) >= 3  # the controller and each rank's payload server
    assert stranger["answered"] == []
    assert len(member["answered"]) >= 2, member  # the two ranks' payload servers


def test_netns_p2p_resharding_across_hosts_keeps_the_state_bitwise(tmp_path):
    """A 2-rank trainer moves by P2P from host 0 to host 1, then onto one device of each
    (its DP group across the hosts) and trains a step there. Gloo is pointed at the
    hosts' interface by name (GLOO_SOCKET_IFNAME, as on clusters with several networks)."""
    with hosts_or_skip(2) as hosts:
        procs = start_agents(hosts, tmp_path, workflow_config(tmp_path, hosts, "p2p_across_hosts", 2),
                             GLOO_SOCKET_IFNAME="eth0")
        wait_all(procs, tmp_path, 120)
        assert [p.returncode for p in procs] == [0, 0], log_of(tmp_path, 0)[-3000:]
        result = json.loads((tmp_path / "result.json").read_text())
        assert_nothing_left(hosts, 2)
    assert [m["nodes"] for m in result["moves"]] == [[1, 1], [0, 1]]
    for move in result["moves"]:
        assert move["elements"] > 0
        assert move["equal"] and all(move["equal"].values()), move["equal"]
        assert move["steps"] == [[2], [2]]
    assert result["trained_on"] == [3]


def test_netns_a_cut_link_mid_run_ends_the_train_job_naming_the_host(tmp_path):
    """Host 1's link goes down (no reset: a pulled cable) in the middle of a `dynarl
    train` run with the trainer there. Within runtime.heartbeat_timeout_s the run
    fails with one line naming node 1 and its address, without waiting on the
    unreachable agent; agent 1 stops its workers and exits 1; nothing is left on either host."""
    timeout_s = 2.0
    with hosts_or_skip(2) as hosts:
        config = tmp_path / "train.yaml"
        config.write_text(two_node_train_config(500, bind_host=hosts.addr[0],
                                                runtime_extra=f"  heartbeat_timeout_s: {timeout_s}\n"))
        procs = start_agents(hosts, tmp_path, str(config), "--run-dir", str(tmp_path / "run"))
        metrics = tmp_path / "run" / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), log_of(tmp_path, 0)[-3000:]
            time.sleep(0.1)
        cut = time.monotonic()
        hosts.cut(1)
        while "dynarl train: failed:" not in log_of(tmp_path, 0):
            assert time.monotonic() < cut + 60, log_of(tmp_path, 0)[-3000:]
            time.sleep(0.05)
        ended_s = time.monotonic() - cut
        assert procs[1].wait(timeout=60) == 1
        assert procs[0].wait(timeout=60) == 1
        assert_nothing_left(hosts, 2)
    failures = [line for line in log_of(tmp_path, 0).splitlines() if line.startswith("dynarl train: failed:")]
    assert len(failures) == 1, failures  # one line (torchrun adds its own report of agent 0's exit)
    failed = failures[0]
    assert f"from node 1 ({hosts.addr[1]})" in failed and "no heartbeat" in failed, failed
    # the heartbeat timeout plus teardown; a hang would run into the 60 s waits above.
    # Under the full suite on 2 cores the teardown took up to 3.1 s (5.14 s in all, once):
    # the margin is for a machine loaded more than that
    assert ended_s < timeout_s + 20.0, ended_s
    node1 = log_of(tmp_path, 1)
    assert "lost the controller" in node1 and "stopping its 2 worker(s)" in node1, node1[-2000:]


def test_netns_bench_hosts_measures_a_pair_on_each_side_of_the_link():
    why = netns.can_make_namespaces()
    if why is not None:
        pytest.skip(why)
    done = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "bench", "hosts", "--json", "--mb-items", "20",
                           "--p2p-repeats", "1"], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert [result[k]["nodes"] for k in ("loopback", "same_host", "veth_link")] == [[0, 0], [0, 0], [0, 1]]
    for where in ("loopback", "same_host", "veth_link"):
        assert min(result[where][k] for k in ("channel_mb_per_s", "tensor_mb_per_s", "weight_sync_mb_per_s")) > 0
    assert result["tensor_mb_per_s_veth_vs_loopback"] > 0
