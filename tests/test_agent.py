NUM_GPUS = 0

import json
import os
import signal
import subprocess
import sys

from conftest import assert_reaped
from dynarl.launch.local import free_local_port

TESTS = os.path.dirname(os.path.abspath(__file__))


def test_two_agents_under_torchrun_run_a_group_spread_over_both_nodes(tmp_path):
    out = tmp_path / "result.json"
    config = tmp_path / "job.yaml"
    config.write_text(f"""
runtime:
  launcher: agent
  cluster: {{num_nodes: 2, devices_per_node: 1}}
workflow: agent_workflow:spread
workflow_kwargs: {{out: "{out}"}}
""")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    env.pop("DYNARL_SECRET", None)
    env.pop("DYNARL_SECRET_FILE", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
         f"--master-port={free_local_port()}", "-m", "dynarl.launch.agent", str(config)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=60)
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
