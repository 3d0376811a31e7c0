"""launch/slurm/dynarl.sbatch on a real slurm (Debian's slurm-wlm) of two nodes, each a
network namespace with its own hostname (tests/slurm_cluster.py). Runs as root where
slurm-wlm is installed (.ci/run installs it); skips with the reason elsewhere."""
NUM_GPUS = 0

import json
import os
import time

import pytest

from agent_workflow import two_node_train_config
from dynarl.components.workflows.checkpoints import latest_checkpoint
from slurm_cluster import SlurmCluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATE = os.path.join(ROOT, "launch", "slurm", "dynarl.sbatch")
NOT_HERE = ("--gpus-per-node=0", "--cpus-per-task=1")
"""The template asks for 8 GPUs and 32 CPUs per node; these test nodes have neither."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    folder = tmp_path_factory.mktemp("slurm")
    with SlurmCluster(folder) as c:
        c.env["HOME"] = str(folder)  # the template's secret folder, $HOME/.dynarl
        yield c


def submit(cluster, tmp_path, steps: int, options: tuple = (), overrides: tuple = ()) -> tuple[int, str]:
    config = tmp_path / "job.yaml"
    config.write_text(two_node_train_config(steps, bind_host="0.0.0.0"))
    job = cluster.sbatch(["--nodes=2", *NOT_HERE, *options, f"--output={tmp_path}/out.txt", TEMPLATE, str(config),
                          *overrides, "--run-dir", str(tmp_path / "run")], cwd=str(tmp_path))
    return job, str(tmp_path / "out.txt")


def assert_only_daemons_left(cluster) -> None:
    """Nothing of the job is left on either node: only munged's, slurmctld's and the slurmds' processes."""
    deadline = time.monotonic() + 15
    while True:
        left = {k: set(cluster.hosts.pids(k)) - cluster.daemon_pids[k] for k in range(cluster.count)}
        if not any(left.values()):
            return
        assert time.monotonic() < deadline, left
        time.sleep(0.2)


def test_slurm_runs_the_template_on_two_nodes(cluster, tmp_path):
    job, out = submit(cluster, tmp_path, 2)
    assert cluster.wait_state(job, {"COMPLETED", "FAILED", "CANCELLED"}, 180) == "COMPLETED", open(out).read()[-3000:]
    text = open(out).read()
    assert "rollout [0], inference [1], trainer [2, 3] on 4 devices" in text  # the trainer on node1
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert_only_daemons_left(cluster)
    assert os.listdir(os.path.join(cluster.env["HOME"], ".dynarl")) == []  # the job's secret went with it


def test_scancel_ends_a_run_in_order_and_leaves_nothing(cluster, tmp_path):
    """scancel signals every process of the job at once (SIGTERM, then SIGKILL after
    KillWait); the workers and node agents outlive the SIGTERM so that the controller
    stops them in order and says how to continue."""
    job, out = submit(cluster, tmp_path, 500)
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        assert time.monotonic() < deadline and cluster.state(job) in ("PENDING", "RUNNING"), open(out).read()[-3000:]
        time.sleep(0.2)
    cancelled = time.monotonic()
    cluster.run(0, ["scancel", str(job)], timeout=30)
    assert cluster.wait_state(job, {"CANCELLED"}, 60) == "CANCELLED"
    assert_only_daemons_left(cluster)
    ended_s = time.monotonic() - cancelled
    text = open(out).read()
    assert "dynarl train: terminated; continue from step" in text, text[-3000:]
    for failure in ("shutdown step", "unreachable", "lost the controller", "SIGTERM, and no shutdown"):
        assert failure not in text, text[-3000:]  # every step of the ordered stop ran, on both nodes
    assert ended_s < 25, ended_s  # in order, well before slurm's SIGKILL (KillWait 30 s)
    assert os.listdir(os.path.join(cluster.env["HOME"], ".dynarl")) == []


def test_a_requeued_job_resumes_its_run(cluster, tmp_path):
    """sbatch --requeue, then `scontrol requeue` mid-run (what preemption or a node
    failure does): the template turns --run-dir into --resume on the restart, and the
    run ends with every step once."""
    job, out = submit(cluster, tmp_path, 6, options=("--requeue", "--open-mode=append"),
                      overrides=("run.checkpoint_every=2",))
    run = str(tmp_path / "run")
    deadline = time.monotonic() + 120
    while latest_checkpoint(run) is None:
        assert time.monotonic() < deadline and cluster.state(job) in ("PENDING", "RUNNING"), open(out).read()[-3000:]
        time.sleep(0.2)
    done = cluster.run(0, ["scontrol", "requeue", str(job)], timeout=30)
    assert done.returncode == 0, done.stderr
    assert cluster.wait_state(job, {"COMPLETED", "FAILED", "CANCELLED"}, 240) == "COMPLETED", open(out).read()[-3000:]
    text = open(out).read()
    assert f"restart 1 of job {job}: resuming {run}" in text, text[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(6))
    assert_only_daemons_left(cluster)
