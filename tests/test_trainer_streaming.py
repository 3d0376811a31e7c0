NUM_GPUS = 0
"""Streaming gradient accumulation (trainer.streaming): parts of a step's batch
accumulated as they come, on any rank, then one collective step, equal the step on
the whole batch (the loss is the token-mean of the whole step either way)."""

import threading

import pytest
import torch

from dynarl.components.experience import group_advantages, stream_batch
from dynarl.components.trainer.base import TrainBatch
from dynarl.components.trainer.native.trainer import NativeTrainer
from dynarl.transport.process_group import join_group, leave_group
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
    for part in parts(batch, [[5, 0], [3], [11, 1, 2, 4], [6, 7, 8, 9, 10]]):  # samples in any order, groups split
        streamed.accumulate(part)
    got = streamed.apply()
    torch.testing.assert_close(flat_params(streamed), flat_params(whole), **TOL)
    for key in ("loss", "pg_loss", "kl", "entropy", "clip_frac", "grad_norm", "tokens"):
        assert getattr(got, key) == pytest.approx(getattr(expected, key), rel=1e-5, abs=1e-7), key
    assert streamed.global_step == whole.global_step == 1
    # the next step starts from nothing accumulated
    streamed.accumulate(batch)
    whole.train_step(batch)
    streamed.apply()
    torch.testing.assert_close(flat_params(streamed), flat_params(whole), **TOL)


def test_uneven_parts_on_two_ranks_equal_the_whole_batch_on_one():
    """Rank 0 takes three parts, rank 1 one, and a rank that took none still joins the step."""
    batch = with_advantages(make_batch(8, num_groups=4, group_size=2))
    whole = NativeTrainer(make_model(2), make_config(eps=1e-4))
    whole.train_step(batch)
    results, errors = {}, []

    def rank(r: int, my_parts: list[TrainBatch], store, model) -> None:
        try:
            member = join_group("stream", "dynarl/stream/0/", r, 2, "127.0.0.1", 0, "gloo", 30.0, store=store,
                                secret=b"k" * 32)
            trainer = NativeTrainer(model, make_config(eps=1e-4), member.group)
            for part in my_parts:
                trainer.accumulate(part)
            trainer.apply()
            results[r] = flat_params(trainer)
            leave_group(member)
        except Exception as exc:  # surfaced below
            errors.append(exc)

    split = [parts(batch, [[0, 1], [2], [7, 3]]), parts(batch, [[4, 5, 6]])]
    for assignment in (split, [split[0] + split[1], []]):
        results.clear()
        store = torch.distributed.HashStore()
        models = [make_model(2 + r) for r in range(2)]  # (torch's seed is global: not in the threads)
        threads = [threading.Thread(target=rank, args=(r, assignment[r], store, models[r])) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)  # replicas agree bitwise
        torch.testing.assert_close(results[0], flat_params(whole), **TOL)


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
