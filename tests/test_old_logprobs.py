NUM_GPUS = 0
"""Where a step's old log-probs come from (components/workflows/old_logprobs.py,
inference.old_logprobs): the cases that keep the inference pass, a parity check that the
trainer's own forward gives the step what the pass would (the same gradient), and a
run without the pass that trains the same samples to the same rewards."""

import dataclasses
import json
import os

import pytest
import torch

from dynarl.components.experience import PromptGroup, Sample, old_logprobs, train_batch
from dynarl.components.trainer.native.trainer import NativeTrainer
from dynarl.components.workflows.config import load_config
from dynarl.components.workflows.ledger import read_entries
from dynarl.components.workflows.old_logprobs import needs_inference
from dynarl.launch.train import prepare
from grpo_tiny import overrides
from test_trainer import make_batch, make_config, make_model, one_torch_thread, step_gradients  # noqa: F401


@pytest.mark.parametrize("extra, reason", [
    ((), None),  # the default job: workflow grpo, fresh batches, native engines
    (("algorithm.name=dr_grpo", "algorithm.dynamic_sampling=true"), None),  # still on-policy, one update
    (("inference.old_logprobs=always",), "always"),
    (("trainer.engine.kl_coef=0.05",), "reference"),
    (("algorithm.rollout_correction=tis",), "rollout_correction"),
    (("trainer.streaming=true",), "streaming"),
    (("scheduler.policy=dynarl", "placement.mode=spatial", "runtime.cluster.devices_per_node=4",
      "rollout.num_ranks=2"), "dynarl"),
    (("placement.mode=spatial", "algorithm.max_staleness=1"), "off-policy"),
    (("rollout.oversample=1.5", "algorithm.max_staleness=1"), "off-policy"),
    (("workflow=ppo",), "workflow ppo"),
    (("runtime.cluster.device_kind=emulated", "rollout.backend=emulated", "inference.backend=emulated",
      "trainer.backend=emulated"), "engine other"),
])
def test_which_steps_keep_the_inference_pass(extra, reason):
    got = needs_inference(load_config(None, overrides(*extra)))
    assert got == reason if reason is None else reason in got


def test_old_logprobs_are_all_the_samples_or_none():
    with_old, without = Sample("a", 0), Sample("b", 1)
    with_old.old_logprobs = [-1.0, -2.0]
    assert old_logprobs([with_old]) == [[-1.0, -2.0]] and old_logprobs([without]) is None
    with pytest.raises(ValueError, match="some samples"):
        old_logprobs([with_old, without])


def test_a_batch_without_an_inference_pass_has_no_old_logprobs():
    sample = Sample("g0/0", 0)
    sample.finished([5, 6], [-0.5, -0.7], "stop", 0)
    sample.reward = 1.0
    batch = train_batch([PromptGroup(0, "p", "", [3, 4], [sample])], with_ref=False)
    assert batch.old_logprobs is None and batch.input_ids == [[3, 4, 5, 6]]


def the_weights_logprobs(model, batch):
    """What the inference pass computes: each response token's log-prob under `model`."""
    out = []
    with torch.no_grad():
        for ids, plen in zip(batch.input_ids, batch.prompt_lens):
            logits = model(torch.tensor([ids]))[0].float()  # (the project's Qwen2: logits)
            logp = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
            out.append(logp[plen - 1:].tolist())
    return out


def test_the_trainers_forward_gives_the_step_the_gradient_the_inference_pass_would():
    """On-policy, one update: the old log-probs of the pass (the same weights) or none (the
    trainer's forward, detached) give the same loss and gradient, to fp32 rounding."""
    config = make_config(kl_coef=0.0, entropy_coef=0.01, grad_clip=0.0)
    batch = dataclasses.replace(make_batch(1, off_policy=False), ref_logprobs=None)
    passed = dataclasses.replace(batch, old_logprobs=the_weights_logprobs(make_model(0), batch))
    m1, g1 = step_gradients(NativeTrainer(make_model(0), config), passed)
    m2, g2 = step_gradients(NativeTrainer(make_model(0), config), batch)
    for key in ("loss", "pg_loss", "entropy", "clip_frac", "grad_norm"):
        assert getattr(m1, key) == pytest.approx(getattr(m2, key), rel=1e-5, abs=1e-6), key
    assert m1.grad_norm > 0
    for name in g1:
        torch.testing.assert_close(g1[name], g2[name], rtol=1e-4, atol=1e-6)


def test_a_run_without_the_inference_pass_trains_the_same_samples_to_the_same_rewards(tmp_path):
    runs = {}
    for mode in ("auto", "always"):
        run_dir = str(tmp_path / mode)
        job = prepare(None, overrides("run.steps=3", f"inference.old_logprobs={mode}"), run_dir, None)
        assert job.run() == 0
        runs[mode] = run_dir
    ledgers = {m: read_entries(os.path.join(d, "ledger.jsonl")) for m, d in runs.items()}
    assert [e.sample_ids for e in ledgers["auto"]] == [e.sample_ids for e in ledgers["always"]]
    assert [e.digests for e in ledgers["auto"]] == [e.digests for e in ledgers["always"]]
    rows = {m: [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))] for m, d in runs.items()}
    # the same tokens, rewards and (to fp32 rounding) updates: step 0's ratio is 1 either way
    assert [r["reward_mean"] for r in rows["auto"]] == [r["reward_mean"] for r in rows["always"]]
    assert all(r["inference_s"] == 0.0 and "mismatch" not in r for r in rows["auto"])
    assert all(r["inference_s"] > 0 and r["mismatch"]["tokens"] > 0 for r in rows["always"])
    names = {m: {e["name"] for e in json.load(open(os.path.join(d, "trace.json")))["traceEvents"]}
             for m, d in runs.items()}
    assert "compute_logprobs step 0" in names["always"] and "train step 0" in names["auto"]
    assert not any(n.startswith("compute_logprobs") for n in names["auto"])
    nodes = {m: {n["name"] for n in json.load(open(os.path.join(d, "graph.json")))["nodes"]} for m, d in runs.items()}
    assert nodes["auto"] == {"rollout", "reward", "trainer"}  # no inference ranks spawned
    assert nodes["always"] == {"rollout", "reward", "inference", "trainer"}
