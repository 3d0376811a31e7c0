NUM_GPUS = 0
"""`dynarl train` with workflow agentic and the Python tool: the warm start demonstrates
"[py print(347*29)]", the model's calls run in the sandbox (components/tools/
python_sandbox.py) during RL, their output is the observation, and every worker
process is reaped."""

import json
import os

import yaml

from conftest import assert_reaped
from dynarl.launch.train import prepare

ARGS = ["workflow=agentic", "task.kind=calc", "task.calc.tool=py", "runtime.cluster.devices_per_node=2",
        "rollout.num_ranks=1", "inference.num_ranks=1", "trainer.num_ranks=1",
        "rollout.samples_per_prompt=4", "run.prompts_per_step=4", "run.steps=1",
        "rollout.max_new_tokens=24", "trainer.warmup.steps=60", "trainer.warmup.batch_size=32",
        "trainer.warmup.lr=0.003", "task.calc.warmup_direct_frac=0", "trainer.engine.micro_batch_size=32"]


def test_python_tool_calls_run_in_the_sandbox_during_training(tmp_path):
    run_dir = str(tmp_path / "run")
    job = prepare(None, [(k, yaml.safe_load(v)) for k, _, v in (a.partition("=") for a in ARGS)], run_dir, None)
    assert job.run() == 0
    w = job.workflow
    pids = [p for group in (w.g.rollout, w.g.inference, w.g.trainer, w.tools) for p in group.pids]
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert len(rows) == 1
    row = rows[0]
    calls = row["tool_calls_by_tool"]
    # the warm start taught "[py ...]" (only): the model calls the sandbox, not the calculator
    assert calls.get("py", 0) > calls.get("calc", 0), calls
    # the sandbox computed the products: some episodes answer exactly
    assert row["tool_errors"] < row["tool_calls"]
    assert_reaped(pids)
