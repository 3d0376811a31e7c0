"""Packed micro-batches (micro_batch.build_packed_micro_batch, Qwen2ForCausalLM's
cu_seqlens input) compute what padded ones do: the same logits at loss positions, the
same token-mean GRPO loss and the same gradients, with samples kept apart."""
from __future__ import annotations

import random

import pytest
import torch

from dynarl.components.model.config import TINY_CONFIGS
import torch.nn.functional as F

from dynarl.components.model.packed_attention import packed_attention, packed_positions, segment_ids, windows
from dynarl.components.trainer.native.packing import packing_budget
from dynarl.components.model.qwen2 import Qwen2ForCausalLM
from dynarl.components.trainer.base import TrainBatch, TrainerConfig
from dynarl.components.trainer.native.critic import value_head
from dynarl.components.trainer.native.losses import entropy_from_logprobs, micro_batch_loss, step_advantages
from dynarl.components.trainer.native.micro_batch import (MicroBatch, build_micro_batch, build_packed_micro_batch,
                                                          micro_batches)

CPU = torch.device("cpu")
LENGTHS = [5, 41, 9, 3, 64, 12, 7, 30, 18, 2]  # prompt + response, long-tailed


def make_model(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(TINY_CONFIGS["tiny-0.5m"])


def make_batch(seed: int = 0, lengths=LENGTHS) -> TrainBatch:
    rng = random.Random(seed)
    ids, plens, masks, old, ref = [], [], [], [], []
    for n in lengths:
        plen = rng.randint(1, max(1, n // 3))
        ids.append([rng.randrange(3, 128) for _ in range(n)])
        plens.append(plen)
        masks.append([int(rng.random() > 0.2) for _ in range(n - plen)])
        old.append([-rng.uniform(0.5, 6.0) for _ in range(n - plen)])
        ref.append([-rng.uniform(0.5, 6.0) for _ in range(n - plen)])
    return TrainBatch(input_ids=ids, prompt_lens=plens, response_mask=masks, old_logprobs=old,
                      ref_logprobs=ref, rewards=[float(rng.randint(0, 3)) for _ in lengths],
                      group_ids=[i // 2 for i in range(len(lengths))])


def per_sample(mb: MicroBatch, values: torch.Tensor, batch: TrainBatch) -> dict[int, torch.Tensor]:
    """Values in the loss's row-major order, split by sample."""
    out, cursor = {}, 0
    for i in mb.rows:
        n = sum(batch.response_mask[i])
        out[i] = values[cursor:cursor + n]
        cursor += n
    assert cursor == values.shape[0] == mb.num_tokens
    return out


def loss_logits(model, mbs: list[MicroBatch], batch: TrainBatch) -> dict[int, torch.Tensor]:
    found = {}
    for mb in mbs:
        found.update(per_sample(mb, mb.logits(model)[:, :-1][mb.loss_mask], batch))
    return found


def loss_and_grads(model, mbs: list[MicroBatch], config: TrainerConfig, num_tokens: int):
    """The token-mean GRPO loss accumulated over micro-batches, and the gradients."""
    model.zero_grad(set_to_none=True)
    total = torch.zeros((), dtype=torch.float64)
    for mb in mbs:
        if not mb.num_tokens:
            continue
        logp = torch.log_softmax(mb.logits(model)[:, :-1][mb.loss_mask].float(), dim=-1)
        logprobs = logp.gather(-1, mb.targets.unsqueeze(-1)).squeeze(-1)
        terms = micro_batch_loss(logprobs, entropy_from_logprobs(logp), mb, config, num_tokens)
        terms.loss.backward()
        total += terms.loss.detach().double()
    return total, {name: p.grad.clone() for name, p in model.named_parameters()}


CONFIG = TrainerConfig(micro_batch_size=4, kl_coef=0.1, entropy_coef=0.01, max_tokens_per_micro_batch=0)


@pytest.mark.parametrize("max_tokens", [1, 48, 70, 1000])
def test_packed_matches_padded_logits_loss_and_grads(max_tokens):
    model, batch = make_model(), make_batch()
    advantages = step_advantages(batch, CONFIG)
    padded = micro_batches(batch, advantages, CONFIG, CPU)
    packed_config = TrainerConfig(micro_batch_size=4, kl_coef=0.1, entropy_coef=0.01,
                                  max_tokens_per_micro_batch=max_tokens)
    packed = micro_batches(batch, advantages, packed_config, CPU)
    assert all(mb.cu_seqlens is None for mb in padded) and all(mb.input_ids.shape[0] == 1 for mb in packed)
    assert sorted(i for mb in packed for i in mb.rows) == list(range(len(batch)))
    for mb in packed:
        assert mb.input_ids.shape[1] <= max_tokens or len(mb.rows) == 1
    with torch.no_grad():
        want, got = loss_logits(model, padded, batch), loss_logits(model, packed, batch)
    for i in range(len(batch)):
        torch.testing.assert_close(got[i], want[i], atol=1e-5, rtol=1e-5)
    num_tokens = batch.num_loss_tokens()
    loss_padded, grads_padded = loss_and_grads(model, padded, CONFIG, num_tokens)
    loss_packed, grads_packed = loss_and_grads(model, packed, packed_config, num_tokens)
    assert loss_padded.abs() > 0
    torch.testing.assert_close(loss_packed, loss_padded, atol=1e-6, rtol=1e-5)
    for name, grad in grads_padded.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(grads_packed[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_per_token_fields_follow_their_samples():
    batch = make_batch(1)
    advantages = [[float(i * 100 + k) for k in range(len(ids) - p)]
                  for i, (ids, p) in enumerate(zip(batch.input_ids, batch.prompt_lens))]
    rows = [7, 0, 4]
    padded = build_micro_batch(batch, advantages, rows, CPU)
    packed = build_packed_micro_batch(batch, advantages, rows, CPU)
    for name in ("targets", "advantages", "old_logprobs", "ref_logprobs"):
        torch.testing.assert_close(getattr(packed, name), getattr(padded, name), atol=0, rtol=0, msg=name)
    assert packed.num_tokens == padded.num_tokens > 0
    # Each target is the next token of the row, and of the same sample.
    ids, mask = packed.input_ids[0], packed.loss_mask[0]
    assert torch.equal(ids[1:][mask], packed.targets)
    cu = packed.cu_seqlens.tolist()
    assert cu == [0, *torch.tensor([len(batch.input_ids[i]) for i in rows]).cumsum(0).tolist()]
    assert not mask[[end - 1 for end in cu[1:-1]]].any()  # a sample's last position scores nothing
    assert packed.position_ids[0].tolist() == [k for i in rows for k in range(len(batch.input_ids[i]))]


def test_padded_micro_batches_are_todays():
    """max_tokens_per_micro_batch = 0: micro_batch_size samples in batch order, padded."""
    batch = make_batch(2)
    advantages = step_advantages(batch, CONFIG)
    mbs = micro_batches(batch, advantages, CONFIG, CPU)
    assert [mb.rows for mb in mbs] == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9)]
    for mb in mbs:
        expected = build_micro_batch(batch, advantages, mb.rows, CPU)
        assert torch.equal(mb.input_ids, expected.input_ids) and torch.equal(mb.loss_mask, expected.loss_mask)
        assert mb.input_ids.shape == (len(mb.rows), max(LENGTHS[i] for i in mb.rows))


@pytest.mark.parametrize("changed, kept", [(0, 1), (1, 0), (1, 2)])
def test_block_diagonal_mask_keeps_samples_apart(changed, kept):
    """Changing one sample's tokens leaves every other sample's logits bitwise unchanged,
    and a packed sample's logits are those of the sample alone (positions restart)."""
    model = make_model()
    batch = make_batch(3, lengths=[11, 17, 6])
    other = [list(ids) for ids in batch.input_ids]
    other[changed] = [(t * 7 + 1) % 125 + 3 for t in other[changed]]
    bounds = [0, 11, 28, 34]
    with torch.no_grad():
        a = build_packed_micro_batch(batch, [0.0] * 3, [0, 1, 2], CPU).logits(model)[0]
        moved = TrainBatch(input_ids=other, prompt_lens=batch.prompt_lens, advantages=[0.0] * 3)
        b = build_packed_micro_batch(moved, [0.0] * 3, [0, 1, 2], CPU).logits(model)[0]
        alone = model(torch.tensor([batch.input_ids[kept]]))[0]
    span = slice(bounds[kept], bounds[kept + 1])
    assert torch.equal(a[span], b[span])
    assert not torch.equal(a[bounds[changed]:bounds[changed + 1]], b[bounds[changed]:bounds[changed + 1]])
    torch.testing.assert_close(a[span], alone, atol=1e-5, rtol=1e-5)


def block_causal_mask(cu_seqlens: torch.Tensor, length: int) -> torch.Tensor:
    """The reference: [T, T] bool, True where query i may attend key j (j <= i, same sample)."""
    seg = segment_ids(cu_seqlens, length)
    return torch.ones(length, length, dtype=torch.bool).tril() & (seg[:, None] == seg[None, :])


def test_mask_and_positions_of_cu_seqlens():
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    assert packed_positions(cu, 5).tolist() == [0, 1, 0, 1, 2]
    assert block_causal_mask(cu, 5).int().tolist() == [
        [1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]]


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2)])
def test_per_sample_attention_equals_one_call_with_the_block_diagonal_mask(heads, kv_heads):
    """The CPU path (windows of whole samples) against SDPA over the whole row with the
    T x T block-causal mask, values and gradients; an empty sample among them."""
    bounds = [0, 5, 5, 46, 55, 58]
    cu, length = torch.tensor(bounds), bounds[-1]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, length, h, 8, generator=g, requires_grad=True) for h in (heads, kv_heads, kv_heads))
    ours = packed_attention(q, k, v, cu, 41, windows(bounds, size=8))  # windows [0, 5), [5, 46), [46, 55), [55, 58)
    ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=block_causal_mask(cu, length),
                                         enable_gqa=heads != kv_heads).transpose(1, 2)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    grads = torch.autograd.grad(ours.square().sum(), (q, k, v))
    torch.testing.assert_close(grads, torch.autograd.grad(ref.square().sum(), (q, k, v)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ids_shape, cu", [((2, 5), [0, 2, 5]), ((1, 5), [0, 2, 4]), ((1, 5), [1, 5])])
def test_packed_forward_rejects_bad_layout(ids_shape, cu):
    with pytest.raises(ValueError, match="packed input"):
        make_model()(torch.full(ids_shape, 5), cu_seqlens=torch.tensor(cu))


def test_critic_values_packed_match_padded():
    model = value_head(make_model())
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 0.1)  # zero-initialised: make the values differ
    batch = make_batch(4)
    padded = build_micro_batch(batch, [0.0] * len(batch), range(len(batch)), CPU)
    packed = build_packed_micro_batch(batch, [0.0] * len(batch), range(len(batch)), CPU)
    with torch.no_grad():
        want = padded.logits(model)[:, :-1, 0][padded.loss_mask]
        got = packed.logits(model)[:, :-1, 0][packed.loss_mask]
    assert want.abs().max() > 0
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_bench_packing_only_reports_both_layouts():
    import contextlib
    import io
    import json
    from dynarl.launch.bench import trainer as bench
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = bench.main(["--json", "--packing-only", "--prompt-len", "4", "--pack-samples", "16",
                           "--pack-max-response", "40", "--pack-max-tokens", "64", "--pack-rounds", "1"])
    assert code == 0
    result = json.loads(out.getvalue())
    assert result["tokens_per_s_padded"] > 0 and result["tokens_per_s_packed"] > 0
    assert result["packed_speedup"] == pytest.approx(
        result["tokens_per_s_packed"] / result["tokens_per_s_padded"], rel=0.01)
    assert result["pack_seq_len_max"] <= 44 and 0 < result["pack_padded_fill"] < 1
    assert result["pack_micro_batches"]["padded"] == 2  # 16 samples, 8 a micro-batch


@pytest.mark.parametrize("bounds, size, spans", [
    ([0, 3, 8, 9, 40], 8, [(0, 8), (8, 9), (9, 40)]),  # 8 tokens close a window; 31 are a window alone
    ([0, 3, 3, 4], 8, [(0, 4)]),                        # an empty sample; the last window closes at the end
    ([0, 600], 512, [(0, 600)]),                        # a sample longer than a window: its own
    ([0, 100, 700, 750], 512, [(0, 100), (100, 700), (700, 750)]),
    ([0, 100, 300, 500, 600], 512, [(0, 500), (500, 600)]),
])
def test_windows_hold_whole_samples(bounds, size, spans):
    assert [(w.start, w.end) for w in windows(bounds, size=size)] == spans


@pytest.mark.parametrize("lengths, size, max_tokens, budget", [
    ([40, 41, 39, 40], 2, None, 0),              # auto, even lengths: padding ~1.0x, padded
    ([10, 100, 10, 10], 2, None, 200),            # padded 2x100 + 2x10 = 220 > 1.5 x 130: packed, 2 x 100 tokens
    ([10, 100, 10, 10], 4, None, 400),            # one padded micro-batch of 4 x 100
    ([10, 14, 10, 10], 2, None, 0),               # 1.2x: padded
    ([10, 100, 10, 10], 2, 64, 64),               # the user's budget packs whatever the lengths
    ([10, 100, 10, 10], 2, 0, 0),                 # 0: padded whatever the lengths
    ([7], 8, None, 0),
])
def test_packing_budget(lengths, size, max_tokens, budget):
    assert packing_budget(lengths, size, max_tokens) == budget
