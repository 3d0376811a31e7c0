NUM_GPUS = 0

import json
import os
import signal
import subprocess
import sys
import time

from agent_workflow import two_node_train_config
from conftest import assert_reaped, marked_processes
from dynarl.launch.local import free_local_port

TESTS = os.path.dirname(os.path.abspath(__file__))


def spread_job(tmp_path, workflow: str, runtime_extra: str = "") -> tuple:
    """A two-node workflow config running tests/agent_workflow.py's `workflow`; (config, its out file)."""
    out = tmp_path / "result.json"
    config = tmp_path / "job.yaml"
    config.write_text(f"""
runtime:
  launcher: agent
  cluster: {{num_nodes: 2, devices_per_node: 1}}
{runtime_extra}workflow: agent_workflow:{workflow}
workflow_kwargs: {{out: "{out}"}}
""")
    return config, out


def test_two_agents_under_torchrun_run_a_group_spread_over_both_nodes(tmp_path):
    config, out = spread_job(tmp_path, "spread")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    env.pop("DYNARL_SECRET", None)
    env.pop("DYNARL_SECRET_FILE", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
         f"--master-port={free_local_port()}", "-m", "dynarl.launch.agent", str(config)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun and every agent it started
            proc.wait()
    assert proc.returncode == 0, stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["nodes"] == [0, 1]
    # Rank 0 was started by agent 0 (the controller's process), rank 1 by the other agent.
    assert result["parents"][0] == result["agent0"]
    assert result["parents"][1] != result["agent0"]
    assert_reaped(result["pids"] + [result["parents"][1]])


def test_two_agents_run_a_dynarl_train_config(tmp_path):
    """A `dynarl train` config under torchrun: agent 0 runs the job, the trainer's two
    ranks (devices 2 and 3) live on node 1, and every process is gone afterwards."""
    config = tmp_path / "train.yaml"
    config.write_text(two_node_train_config())
    marker = f"agent-train-{os.getpid()}"
    env = dict(os.environ, DYNARL_TEST_MARKER=marker)
    env.pop("DYNARL_SECRET", None)
    env.pop("DYNARL_SECRET_FILE", None)
    run_dir = tmp_path / "run"

    def agents(*args):
        proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
             f"--master-port={free_local_port()}", "-m", "dynarl.launch.agent", *args],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=600)  # a hang bound: ~45 s on a loaded host
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        assert proc.returncode == 0, stderr[-3000:]
        return stdout + stderr

    out = agents(str(config), "run.steps=1", "--run-dir", str(run_dir))
    assert "placement spatial: rollout [0], inference [1], trainer [2, 3] on 4 devices" in out
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0]  # the override run.steps=1 reached the job
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 1
    assert marked_processes(marker) == []
    # --resume through the agents: every node reads the run's own config.yaml
    agents("run.steps=2", "--resume", str(run_dir))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert marked_processes(marker) == []


def test_the_agent_rejects_a_train_config_for_another_launcher(tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text("runtime: {launcher: local}\n")
    env = dict(os.environ, RANK="0", WORLD_SIZE="1")
    out = subprocess.run([sys.executable, "-m", "dynarl.launch.agent", str(config), "--run-dir", str(tmp_path / "r")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "runtime.launcher" in out.stderr


def test_an_agent_that_loses_its_controller_stops_its_workers_and_exits(tmp_path):
    """Agents started on their own (no torchrun to take them down): agent 0 (the
    controller) is SIGKILLed while a group spreads over both nodes. Agent 1 notices
    within its bound (runtime.heartbeat_timeout_s), says so, kills its worker and
    exits 1; rank 0 dies with agent 0. Nothing is left running."""
    config, out = spread_job(tmp_path, "spread_then_wait", "  heartbeat_timeout_s: 2.0\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_local_port()), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    env.pop("DYNARL_SECRET", None)
    env.pop("DYNARL_SECRET_FILE", None)
    agents = [subprocess.Popen([sys.executable, "-m", "dynarl.launch.agent", str(config)],
                               env=dict(env, RANK=str(node)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, start_new_session=True) for node in (0, 1)]
    try:
        deadline = time.monotonic() + 300
        while not out.exists() or not out.read_text():
            assert all(a.poll() is None for a in agents), agents[1].stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the group did not start"
            time.sleep(0.1)
        time.sleep(0.2)  # the file is written in one go; let it land
        result = json.loads(out.read_text())
        assert result["nodes"] == [0, 1]
        agents[0].kill()
        killed = time.monotonic()
        _, stderr = agents[1].communicate(timeout=120)
        noticed = time.monotonic() - killed
    finally:
        for a in agents:
            if a.poll() is None:
                os.killpg(a.pid, signal.SIGKILL)
                a.wait()
    assert agents[1].returncode == 1, stderr[-3000:]
    assert "lost the controller" in stderr and "stopping its 1 worker(s)" in stderr, stderr[-3000:]
    # the bound (2 s) plus its exit; without the liveness watch it would never notice (the
    # communicate above bounds that). Generous: a loaded machine stretches the exit.
    assert noticed < 2.0 + 30.0, f"agent 1 took {noticed:.1f} s to notice"
    deadline = time.monotonic() + 60
    while True:  # rank 0 goes by PDEATHSIG as agent 0 dies; init reaps both ranks
        try:
            assert_reaped(result["pids"] + [agents[1].pid])
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
