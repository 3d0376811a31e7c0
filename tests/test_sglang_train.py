NUM_GPUS = 0
"""`dynarl train` with rollout.backend=sglang, end to end, on tests/fakes' SGLang engine
(sglang 0.5.23's signatures and idle/paused rules; tokens a function of the sequence):
the agentic workflow serves its turns through the SGLang adapter, and under
scheduler.policy=dynarl the SGLang engines of either workflow are released mid-step
(their requests, tokens so far, move to the kept engines) while the trainer reshards
onto their devices. The
worker processes import tests/fakes/sglang_pkg as `sglang`; the weight sync reaches
the fake through the adapter's bucketed update path. What a real SGLang engine does
is checked by tests/test_sglang_real_train.py."""
import json
import os
import sys

import pytest
import yaml

from conftest import assert_reaped
from dynarl.components.workflows.ledger import read_entries
from dynarl.launch.train import prepare

PKG = os.path.join(os.path.dirname(__file__), "fakes", "sglang_pkg")
PROMPTS, SAMPLES, STEPS = 4, 4, 2
ARGS = ["workflow=agentic", "task.kind=calc", "rollout.backend=sglang",
        "runtime.cluster.devices_per_node=4", "placement.mode=hybrid", "rollout.num_ranks=3",
        "inference.num_ranks=1", "trainer.num_ranks=1",
        f"rollout.samples_per_prompt={SAMPLES}", f"run.prompts_per_step={PROMPTS}", f"run.steps={STEPS}",
        "rollout.max_new_tokens=16", "trainer.warmup.steps=2", "agentic.queue=priority",
        "rollout.sglang.enable_priority_scheduling=true"]
FAST = ["scheduler.dynarl.interval_s=0.02", "scheduler.dynarl.charge_move_cost=false",
        "scheduler.dynarl.trainer_profile=home", "scheduler.dynarl.pack=8", "scheduler.dynarl.theta=0.6"]


@pytest.fixture(scope="module")
def fake_sglang_package():
    """The fake `sglang` on the path of this process and its workers, gone afterwards."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(PKG)
        mp.setenv("FAKE_SGLANG_TICK_S", "0.002")  # a decode step, so the tail lasts a few polls
        yield
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[name]


def _train(run_dir, *args):
    job = prepare(None, [(k, yaml.safe_load(v)) for k, _, v in (a.partition("=") for a in args)], run_dir, None)
    assert job.run() == 0
    w = job.workflow
    assert_reaped([p for group in (w.g.rollout, w.g.inference, w.g.trainer, *filter(None, [w.g.reward]),
                                   *([w.tools] if hasattr(w, "tools") else [])) for p in group.pids])
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    entries = read_entries(os.path.join(run_dir, "ledger.jsonl"))
    assert [e.step for e in entries] == list(range(STEPS))
    return rows, entries


def test_the_agentic_workflow_runs_on_sglang(fake_sglang_package, tmp_path):
    rows, entries = _train(str(tmp_path / "static"), *ARGS)
    for e in entries:  # every episode of every step trained once
        expected = {f"calc-{p}/{k}" for p in range(e.step * PROMPTS, (e.step + 1) * PROMPTS) for k in range(SAMPLES)}
        assert len(e.sample_ids) == len(expected) and set(e.sample_ids) == expected
    for r in rows:
        assert r["weight_version"] == r["step"]  # the fake engines got every step's weights
        assert r["episodes"] == PROMPTS * SAMPLES and r["episodes"] <= r["turns"] <= 3 * r["episodes"]
        assert sum(r["route_reasons"].values()) == r["turns"]


def test_dynarl_moves_sglang_engines_in_the_grpo_workflow(fake_sglang_package, tmp_path):
    job = ["rollout.backend=sglang", "runtime.cluster.devices_per_node=4",
           "placement.mode=hybrid", "rollout.num_ranks=3", "inference.num_ranks=1", "trainer.num_ranks=1",
           "rollout.max_new_tokens=48", "rollout.samples_per_prompt=8", f"run.steps={STEPS}", "trainer.warmup.steps=2"]
    static_rows, static = _train(str(tmp_path / "static"), *job)
    rows, entries = _train(str(tmp_path / "dynarl"), *job, "scheduler.policy=dynarl", *FAST)
    assert any(r["migrations"].get("workload:rollout") and r["migrations"].get("p2p:trainer") for r in rows), rows
    for s, d in zip(static, entries):  # the same samples as the static run, each once
        assert sorted(d.sample_ids) == sorted(s.sample_ids) and len(set(d.sample_ids)) == len(d.sample_ids)


def test_dynarl_moves_sglang_engines_in_the_agentic_workflow(fake_sglang_package, tmp_path):
    """The engines move (Workload out, P2P to the trainer, the engines back), every step
    runs to its end, and each trains the static run's episodes once. (Its second step used to stall: ranks
    released after the step's episodes were over got a second END, which ended their
    next step's turn serving before its first turn; episodes.py leave.)"""
    _, static = _train(str(tmp_path / "static"), *ARGS)
    rows, entries = _train(str(tmp_path / "dynarl"), *ARGS, "scheduler.policy=dynarl", *FAST)
    assert any(r["migrations"].get("workload:rollout") and r["migrations"].get("join:rollout") for r in rows), rows
    for s, d in zip(static, entries):
        assert sorted(d.sample_ids) == sorted(s.sample_ids) and len(set(d.sample_ids)) == len(d.sample_ids)
