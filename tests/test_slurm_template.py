"""launch/slurm/dynarl.sbatch with srun, scontrol and torchrun replaced by scripts
that record their arguments: each node's torchrun gets that node's rank (expanded
on the node, not once in the batch script), and the job's arguments reach the agent."""
import os
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]

FAKE_SRUN = """#!/bin/bash
# run the command once per node, as srun would, each with its own SLURM_NODEID
while [[ "$1" == --* ]]; do shift; done
for node in 0 1; do SLURM_NODEID=$node "$@"; done
"""
FAKE_TORCHRUN = """#!/bin/bash
echo "$*" >> "$RECORD"
"""
FAKE_SCONTROL = """#!/bin/bash
printf 'node-a\\nnode-b\\n'
"""


def test_each_node_gets_its_own_rank_and_the_arguments_reach_the_agent(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("torchrun", FAKE_TORCHRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    record = tmp_path / "calls.txt"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", RECORD=str(record), HOME=str(tmp_path),
               SLURM_JOB_NODELIST="node-[a-b]", SLURM_NNODES="2", SLURM_NODEID="0", SLURM_JOB_ID="7")
    out = subprocess.run(["bash", str(ROOT / "launch/slurm/dynarl.sbatch"), "job.yaml", "run.steps=3",
                          "--run-dir", "runs/x"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    calls = record.read_text().splitlines()
    assert len(calls) == 2
    for node, call in enumerate(calls):
        assert f"--node-rank={node}" in call
        assert "--master-addr=node-a" in call
        assert call.endswith("-m dynarl.launch.agent job.yaml run.steps=3 --run-dir runs/x")
    assert not (tmp_path / ".dynarl" / "job-7.secret").exists()  # removed when the job ends


def test_the_template_needs_a_config():
    out = subprocess.run(["bash", str(ROOT / "launch/slurm/dynarl.sbatch")], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, SLURM_JOB_NODELIST="n"))
    assert out.returncode != 0 and "usage" in out.stderr
