NUM_GPUS = 0
"""The RL objectives (algorithm.name): each one's advantages and loss against a reference
written here from its paper's formula in plain Python, their edge cases, the gradients
where the objective is about them, and how the config and the trainer take them."""

import math
import random
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dynarl import ConfigError
from dynarl.components.experience import group_advantages
from dynarl.components.trainer import advantages as adv
from dynarl.components.trainer.base import OBJECTIVES, TrainBatch, TrainerConfig
from dynarl.components.trainer.native import losses, objectives
from dynarl.components.trainer.native.micro_batch import build_micro_batch
from dynarl.components.workflows.config import load_config


def close(a, b, tol=1e-6):
    return len(a) == len(b) and all(abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b))


# ---- advantages --------------------------------------------------------------------

def ref_rloo(r):
    k = len(r)
    if k < 2 or len(set(r)) == 1:
        return [0.0] * k
    return [r[i] - sum(r[j] for j in range(k) if j != i) / (k - 1) for i in range(k)]


def ref_dr_grpo(r):
    if len(set(r)) == 1:
        return [0.0] * len(r)
    mean = sum(r) / len(r)
    return [x - mean for x in r]


def ref_grpo(r, eps):
    k = len(r)
    if k < 2 or len(set(r)) == 1:
        return [0.0] * k
    mean = sum(r) / k
    std = math.sqrt(sum((x - mean) ** 2 for x in r) / (k - 1))
    return [(x - mean) / (std + eps) for x in r]


GROUPS = [
    pytest.param([1.0, 0.0, 0.0, 1.0], id="binary"),
    pytest.param([0.5, 1.5, 3.0], id="three"),
    pytest.param([2.0], id="group-of-one"),
    pytest.param([0.1, 0.1, 0.1], id="equal"),
    pytest.param([1.0, 0.0], id="pair"),
]


@pytest.mark.parametrize("rewards", GROUPS)
def test_rloo_is_reward_minus_the_others_mean(rewards):
    assert close(adv.rloo_advantages(rewards), ref_rloo(rewards))
    if len(set(rewards)) == 1:
        assert adv.rloo_advantages(rewards) == [0.0] * len(rewards)  # exactly, not an ulp off


@pytest.mark.parametrize("rewards", GROUPS)
def test_dr_grpo_is_reward_minus_mean_without_std(rewards):
    assert close(adv.dr_grpo_advantages(rewards), ref_dr_grpo(rewards))
    if len(set(rewards)) == 1:
        assert adv.dr_grpo_advantages(rewards) == [0.0] * len(rewards)


@pytest.mark.parametrize("name", ["grpo", "gspo", "cispo"])
@pytest.mark.parametrize("rewards", GROUPS)
def test_grpo_gspo_cispo_take_grpo_advantages_bit_for_bit(name, rewards):
    config = TrainerConfig(objective=name, adv_eps=1e-6)
    got = adv.group_advantages_for(config, rewards, [3] * len(rewards))
    assert got == group_advantages(rewards, 1e-6)
    assert close(got, ref_grpo(rewards, 1e-6), tol=1e-5)


def ref_overlong(length, max_len, buffer, factor):
    if buffer == 0 or length <= max_len - buffer:
        return 0.0
    if length <= max_len:
        return factor * ((max_len - buffer) - length) / buffer
    return -factor


@pytest.mark.parametrize("length, max_len, buffer, factor, expected", [
    (10, 20, 4, 1.0, 0.0),      # well inside
    (16, 20, 4, 1.0, 0.0),      # at L_max - L_cache: no penalty yet
    (17, 20, 4, 1.0, -0.25),    # one token into the buffer
    (19, 20, 4, 1.0, -0.75),
    (20, 20, 4, 1.0, -1.0),     # at L_max
    (25, 20, 4, 1.0, -1.0),     # beyond: -1
    (18, 20, 4, 0.5, -0.25),    # scaled
    (20, 20, 0, 1.0, 0.0),      # buffer 0: off
])
def test_dapo_overlong_penalty(length, max_len, buffer, factor, expected):
    assert adv.overlong_penalty(length, max_len, buffer, factor) == pytest.approx(expected)
    assert ref_overlong(length, max_len, buffer, factor) == pytest.approx(expected)


def test_dapo_advantages_are_grpo_of_the_shaped_rewards():
    config = TrainerConfig(objective="dapo", max_response_len=20, overlong_buffer=4, adv_eps=1e-6)
    rewards, lengths = [1.0, 1.0, 0.0, 1.0], [10, 18, 12, 20]
    shaped = [r + ref_overlong(n, 20, 4, 1.0) for r, n in zip(rewards, lengths)]
    assert close(adv.group_advantages_for(config, rewards, lengths), ref_grpo(shaped, 1e-6), tol=1e-5)
    # the penalty makes a group of equal rewards informative
    assert adv.group_advantages_for(config, [1.0, 1.0], [10, 20])[0] > 0


def ref_reinforce_pp(rewards, old, ref, masks, beta, eps):
    """REINFORCE++: A_t = r - beta * sum_{s >= t} (old_s - ref_s) over loss tokens, then
    (A - mean) / (std + eps) over all loss tokens of the batch (population std)."""
    raw = []
    for r, o, f, m in zip(rewards, old, ref, masks):
        row = []
        for t in range(len(m)):
            kl_tail = sum(o[s] - f[s] for s in range(t, len(m)) if m[s])
            row.append(r - beta * kl_tail)
        raw.append(row)
    flat = [a for row, m in zip(raw, masks) for a, mm in zip(row, m) if mm]
    mean = sum(flat) / len(flat)
    std = math.sqrt(sum((a - mean) ** 2 for a in flat) / len(flat))
    return [[(a - mean) / (std + eps) if mm else 0.0 for a, mm in zip(row, m)] for row, m in zip(raw, masks)]


def reinforce_batch(seed=0, n=5, masked=True):
    rng = random.Random(seed)
    ids, plens, old, ref, masks, rewards = [], [], [], [], [], []
    for _ in range(n):
        k = rng.randint(1, 6)
        ids.append([5, 6] + [rng.randrange(3, 50) for _ in range(k)])
        plens.append(2)
        old.append([rng.uniform(-3, -0.1) for _ in range(k)])
        ref.append([rng.uniform(-3, -0.1) for _ in range(k)])
        masks.append([0 if masked and rng.random() < 0.3 else 1 for _ in range(k)])
        rewards.append(float(rng.randint(0, 1)))
    masks[0][0] = 1
    return TrainBatch(input_ids=ids, prompt_lens=plens, response_mask=masks, old_logprobs=old, ref_logprobs=ref,
                      rewards=rewards, group_ids=list(range(n)))


@pytest.mark.parametrize("beta", [0.0, 0.3])
def test_reinforce_pp_advantages_are_kl_shaped_returns_whitened_over_the_batch(beta):
    batch = reinforce_batch()
    config = TrainerConfig(objective="reinforce_pp", kl_coef=beta, adv_eps=1e-6)
    got = adv.batch_advantages(config, batch)
    want = ref_reinforce_pp(batch.rewards, batch.old_logprobs, batch.ref_logprobs, batch.response_mask, beta, 1e-6)
    for g, w, m in zip(got, want, batch.response_mask):
        assert close(g, w, tol=1e-5)
        assert all(x == 0.0 for x, mm in zip(g, m) if not mm)  # masked tokens: 0
    flat = [x for row, m in zip(got, batch.response_mask) for x, mm in zip(row, m) if mm]
    assert abs(np.mean(flat)) < 1e-5 and abs(np.std(flat) - 1) < 1e-4


def test_reinforce_pp_returns_of_a_masked_token_skip_its_kl():
    # tokens: kl 1, (masked, kl 5), kl 2 -> A = r - beta * [1 + 2, 0, 2]
    got = adv.reinforce_pp_returns([1.0], [[0.0, 5.0, 0.0]], [[-1.0, 0.0, -2.0]], [[1, 0, 1]], beta=0.5)
    assert got == [[1.0 - 0.5 * 3, 0.0, 1.0 - 0.5 * 2]]


def test_reinforce_pp_whitening_of_equal_values_is_zero():
    assert adv.whiten([[1.0, 1.0], [1.0]], [[1, 1], [1]], 1e-6) == [[0.0, 0.0], [0.0]]
    assert adv.whiten([[3.0]], [[0]], 1e-6) == [[0.0]]  # no loss token at all


class TwoRanks:
    """Two threads standing for two data-parallel ranks: `reduce` sums a vector over both."""

    def __init__(self):
        self.barrier = threading.Barrier(2)
        self.parts = [None, None]

    def reduce(self, rank):
        def fn(a):
            self.parts[rank] = np.asarray(a)
            self.barrier.wait()
            total = self.parts[0] + self.parts[1]
            self.barrier.wait()
            return total
        return fn


def test_reinforce_pp_whitens_over_every_ranks_tokens():
    batch = reinforce_batch(seed=3, n=6)
    config = TrainerConfig(objective="reinforce_pp", kl_coef=0.2)
    whole = adv.batch_advantages(config, batch)
    ranks, out = TwoRanks(), [None, None]

    def run(rank):
        out[rank] = adv.batch_advantages(config, batch.shard(rank, 2), ranks.reduce(rank))
    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    joined = out[0] + out[1]
    assert len(joined) == len(whole)
    for a, b in zip(joined, whole):
        assert close(a, b, tol=1e-5)


def test_batch_advantages_go_group_by_group():
    batch = TrainBatch(input_ids=[[1, 2, 3]] * 5, prompt_lens=[1] * 5, rewards=[1.0, 5.0, 0.0, 2.0, 0.0],
                       group_ids=[7, 9, 7, 9, 7])
    got = adv.batch_advantages(TrainerConfig(objective="rloo"), batch)
    a, b = ref_rloo([1.0, 0.0, 0.0]), ref_rloo([5.0, 2.0])
    assert close(got, [a[0], b[0], a[1], b[1], a[2]])


def test_dapo_batch_advantages_read_the_response_lengths():
    batch = TrainBatch(input_ids=[[1] + [2] * 3, [1] + [2] * 8], prompt_lens=[1, 1], rewards=[1.0, 1.0],
                       group_ids=[0, 0])
    config = TrainerConfig(objective="dapo", max_response_len=8, overlong_buffer=4)
    got = adv.batch_advantages(config, batch)
    assert got[0] > 0 > got[1]  # the 8-token response got -1


# ---- losses ------------------------------------------------------------------------

def t(values):
    return torch.tensor(values, dtype=torch.float32)


def ref_ppo_token(logp, old, a, lo, hi):
    ratio = math.exp(logp - old)
    return -min(ratio * a, min(max(ratio, 1 - lo), 1 + hi) * a)


# ratio e^0.5 = 1.65 (> 1 + hi: clipped for A > 0), e^-0.5 = 0.61 (< 1 - lo: clipped for A < 0), e^0.05 inside
LOGP = [-1.0, -2.0, -0.5, -1.5, -0.8]
OLD = [-1.5, -1.5, -0.55, -1.0, -0.8]
ADV = [1.0, -1.0, 0.5, 2.0, -0.7]


def test_dr_grpo_loss_is_token_sum_over_samples_times_max_length():
    lo, hi, samples, max_len = 0.2, 0.28, 3, 16
    mask = [1, 1, 0, 1, 1]
    got = objectives.objective_loss("dr_grpo", t(LOGP), t(OLD), t(ADV), t(mask), clip_eps_low=lo, clip_eps_high=hi,
                                    num_tokens=4, num_samples=samples, max_response_len=max_len)
    want = sum(ref_ppo_token(*x, lo, hi) for x, m in zip(zip(LOGP, OLD, ADV), mask) if m) / (samples * max_len)
    assert got.pg_loss.item() == pytest.approx(want, rel=1e-6)
    assert got.clip_frac.item() == pytest.approx(2 / 4)  # tokens 0 (A>0, high) and 1 (A<0, low)


def test_dr_grpo_weighs_its_kl_and_entropy_as_its_policy_term():
    lo, hi, samples, max_len, kl_coef, ent_coef = 0.2, 0.28, 3, 16, 0.1, 0.02
    mask, entropy = [1, 1, 0, 1, 1], [1.0, 2.0, 0.5, 0.1, 0.3]
    got = objectives.objective_loss("dr_grpo", t(LOGP), t(OLD), t(ADV), t(mask), clip_eps_low=lo, clip_eps_high=hi,
                                    num_tokens=4, num_samples=samples, max_response_len=max_len,
                                    ref_logprobs=t(OLD), kl_coef=kl_coef, entropy=t(entropy), entropy_coef=ent_coef)
    k3 = [math.exp(o - lp) - (o - lp) - 1 for lp, o in zip(LOGP, OLD)]
    kept = [i for i, m in enumerate(mask) if m]
    pg = sum(ref_ppo_token(LOGP[i], OLD[i], ADV[i], lo, hi) for i in kept)
    want = (pg + kl_coef * sum(k3[i] for i in kept) - ent_coef * sum(entropy[i] for i in kept)) / (samples * max_len)
    assert got.loss.item() == pytest.approx(want, rel=1e-6)
    assert got.entropy.item() == pytest.approx(sum(entropy[i] for i in kept) / 4)  # reported as a token-mean
    assert got.kl.item() == pytest.approx(sum(k3[i] for i in kept) / 4, rel=1e-6)


@pytest.mark.parametrize("name", ["grpo", "dapo", "rloo"])
def test_grpo_dapo_rloo_share_grpos_loss_bit_for_bit(name):
    kwargs = dict(clip_eps_low=0.2, clip_eps_high=0.28, ref_logprobs=t(OLD), kl_coef=0.1,
                  entropy=t([1.0, 2.0, 0.5, 0.1, 0.3]), entropy_coef=0.01)
    got = objectives.objective_loss(name, t(LOGP), t(OLD), t(ADV), t([1, 1, 0, 1, 1]), num_tokens=4, **kwargs)
    want = losses.grpo_loss(t(LOGP), t(OLD), t(ADV), t([1, 1, 0, 1, 1]), num_tokens=4, **kwargs)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_reinforce_pp_keeps_the_kl_out_of_the_loss_and_reports_it():
    got = objectives.objective_loss("reinforce_pp", t(LOGP), t(OLD), t(ADV), t([1] * 5), clip_eps_low=0.2,
                                    clip_eps_high=0.2, num_tokens=5, ref_logprobs=t(OLD), kl_coef=0.5)
    assert got.kl.item() > 0
    assert got.loss.item() == got.pg_loss.item()


def ref_gspo(logp, old, a, mask, seq, lo, hi):
    """Per sequence: s_i = exp(mean over its mask-1 tokens of logp - old), loss_i =
    -min(s_i A_i, clip(s_i) A_i); returns ({i: loss_i}, {i: clipped}, {i: s_i}, {i: |y_i|})."""
    loss, clipped, ratio, length = {}, {}, {}, {}
    for i in sorted(set(seq)):
        toks = [k for k in range(len(seq)) if seq[k] == i and mask[k]]
        s = math.exp(sum(logp[k] - old[k] for k in toks) / len(toks))
        A = a[[k for k in range(len(seq)) if seq[k] == i][0]]
        un, cl = s * A, min(max(s, 1 - lo), 1 + hi) * A
        loss[i], clipped[i], ratio[i], length[i] = -min(un, cl), cl < un, s, len(toks)
    return loss, clipped, ratio, length


GSPO_CASES = [
    # sequences:            0 0 0      1 1       2          3 3
    pytest.param([0.3, 0.3, 0.3, -0.2, -0.2, 0.0, 0.0, 0.0], [1, 1, 1, 1, 1, 1, 1, 1], 0.1, 0.1,
                 id="clipped-high-and-low"),   # s_0 = e^0.3 (A>0: clipped), s_1 = e^-0.2 (A<0: clipped)
    pytest.param([0.001, 0.002, 0.0, -0.001, 0.0, 0.0, 5.0, 0.0], [1, 0, 1, 1, 1, 1, 0, 1], 3e-4, 4e-4,
                 id="masked-tokens-leave-the-ratio"),  # the masked 5.0 would clip sequence 3
    pytest.param([0.0002, 0.0002, 0.0002, 0.0001, 0.0001, 0.0, 0.0, 0.0], [1] * 8, 3e-4, 4e-4,
                 id="inside-the-paper-clip"),
]


@pytest.mark.parametrize("gap, mask, lo, hi", GSPO_CASES)
def test_gspo_sequence_ratio_clipped_per_sequence(gap, mask, lo, hi):
    seq = [0, 0, 0, 1, 1, 2, 3, 3]
    a = [1.0, 1.0, 1.0, -2.0, -2.0, 0.0, 0.5, 0.5]  # sequence 2: a group of one (A = 0)
    old = [-1.0 - 0.1 * k for k in range(8)]
    logp = [o + g for o, g in zip(old, gap)]
    samples = 4
    got = objectives.objective_loss("gspo", t(logp), t(old), t(a), t(mask), clip_eps_low=lo, clip_eps_high=hi,
                                    num_tokens=sum(mask), num_samples=samples,
                                    sample_index=torch.tensor(seq))
    loss, clipped, _, _ = ref_gspo(logp, old, a, mask, seq, lo, hi)
    assert got.pg_loss.item() == pytest.approx(sum(loss.values()) / samples, rel=1e-5, abs=1e-7)
    want_clip = sum(clipped[s] for s, m in zip(seq, mask) if m) / sum(mask)
    assert got.clip_frac.item() == pytest.approx(want_clip)
    if lo == 0.1:
        assert clipped[0] and clipped[1] and not clipped[3]


def test_gspo_gradient_is_the_sequence_ratio_spread_over_its_tokens():
    """d loss / d logp_t = -s_i A_i / (|y_i| B) for an unclipped sequence, 0 for a clipped one."""
    seq = [0, 0, 1, 1, 1]
    old = [-1.0, -2.0, -0.5, -1.0, -1.5]
    gap = [0.3, 0.3, 0.0001, 0.0, 0.0002]   # sequence 0 clipped (A > 0, s = e^0.3), 1 inside
    a = [1.0, 1.0, -1.0, -1.0, -1.0]
    mask = [1, 1, 1, 0, 1]
    logp = t([o + g for o, g in zip(old, gap)]).requires_grad_(True)
    got = objectives.objective_loss("gspo", logp, t(old), t(a), t(mask), clip_eps_low=3e-4, clip_eps_high=4e-4,
                                    num_tokens=4, num_samples=2, sample_index=torch.tensor(seq))
    got.pg_loss.backward()
    _, clipped, ratio, length = ref_gspo([o + g for o, g in zip(old, gap)], old, a, mask, seq, 3e-4, 4e-4)
    assert clipped[0] and not clipped[1]
    want = [0.0 if (clipped[s] or not m) else -ratio[s] * a[k] / (length[s] * 2)
            for k, (s, m) in enumerate(zip(seq, mask))]
    assert close(logp.grad.tolist(), want, tol=1e-5)


CISPO_CASES = [
    # logp - old, A, eps_low, eps_high
    pytest.param(0.5, 1.0, 0.2, 0.28, id="above-high"),       # ratio 1.65 -> 1.28
    pytest.param(-0.5, -1.0, 0.2, 0.28, id="below-low"),      # ratio 0.61 -> 0.8
    pytest.param(0.05, 2.0, 0.2, 0.28, id="inside"),
    pytest.param(-2.0, 1.0, 1.0, 0.28, id="no-lower-bound"),  # ratio 0.14 stays (the paper's setting)
    pytest.param(0.5, -1.0, 0.2, 0.28, id="above-high-negative-advantage"),  # PPO would clip nothing here
]


@pytest.mark.parametrize("gap, a, lo, hi", CISPO_CASES)
def test_cispo_weighs_logprob_by_the_clipped_ratio_without_its_gradient(gap, a, lo, hi):
    old = -1.3
    logp = torch.tensor([old + gap], requires_grad=True)
    pg, is_clipped = objectives.cispo_policy_loss(logp, t([old]), t([a]), lo, hi)
    ratio = math.exp(gap)
    w = min(max(ratio, 1 - lo), 1 + hi)
    assert pg.item() == pytest.approx(-w * a * (old + gap), rel=1e-6)
    assert bool(is_clipped[0]) == (ratio < 1 - lo or ratio > 1 + hi)
    pg.sum().backward()
    assert logp.grad.item() == pytest.approx(-w * a, rel=1e-6)  # d loss / d logp = -clip(ratio) * A


def test_cispo_loss_is_a_token_mean():
    mask = [1, 1, 0, 1, 1]
    got = objectives.objective_loss("cispo", t(LOGP), t(OLD), t(ADV), t(mask), clip_eps_low=0.2,
                                    clip_eps_high=0.28, num_tokens=4)
    want = 0.0
    for logp, old, a, m in zip(LOGP, OLD, ADV, mask):
        if m:
            want += -min(max(math.exp(logp - old), 0.8), 1.28) * a * logp
    assert got.pg_loss.item() == pytest.approx(want / 4, rel=1e-6)


@pytest.mark.parametrize("name", ["gspo", "cispo"])
def test_gspo_and_cispo_refuse_a_behaviour_policy(name):
    with pytest.raises(ValueError, match="behav_logprobs"):
        objectives.objective_loss(name, t(LOGP), t(OLD), t(ADV), t([1] * 5), clip_eps_low=0.2, clip_eps_high=0.2,
                                  num_tokens=5, num_samples=1, sample_index=torch.zeros(5, dtype=torch.long),
                                  behav_logprobs=t(OLD))


def test_micro_batches_know_each_tokens_sample():
    batch = TrainBatch(input_ids=[[1, 2, 3], [1, 2, 3, 4], [1, 9]], prompt_lens=[1, 2, 1],
                       response_mask=[[1, 1], [0, 1], [1]], rewards=[0.0] * 3, group_ids=[0] * 3)
    mb = build_micro_batch(batch, [0.0] * 3, [0, 1, 2], torch.device("cpu"))
    assert mb.sample_index.tolist() == [0, 0, 1, 2]


def test_grpo_step_advantages_are_the_losses_module_ones():
    batch = reinforce_batch(seed=5)
    config = TrainerConfig(kl_coef=0.1)
    assert objectives.step_advantages(batch, config) == losses.step_advantages(batch, config)


# ---- the trainer ---------------------------------------------------------------------

@pytest.fixture
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def trainer_batch(seed=0):
    rng = random.Random(seed)
    ids, plens, masks, old, ref, teacher, rewards, groups = [], [], [], [], [], [], [], []
    for g in range(3):
        prompt = [rng.randrange(3, 60) for _ in range(3)]
        for _ in range(3):
            k = rng.randint(1, 7)
            ids.append(prompt + [rng.randrange(3, 60) for _ in range(k)])
            plens.append(3)
            masks.append([0 if rng.random() < 0.2 else 1 for _ in range(k)])
            old.append([-4.2 + rng.uniform(-0.4, 0.4) for _ in range(k)])
            ref.append([-4.2 + rng.uniform(-0.3, 0.3) for _ in range(k)])
            teacher.append([-3.0 + rng.uniform(-1.0, 1.0) for _ in range(k)])
            rewards.append(float(rng.randint(0, 2)))
            groups.append(g)
    return TrainBatch(input_ids=ids, prompt_lens=plens, response_mask=masks, old_logprobs=old, ref_logprobs=ref,
                      teacher_logprobs=teacher, rewards=rewards, group_ids=groups)


@pytest.mark.parametrize("name", OBJECTIVES)
def test_a_step_is_the_same_whatever_the_micro_batches(name, one_thread):
    """The objectives' global denominators (tokens, samples) make the step independent of
    how the batch is cut: one sample per micro-batch, all in one, or packed."""
    from dynarl.components.model.config import TINY_CONFIGS
    from dynarl.components.model.qwen2 import Qwen2ForCausalLM
    from dynarl.components.trainer.native.trainer import NativeTrainer

    clip = {"gspo": (3e-4, 4e-4), "cispo": (1.0, 0.28)}.get(name, (0.2, 0.28))
    metrics = []
    for cut in ({"micro_batch_size": 1}, {"micro_batch_size": 16}, {"max_tokens_per_micro_batch": 24}):
        config = TrainerConfig(objective=name, lr=1e-3, kl_coef=0.05, entropy_coef=0.01, clip_eps_low=clip[0],
                               clip_eps_high=clip[1], max_response_len=8, overlong_buffer=2, **cut)
        torch.manual_seed(0)
        trainer = NativeTrainer(Qwen2ForCausalLM(TINY_CONFIGS["tiny-0.5m"]), config)
        try:
            metrics.append(trainer.train_step(trainer_batch()))
        finally:
            trainer.close()
    first = metrics[0]
    assert all(math.isfinite(v) for v in (first.loss, first.pg_loss, first.grad_norm))
    assert first.pg_loss != 0.0
    for m in metrics[1:]:
        for field in ("loss", "pg_loss", "kl", "entropy", "clip_frac", "grad_norm"):
            assert getattr(m, field) == pytest.approx(getattr(first, field), rel=1e-4, abs=1e-6), field


# ---- the config ----------------------------------------------------------------------

@pytest.mark.parametrize("overrides, low, high, buffer", [
    pytest.param([], 0.2, 0.2, 0, id="grpo-keeps-the-engines"),
    pytest.param([("algorithm.name", "gspo")], 3e-4, 4e-4, 0, id="gspo-paper"),
    pytest.param([("algorithm.name", "dapo")], 0.2, 0.28, 6, id="dapo-clip-higher-and-a-fifth"),
    pytest.param([("algorithm.name", "dapo"), ("algorithm.overlong_buffer", 0)], 0.2, 0.28, 0, id="dapo-no-buffer"),
    pytest.param([("algorithm.name", "cispo")], 1.0, 0.2, 0, id="cispo-no-lower-bound"),
    pytest.param([("algorithm.name", "dapo"), ("algorithm.clip_eps_high", 0.3)], 0.2, 0.3, 6, id="given-wins"),
    pytest.param([("trainer.engine.clip_eps_high", 0.25), ("algorithm.name", "rloo")], 0.2, 0.25, 0,
                 id="rloo-keeps-the-engines"),
])
def test_the_algorithm_goes_into_the_trainer_engine(overrides, low, high, buffer):
    cfg = load_config(None, overrides)
    engine = cfg.trainer.engine
    assert engine.objective == cfg.algorithm.name
    assert (engine.clip_eps_low, engine.clip_eps_high, engine.overlong_buffer) == (low, high, buffer)
    assert engine.max_response_len == cfg.rollout.max_new_tokens


@pytest.mark.parametrize("overrides, path, fragment", [
    pytest.param([("algorithm.name", "ppo2")], "algorithm.name", "choose from 'grpo', 'dr_grpo'", id="unknown"),
    pytest.param([("algorithm.name", "rloo"), ("trainer.backend", "megatron")], "algorithm.name",
                 "native trainer only", id="megatron"),
    pytest.param([("algorithm.name", "rloo"), ("workflow", "ppo")], "algorithm.name", "GAE", id="ppo"),
    pytest.param([("algorithm.name", "gspo"), ("trainer.streaming", True)], "trainer.streaming",
                 "whole batch", id="streaming"),
    pytest.param([("algorithm.name", "rloo"), ("algorithm.overlong_buffer", 4)], "algorithm.overlong_buffer",
                 "dapo", id="overlong-without-dapo"),
    pytest.param([("algorithm.name", "dapo"), ("algorithm.overlong_buffer", 64)], "algorithm.overlong_buffer",
                 "more than rollout.max_new_tokens", id="overlong-too-long"),
    pytest.param([("algorithm.clip_eps_low", 1.0)], "algorithm.clip_eps_low", "cispo", id="no-lower-bound"),
    pytest.param([("algorithm.clip_eps_low", 1.5)], "algorithm.clip_eps_low", "[0, 1]", id="range"),
])
def test_objective_config_errors_name_the_field(overrides, path, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert info.value.path == path
    assert fragment in str(info.value)


# ---- the controller's advantages (streaming parts) ---------------------------------

def test_the_reward_stage_gives_the_objectives_advantages():
    from dynarl.components.experience import PromptGroup, Sample
    from dynarl.components.reward.worker import RewardWorker

    group = PromptGroup(0, "p", "", [1], [Sample(x, 0, output_ids=[5] * n) for x, n in zip("abc", (2, 3, 8))])
    for s, r in zip(group.samples, (1.0, 0.0, 1.0)):
        s.reward = r
    worker = SimpleNamespace(engine=TrainerConfig(objective="rloo"), adv_eps=1e-6)
    assert close(RewardWorker._advantages(worker, group), ref_rloo([1.0, 0.0, 1.0]))
    worker = SimpleNamespace(engine=None, adv_eps=1e-6)  # no engine: grpo, as before
    assert RewardWorker._advantages(worker, group) == group_advantages([1.0, 0.0, 1.0], 1e-6)
    dapo = TrainerConfig(objective="dapo", max_response_len=8, overlong_buffer=4)
    worker = SimpleNamespace(engine=dapo, adv_eps=1e-6)  # the 8-token answer pays the overlong penalty
    shaped = [1.0, 0.0, 1.0 + ref_overlong(8, 8, 4, 1.0)]
    assert close(RewardWorker._advantages(worker, group), ref_grpo(shaped, 1e-6), tol=1e-5)


def test_an_agents_group_takes_the_objectives_advantages_over_its_kept_episodes():
    from dynarl.components.agents.runner import finish_group
    from dynarl.components.experience import PromptGroup, Sample
    from dynarl.components.workflows.episode import Episode

    eps = [Episode(x, [1, 5], 0, response=[7, 2], mask=[1, 1], logprobs=[-1.0, -1.0], group=0) for x in "abcd"]
    group = PromptGroup(0, "p", "", [1], [Sample(x, 0) for x in "abcd"])
    finish_group(group, eps, [False, False, True, False], [2.0, 0.0, 1.0, 1.0], end_id=2, eps=1e-6,
                 engine=TrainerConfig(objective="rloo"))
    kept = ref_rloo([2.0, 0.0, 1.0])
    assert close([group.samples[i].advantage for i in (0, 1, 3)], kept)
    assert group.samples[2].advantage == 0.0  # the failed episode
