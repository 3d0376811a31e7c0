NUM_GPUS = 0
"""Streaming gradient accumulation (trainer.streaming): parts of a step's batch
accumulated as they come, on any rank, then one collective step, equal the step on
the whole batch (the loss is the token-mean of the whole step either way). Parts on
two ranks: test_trainer_dp.py."""

import pytest
import torch

from dynarl.components.experience import group_advantages, stream_batch
from dynarl.components.trainer.base import TrainBatch
from dynarl.components.trainer.native.trainer import NativeTrainer
from dynarl.components.experience import PromptGroup, Sample
from test_trainer import (  # noqa: F401  (one_torch_thread is an autouse fixture)
    flat_params, make_batch, make_config, make_model, one_torch_thread)

TOL = dict(rtol=1e-5, atol=1e-6)
"""AdamW eps 1e-4 (as test_trainer_dp): at eps 1e-8 the first update is lr * sign(g), so a
gradient within rounding of 0 can flip an element by 2 lr whatever the summation order."""


def with_advantages(batch: TrainBatch) -> TrainBatch:
    """The batch with each group's advantages precomputed, as the reward stage sets them."""
    by_group: dict[int, list[int]] = {}
    for i, g in enumerate(batch.group_ids):
        by_group.setdefault(g, []).append(i)
    advantages = [0.0] * len(batch)
    for rows in by_group.values():
        for i, a in zip(rows, group_advantages([batch.rewards[i] for i in rows], 1e-6)):
            advantages[i] = a
    picked = {f: getattr(batch, f) for f in ("input_ids", "prompt_lens", "response_mask", "old_logprobs",
                                               "ref_logprobs")}
    return TrainBatch(**picked, advantages=advantages)


def parts(batch: TrainBatch, cuts: list[list[int]]) -> list[TrainBatch]:
    return [batch.select(rows) for rows in cuts]


def test_parts_on_one_rank_equal_the_whole_batch():
    batch = with_advantages(make_batch(7, num_groups=4, group_size=3))
    whole = NativeTrainer(make_model(1), make_config(eps=1e-4))
    expected = whole.train_step(batch)
    streamed = NativeTrainer(make_model(1), make_config(eps=1e-4))
    streamed.begin_stream()
    for part in parts(batch, [[5, 0], [3], [11, 1, 2, 4], [6, 7, 8, 9, 10]]):  # samples in any order, groups split
        streamed.accumulate(part)
    got = streamed.apply()
    torch.testing.assert_close(flat_params(streamed), flat_params(whole), **TOL)
    for key in ("loss", "pg_loss", "kl", "entropy", "clip_frac", "grad_norm", "tokens"):
        assert getattr(got, key) == pytest.approx(getattr(expected, key), rel=1e-5, abs=1e-7), key
    assert streamed.global_step == whole.global_step == 1
    # the next step starts from nothing accumulated
    streamed.begin_stream()
    streamed.accumulate(batch)
    whole.train_step(batch)
    streamed.apply()
    torch.testing.assert_close(flat_params(streamed), flat_params(whole), **TOL)


def test_a_step_with_nothing_accumulated_is_refused():
    trainer = NativeTrainer(make_model(3), make_config(eps=1e-4))
    with pytest.raises(ValueError, match="no response tokens"):
        trainer.apply()


def test_stream_batch_carries_the_reward_stage_advantages_or_lengths_alone():
    groups = [PromptGroup(0, "p", "", [1, 2, 3], [
        Sample("a", 0, output_ids=[4, 5], advantage=0.5, old_logprobs=[-1.0, -2.0]),
        Sample("b", 1, output_ids=[6], advantage=-0.5, old_logprobs=[-3.0])])]
    full = stream_batch(groups, with_ref=False)
    assert full.input_ids == [[1, 2, 3, 4, 5], [1, 2, 3, 6]] and full.advantages == [0.5, -0.5]
    assert full.old_logprobs == [[-1.0, -2.0], [-3.0]]
    lengths = stream_batch(groups, with_ref=False, lengths_only=True)
    assert [len(x) for x in lengths.input_ids] == [5, 4] and lengths.num_loss_tokens() == 3
