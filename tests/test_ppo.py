NUM_GPUS = 0
"""PPO with a critic (workflow ppo, components/workflows/ppo.py): GAE targets as a
pure function, the native critic (a value head on the decoder, trainer/native/critic.py),
and `dynarl train workflow=ppo`: the critic trains beside the policy, its state is
checkpointed, and the dynarl scheduler trains the same samples per step as static."""

import json
import math
import os

import pytest
import torch

from dynarl import ConfigError
from dynarl.components.model.io import save_pretrained
from dynarl.components.model.spec import ModelSpec, build_model
from dynarl.components.trainer.base import TrainBatch, TrainerConfig
from dynarl.components.trainer.native.critic import NativeCritic, value_head
from dynarl.components.trainer.native.trainer import NativeTrainer
from dynarl.components.workflows.config import load_config
from dynarl.components.workflows.ledger import read_entries
from dynarl.components.workflows.ppo import CRITIC_DIR, gae_targets
from dynarl.launch.train import prepare
from conftest import assert_reaped
from grpo_tiny import overrides

PPO = ("workflow=ppo",)


# --- GAE targets (a pure function) --------------------------------------------------------
@pytest.mark.parametrize("reward, values, mask, gamma, lam, advantages, returns", [
    # values 0, gamma = lam = 1: every token's advantage and return is the outcome reward
    (1.0, [0, 0, 0], None, 1.0, 1.0, [1, 1, 1], [1, 1, 1]),
    # a perfect critic (V = reward everywhere): nothing to learn, advantage 0, returns = V
    (1.0, [1, 1, 1], None, 1.0, 0.95, [0, 0, 0], [1, 1, 1]),
    # lam = 0: one-step TD, A_t = V_{t+1} - V_t inside, r - V_T at the end
    (1.0, [0.2, 0.5, 0.7], None, 1.0, 0.0, [0.3, 0.2, 0.3], [0.5, 0.7, 1.0]),
    # gamma < 1 discounts the reward back from the last token
    (1.0, [0, 0, 0], None, 0.5, 1.0, [0.25, 0.5, 1.0], [0.25, 0.5, 1.0]),
    # a masked token (a tool observation) is skipped: the reward is paid on the last kept token
    (1.0, [0, 9, 0], [1, 0, 1], 1.0, 1.0, [1, 0, 1], [1, 0, 1]),
    (2.0, [0, 0, 9], [1, 1, 0], 1.0, 1.0, [2, 2, 0], [2, 2, 0]),
])
def test_gae_targets(reward, values, mask, gamma, lam, advantages, returns):
    t = gae_targets([reward], [values], None if mask is None else [mask], gamma=gamma, lam=lam, whiten=False)
    assert t.advantages[0] == pytest.approx(advantages)
    assert t.returns[0] == pytest.approx(returns)


def test_whitened_advantages_have_mean_0_and_std_1_over_the_loss_tokens_and_masked_ones_stay_0():
    t = gae_targets([1.0, 0.0, 0.5], [[0.1, 0.2], [0.3, 0.0, 0.4], [0.0]], [[1, 1], [1, 0, 1], [1]],
                    gamma=1.0, lam=0.9, whiten=True)
    kept = [a for row, m in zip(t.advantages, [[1, 1], [1, 0, 1], [1]]) for a, k in zip(row, m) if k]
    mean = sum(kept) / len(kept)
    std = math.sqrt(sum((a - mean) ** 2 for a in kept) / (len(kept) - 1))
    assert mean == pytest.approx(0, abs=1e-6) and std == pytest.approx(1, abs=1e-4)
    assert t.advantages[1][1] == 0.0


@pytest.mark.parametrize("rewards, values, explained", [
    ([1.0, 0.0], [[1, 1], [0, 0]], 1.0),          # the values are the returns
    ([1.0, 0.0], [[0.5, 0.5], [0.5, 0.5]], 0.0),  # the returns' mean: explains nothing
    ([1.0, 0.0], [[0, 0], [1, 1]], -3.0),         # backwards: worse than the mean
    ([1.0, 1.0], [[0, 0], [0, 0]], None),         # the returns do not vary: nothing to explain
])
def test_explained_variance(rewards, values, explained):
    t = gae_targets(rewards, values, None, gamma=1.0, lam=1.0, whiten=False)
    assert t.explained_variance == (None if explained is None else pytest.approx(explained))


def test_gae_targets_refuse_misshapen_input():
    with pytest.raises(ValueError, match="2 rewards for 1 samples"):
        gae_targets([1.0, 0.0], [[0.0]], None, gamma=1.0, lam=1.0, whiten=False)
    with pytest.raises(ValueError, match="sample 0: 2 values for 3 response tokens"):
        gae_targets([1.0], [[0.0, 0.0]], [[1, 1, 1]], gamma=1.0, lam=1.0, whiten=False)


# --- the critic ---------------------------------------------------------------------------
def critic_batch(returns: float) -> TrainBatch:
    ids = [[1, 5, 6, 7, 8], [2, 9, 10, 11]]
    plens = [2, 1]
    rets = [[returns] * (len(i) - p) for i, p in zip(ids, plens)]
    return TrainBatch(input_ids=ids, prompt_lens=plens, returns=rets, old_values=[[0.0] * len(r) for r in rets])


def test_a_critic_starts_at_0_and_its_steps_move_the_values_towards_the_returns():
    critic = NativeCritic(value_head(build_model(ModelSpec())), TrainerConfig(lr=3e-3, value_clip=10.0))
    batch = critic_batch(1.0)
    assert critic.values(batch) == [[0.0] * 3, [0.0] * 3]  # a zero head
    losses = [critic.train_step(batch).loss for _ in range(30)]
    assert losses[-1] < 0.1 * losses[0]
    v = critic.values(batch)
    assert all(abs(x - 1.0) < 0.3 for row in v for x in row)
    metrics = critic.train_step(batch)
    assert metrics.loss > 0 and metrics.grad_norm > 0 and metrics.pg_loss == 0.0  # a value loss, no policy terms


def test_the_value_clip_takes_the_gradient_from_values_past_it():
    """PPO's value clip: a value that moved past old_value + clip towards its return
    gets its loss from the clipped value, which does not depend on it. A critic whose
    values all lie in (0.05, 9.95), with old values 0 and returns 5, has no gradient
    at a clip of 0.05, and the full one without a clip to speak of."""
    import dataclasses
    critic = NativeCritic(value_head(build_model(ModelSpec())), TrainerConfig(lr=3e-3, value_clip=10.0))
    for _ in range(10):
        critic.train_step(critic_batch(2.0))  # values away from 0, towards 2
    far = critic_batch(5.0)  # old values 0
    assert all(0.05 < v < 9.95 for row in critic.values(far) for v in row)
    grad_norm = {}
    for clip in (0.05, 10.0):
        critic.config = dataclasses.replace(critic.config, value_clip=clip, lr=0.0)  # lr 0: the values stay
        metrics = critic.train_step(far)
        grad_norm[clip] = metrics.grad_norm
        assert metrics.value_clip_frac == (1.0 if clip == 0.05 else 0.0)
    assert grad_norm[0.05] == 0.0 < grad_norm[10.0]


def test_a_critic_needs_a_scalar_head_and_a_batch_with_returns():
    with pytest.raises(ValueError, match="scalar head"):
        NativeCritic(build_model(ModelSpec()), TrainerConfig())
    critic = NativeCritic(value_head(build_model(ModelSpec())), TrainerConfig())
    with pytest.raises(ValueError, match="needs returns"):
        critic.train_step(TrainBatch(input_ids=[[1, 2, 3]], prompt_lens=[1], advantages=[1.0]))
    with pytest.raises(ValueError, match="go together"):
        TrainBatch(input_ids=[[1, 2, 3]], prompt_lens=[1], returns=[[1.0, 1.0]])


def test_the_policy_trainer_reports_the_same_terms_as_before():
    trainer = NativeTrainer(build_model(ModelSpec()), TrainerConfig())
    m = trainer.train_step(TrainBatch(input_ids=[[1, 2, 3], [1, 2, 4]], prompt_lens=[1, 1], rewards=[1.0, 0.0],
                                      group_ids=[0, 0]))
    assert m.entropy > 0 and m.pg_loss == m.loss and m.value_clip_frac == 0.0 and (m.tokens, m.step) == (4, 1)


# --- config ---------------------------------------------------------------------------------
@pytest.mark.parametrize("extra, field, fragment", [
    (("trainer.streaming=true",), "trainer.streaming", "whole samples"),
    (("algorithm.max_staleness=1", "placement.mode=spatial", "runtime.cluster.devices_per_node=3"),
     "algorithm.max_staleness", "on-policy"),
    (("rollout.oversample=1.5", "algorithm.max_staleness=1"), "algorithm.max_staleness", "on-policy"),
    (("placement.mode=auto",), "placement.mode", "not the ppo workflow's"),
    (("critic.gamma=0",), "critic.gamma", "(0, 1]"),
    (("critic.lam=1.5",), "critic.lam", "[0, 1]"),
    (("critic.engine.value_clip=0",), "critic.engine.value_clip", "> 0"),
])
def test_bad_ppo_settings_name_the_field(extra, field, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides(*PPO, *extra))
    assert info.value.path == field
    assert fragment in str(info.value)


def test_a_critic_with_another_tokenizer_is_refused_at_load(tmp_path):
    folder = str(tmp_path / "hf")
    save_pretrained(build_model(ModelSpec()), folder)  # an HF folder: not the built-in character tokenizer
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides(*PPO) + [("critic.model.path", folder)])
    assert info.value.path == "critic.model" and "tokenizer" in str(info.value)
    same = load_config(None, overrides(*PPO, "critic.model.name=tiny-1m"))  # another size, the same tokenizer
    assert same.critic.model.name == "tiny-1m"


# --- dynarl train ---------------------------------------------------------------------------
def rows(run_dir: str) -> list[dict]:
    return [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]


def test_a_ppo_run_trains_its_critic_and_resumes_it(tmp_path):
    run = str(tmp_path / "run")
    job = prepare(None, overrides(*PPO, "run.steps=4", "run.checkpoint_every=2"), run, None)
    assert job.run() == 0
    w = job.workflow
    assert_reaped([p for group in w.worker_groups() for p in group.pids])  # the critic's too
    first = rows(run)
    assert all(r["value_loss"] > 0 and "explained_var" in r for r in first)
    assert first[0]["value_mean"] == 0.0 and first[-1]["value_mean"] != 0.0  # a zero head, then trained
    checkpoint = os.path.join(run, "checkpoints", "step_000002")
    assert os.path.isfile(os.path.join(checkpoint, CRITIC_DIR, "meta.json"))

    job = prepare(None, [("run.steps", 6)], None, run)  # resume: the critic's state comes back
    assert job.run() == 0
    assert_reaped(job.workflow.critic.pids)
    after = rows(run)
    assert [r["step"] for r in after] == list(range(6))
    assert after[4]["value_mean"] != 0.0  # not a fresh zero head
    ids = [i for e in read_entries(os.path.join(run, "ledger.jsonl")) for i in e.sample_ids]
    assert len(ids) == len(set(ids)) == 6 * 8 * 4


def test_a_grpo_checkpoint_is_not_resumed_as_ppo(tmp_path):
    run = str(tmp_path / "run")
    assert prepare(None, overrides("run.steps=1"), run, None).run() == 0
    from dynarl.launch.train import UsageError
    with pytest.raises(UsageError, match="no critic state"):  # before any worker starts
        prepare(None, [("workflow", "ppo"), ("run.steps", 2)], None, run)


JOB = ("runtime.cluster.devices_per_node=4", "placement.mode=hybrid", "rollout.num_ranks=3",
       "trainer.num_ranks=1", "rollout.max_new_tokens=48", "rollout.samples_per_prompt=8",
       "scheduler.dynarl.interval_s=0.02", "scheduler.dynarl.charge_move_cost=false",
       "scheduler.dynarl.trainer_profile=home", "scheduler.dynarl.pack=8", "scheduler.dynarl.theta=0.6")


def test_ppo_under_the_dynarl_scheduler_moves_the_trainer_and_its_critic_and_trains_the_samples_static_trains(
        tmp_path):
    ledgers = {}
    for policy in ("static", "dynarl"):
        run = str(tmp_path / policy)
        job = prepare(None, overrides(*PPO, *JOB, f"scheduler.policy={policy}", "run.steps=2"), run, None)
        assert job.run() == 0
        w = job.workflow
        assert_reaped([p for group in w.worker_groups() for p in group.pids])  # the critic's too
        if policy == "dynarl":  # devices moved in every step, and the critic followed the trainer
            assert all(r["migrations"].get("p2p:trainer") and r["migrations"].get("p2p:critic") for r in rows(run))
            assert_reaped(w.critic_pool.group.pids)
        ledgers[policy] = [(e.step, e.sample_ids) for e in read_entries(os.path.join(run, "ledger.jsonl"))]
    assert ledgers["static"] == ledgers["dynarl"]


def test_ppo_in_spatial_placement_keeps_its_critic_on_the_trainers_device(tmp_path):
    run = str(tmp_path / "run")
    job = prepare(None, overrides(*PPO, "placement.mode=spatial", "run.steps=2"), run, None)
    assert job.run() == 0
    w = job.workflow
    assert_reaped([p for group in w.worker_groups() for p in group.pids])  # the critic's too
    assert w.critic.devices == w.g.trainer.devices == [2]  # rollout 0, inference 1, trainer and critic 2
    assert all(r["critic_s"] > 0 for r in rows(run))


def test_a_critic_that_cannot_follow_stays_where_it_is_and_the_samples_are_the_same(tmp_path, monkeypatch):
    """The critic's P2P move fails (rolled back): the step trains it where it is, the run
    notes it, and the samples are the static run's."""
    from dynarl.components.workflows import ppo
    from dynarl.core.migration.p2p import MigrationFailed

    async def refuse(*args, **kwargs):
        raise MigrationFailed("injected")
    monkeypatch.setattr(ppo, "p2p_migrate", refuse)
    run = str(tmp_path / "run")
    job = prepare(None, overrides(*PPO, *JOB, "scheduler.policy=dynarl", "run.steps=1"), run, None)
    assert job.run() == 0
    w = job.workflow
    assert_reaped([p for group in w.worker_groups() for p in group.pids])
    (row,) = rows(run)
    assert row["migrations"].get("p2p:trainer") and not row["migrations"].get("p2p:critic")
    assert w.critic.devices == [3] and row["critic_s"] > 0  # home, the trainer's home device


def test_the_scheduler_prices_the_trainers_devices_with_the_critics_work():
    """With a critic on the trainer's devices (ppo), each trained token costs its forward
    pass and its step too: the trainer's predicted rate is 1 / (1 + 1/3 + 1) of GRPO's,
    from the cost model and from a measured profile alike."""
    from dynarl.components.workflows.rates import CostModelRates, MeasuredRates, trainer_passes
    from dynarl.core.scheduler.view import RolloutProgress, StepWork
    assert trainer_passes(False) == 1.0 and trainer_passes(True) == pytest.approx(7 / 3)
    work, progress = StepWork(samples=64, prompt_mean=100.0, cap=1000), RolloutProgress(active=8, generated=800)
    rates = {}
    for passes in (1.0, 7 / 3):
        model = CostModelRates(model="qwen2.5-7b", device="h100-80gb", tp=2, devices=16, max_seqs=256,
                               trainer_passes=passes)
        measured = MeasuredRates(tp=1, devices=4, max_seqs=64, trainer_passes=passes)
        measured.profile_trainer([(1, 1000.0), (2, 1800.0)])
        rates[passes] = (model.predictor(work, progress).rate("trainer", 4),
                         measured.predictor(work, progress).rate("trainer", 2))
    assert rates[7 / 3][0] == pytest.approx(rates[1.0][0] * 3 / 7)
    assert rates[7 / 3][1] == pytest.approx(1800.0 * 3 / 7)
