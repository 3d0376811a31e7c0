NUM_GPUS = 0
"""Embodied RL (workflow embodied, components/workflows/embodied.py): env workers
stepping gymnasium envs beside a small policy and its PPO learner. Pure parts by
table (GAE over env steps, what the policy can take, the placement); `dynarl train`
on CartPole-based fault-injecting envs (dynarl/Flaky-v0: every 37th step of an env
crashes; dynarl/Hang-v0: an env hangs) survives both, counts them, and resumes."""

import json
import os

import pytest
import torch

pytest.importorskip("gymnasium")
from gymnasium import spaces  # noqa: E402

from dynarl import ConfigError  # noqa: E402
from dynarl.components.embodied.learn import gae  # noqa: E402
from dynarl.components.embodied.spaces import EnvError, describe, spec_of  # noqa: E402
from dynarl.components.workflows.config import load_config  # noqa: E402
from dynarl.components.placement.embodied import place  # noqa: E402
from dynarl.launch.train import prepare  # noqa: E402
from conftest import assert_reaped  # noqa: E402


# --- GAE over env steps (pure) ----------------------------------------------------------------
def one_env(x):
    return torch.tensor(x, dtype=torch.float32)[:, None]


@pytest.mark.parametrize("rewards, values, next_values, term, trunc, gamma, lam, advantages", [
    # the horizon ends mid-episode: bootstrapped from the value after it
    ([1, 1], [0, 0], [0, 5], [0, 0], [0, 0], 1.0, 1.0, [7, 6]),
    # a terminated episode has no future: the next value is ignored, the advantage stops there
    ([1, 1], [0, 0], [9, 9], [1, 0], [0, 0], 1.0, 1.0, [1, 10]),
    # a truncated one continues from its final observation's value, and also stops there
    ([1, 1], [0, 0], [3, 5], [0, 0], [1, 0], 1.0, 1.0, [4, 6]),
    # one-step TD (lam 0) with a discount
    ([1, 0], [0.5, 0.5], [0.5, 1.0], [0, 0], [0, 0], 0.5, 0.0, [0.75, 0.0]),
])
def test_gae_over_env_steps(rewards, values, next_values, term, trunc, gamma, lam, advantages):
    adv, ret = gae(one_env(rewards), one_env(values), one_env(next_values), one_env(term).bool(),
                   one_env(trunc).bool(), gamma, lam)
    assert adv[:, 0].tolist() == pytest.approx(advantages)
    assert ret[:, 0].tolist() == pytest.approx([a + v for a, v in zip(advantages, values)])


# --- what the policy can take ---------------------------------------------------------------
def test_spaces_the_policy_takes_and_those_it_refuses():
    box = spaces.Box(-1, 1, (10,))
    assert spec_of(box, spaces.Box(-2, 2, (3,))).action_dim == 3
    assert spec_of(box, spaces.Discrete(4)).discrete
    with pytest.raises(EnvError, match="not a flat Box"):
        spec_of(spaces.Box(0, 255, (64, 64, 3)), spaces.Discrete(2))  # an image
    with pytest.raises(EnvError, match="not a flat Box"):
        spec_of(spaces.Dict({"x": box}), spaces.Discrete(2))
    with pytest.raises(EnvError, match="neither a Discrete nor a flat Box"):
        spec_of(box, spaces.MultiDiscrete([2, 3]))


def test_checkpoints_resume_only_the_workflow_that_wrote_them(tmp_path):
    from dynarl.components.workflows.checkpoints import workflow_refused
    llm, emb = tmp_path / "llm", tmp_path / "emb"
    (llm / "critic").mkdir(parents=True)
    emb.mkdir()
    (emb / "learner.safetensors").write_bytes(b"")
    assert workflow_refused(str(llm), "ppo") is None and workflow_refused(str(emb), "embodied") is None
    assert "embodied workflow" in workflow_refused(str(emb), "grpo")
    assert "LLM workflow" in workflow_refused(str(llm), "embodied")
    (llm / "critic").rmdir()
    assert "no critic state" in workflow_refused(str(llm), "ppo")


def test_an_env_that_does_not_exist_is_refused_at_load_naming_the_field(tmp_path):
    with pytest.raises(EnvError, match="no environment 'Nope-v0'"):
        describe("Nope-v0")
    with pytest.raises(ConfigError) as info:
        prepare(None, [("workflow", "embodied"), ("embodied.env_id", "Nope-v0")], str(tmp_path / "r"), None)
    assert info.value.path == "embodied.env_id"
    with pytest.raises(ConfigError) as info:
        prepare(None, [("workflow", "embodied"), ("embodied.env_id", "no_such_module:X-v0")], str(tmp_path / "r"),
                None)
    assert info.value.path == "embodied.env_id" and "cannot import" in str(info.value)


@pytest.mark.parametrize("mode, workers, devices, learners, env, rollout, trainer", [
    ("hybrid", 2, 3, 1, (0, 1), (2,), (2,)),    # envs apart, rollout and trainer time-share the last device
    ("spatial", 2, 4, 1, (0, 1), (2,), (3,)),
    ("colocated", 3, 2, 1, (0, 1, 0), (0,), (0,)),
    # a data-parallel learner: one rank per device (NCCL), wrapping onto the env workers' devices
    ("hybrid", 2, 3, 2, (0, 1), (2,), (2, 0)),
    ("spatial", 2, 4, 3, (0, 1), (2,), (3, 0, 1)),
    ("colocated", 3, 2, 2, (0, 1, 0), (0,), (0, 1)),
])
def test_place(mode, workers, devices, learners, env, rollout, trainer):
    p = place(mode, workers, devices, learner_ranks=learners)
    assert (p.env, p.rollout, p.trainer) == (env, rollout, trainer)


def test_more_learner_ranks_than_devices_is_refused():
    with pytest.raises(ValueError, match="one rank per device"):
        place("hybrid", 2, 3, learner_ranks=4)


@pytest.mark.parametrize("extra, field, fragment", [
    ((("placement.mode", "hybrid"), ("runtime.cluster.devices_per_node", 2)), "placement.mode", "needs 3 devices"),
    ((("placement.mode", "auto"),), "placement.mode", "colocated, hybrid or spatial"),
    ((("scheduler.policy", "dynarl"),), "scheduler.policy", "emulated workers only"),
    ((("embodied.horizon", 0),), "embodied.horizon", ">= 1"),
    ((("embodied.gamma", 1.5),), "embodied.gamma", "[0, 1]"),
    ((("embodied.pipeline_stages", 9),), "embodied.pipeline_stages", "at most envs_per_worker"),
    ((("embodied.backend", "emulated"),), "embodied.backend", "emulated devices"),
])
def test_bad_embodied_settings_name_the_field(extra, field, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(None, [("workflow", "embodied"), ("runtime.cluster.devices_per_node", 4), *extra])
    assert info.value.path == field and fragment in str(info.value)


# --- dynarl train -------------------------------------------------------------------------------
SMALL = [("workflow", "embodied"), ("placement.mode", "hybrid"), ("runtime.cluster.devices_per_node", 3),
         ("embodied.envs_per_worker", 4), ("embodied.horizon", 40), ("embodied.epochs", 2)]


def rows(run):
    return [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]


def reaped(job):
    w = job.workflow  # a restarted env worker's first process too
    assert_reaped([p for g in (*w.envs, *w.retired, w.policy, w.learner) for p in g.pids])


def test_crashing_envs_are_reset_and_counted_and_the_run_resumes(tmp_path):
    run = str(tmp_path / "run")
    job = prepare(None, SMALL + [("embodied.env_id", "dynarl/Flaky-v0"), ("run.steps", 2),
                                 ("run.checkpoint_every", 1)], run, None)
    assert job.run() == 0
    reaped(job)
    first = rows(run)
    # 2 workers x 4 envs x 40 steps: every env crashes at its 37th step
    assert [r["env_errors"] for r in first] == [8, 8]
    assert all(r["env_steps"] == 320 and r["episodes"] >= 8 and 0 <= r["env_idle_frac"] < 1 for r in first)
    assert all(r["updates"] > 0 and r["value_loss"] >= 0 for r in first)

    job = prepare(None, [("run.steps", 3)], None, run)  # the learner's state comes back
    assert job.run() == 0
    reaped(job)
    assert [r["step"] for r in rows(run)] == [0, 1, 2]
    from safetensors import safe_open
    with safe_open(os.path.join(run, "checkpoints", "step_000003", "learner.safetensors"), framework="pt") as f:
        assert f.metadata()["step"] == "3"  # 2 steps before the resume, one after


@pytest.mark.parametrize("stages", [1, 2])
def test_a_hung_env_worker_is_restarted_and_the_run_goes_on(tmp_path, stages):
    """With 2 pipeline stages the worker's other chunk ends its episodes too (its envs were reset)."""
    run = str(tmp_path / "run")
    job = prepare(None, SMALL + [("embodied.env_id", "dynarl/Hang-v0"), ("embodied.env_workers", 1),
                                 ("embodied.horizon", 64), ("embodied.step_timeout_s", 1.0), ("run.steps", 1),
                                 ("embodied.pipeline_stages", stages)], run, None)
    assert job.run() == 0
    reaped(job)
    (row,) = rows(run)
    assert row["env_restarts"] == 1 and row["env_steps"] == 4 * 64  # the hung step ended its episodes
    assert len(job.workflow.retired) == 1 and job.workflow.retired[0].pids


def test_a_learner_of_two_ranks_trains_replicas_that_stay_equal(tmp_path):
    """embodied.learner_ranks 2: each rank trains on its half of the envs, gradients
    averaged at every update; the replicas hold the same weights after every step (the
    workflow compares their digests each step and fails a step where they differ)."""
    run = str(tmp_path / "run")
    job = prepare(None, SMALL + [("embodied.learner_ranks", 2), ("run.steps", 2), ("run.checkpoint_every", 1)],
                  run, None)
    assert job.run() == 0
    reaped(job)
    assert [r["step"] for r in rows(run)] == [0, 1]
    assert all(r["updates"] > 0 for r in rows(run))
    assert job.workflow.learner.world_size == 2

    job = prepare(None, [("run.steps", 3)], None, run)  # both ranks load rank 0's checkpoint
    assert job.run() == 0
    reaped(job)
    assert [r["step"] for r in rows(run)] == [0, 1, 2]
