NUM_GPUS = 0

import pytest
import torch

from dynarl.components.rollout.base import SamplingParams
from dynarl.components.rollout.native.sampling import position_seed, sample

LOGITS = torch.tensor([[1.0, 0.5, -0.4, 1.4, 0.0, 0.2, 1.5, 0.8, 0.3, 0.4]])
N = 20_000


def expected_probs(temperature=1.0, top_k=0, top_p=1.0):
    """HF's order: keep the top_k most likely, renormalise, then the smallest set whose
    mass reaches top_p."""
    probs = torch.softmax(LOGITS[0] / temperature, dim=-1)
    order = probs.argsort(descending=True, stable=True).tolist()[:top_k or None]
    mass_k = sum(probs[t].item() for t in order)
    keep, mass = torch.zeros(10, dtype=torch.bool), 0.0
    for token in order:
        if keep.any() and mass >= top_p:
            break
        keep[token] = True
        mass += probs[token].item() / mass_k
    kept = probs * keep
    return kept / kept.sum()


@pytest.mark.parametrize("kwargs", [
    pytest.param({}, id="plain"),
    pytest.param({"temperature": 0.5}, id="cold"),
    pytest.param({"temperature": 2.0}, id="hot"),
    pytest.param({"top_k": 3}, id="top-k"),
    pytest.param({"top_p": 0.6}, id="top-p"),
    pytest.param({"top_k": 4, "top_p": 0.5, "temperature": 0.7}, id="all"),
    pytest.param({"top_k": 3, "top_p": 0.7}, id="top-p-after-top-k-renormalises"),
])
def test_draws_follow_the_truncated_distribution(kwargs):
    params = [SamplingParams(seed=s, **kwargs) for s in range(N)]
    tokens, logprobs = sample(LOGITS.expand(N, 10), params, [0] * N, torch.Generator())
    freq = torch.bincount(torch.tensor(tokens), minlength=10) / N
    want = expected_probs(**kwargs)
    # 5 standard deviations of a frequency estimated from N draws
    assert (freq - want).abs().max() < 5 * (0.25 / N) ** 0.5
    assert bool((freq[want == 0] == 0).all())
    # the logprob is taken before truncation, at the request's temperature
    full = torch.log_softmax(LOGITS[0] / kwargs.get("temperature", 1.0), dim=-1)
    torch.testing.assert_close(torch.tensor(logprobs), full[torch.tensor(tokens)], atol=1e-6, rtol=0)


def test_greedy_picks_the_first_maximum_and_its_plain_logprob():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0]])
    tokens, logprobs = sample(logits, [SamplingParams(temperature=0.0, seed=1)], [5], torch.Generator())
    assert tokens == [1]
    assert logprobs[0] == pytest.approx(torch.log_softmax(logits[0], -1)[1].item())


def test_a_row_draws_the_same_token_in_any_batch():
    torch.manual_seed(0)
    logits = torch.randn(6, 50) * 2
    params = [SamplingParams(seed=10 + i, top_k=(i % 3) * 7, top_p=1.0 - 0.1 * (i % 2)) for i in range(5)]
    params.append(SamplingParams(temperature=0.0))
    positions = [3, 0, 9, 1, 4, 2]
    together, _ = sample(logits, params, positions, torch.Generator())
    for row in range(6):
        alone, _ = sample(logits[row:row + 1], params[row:row + 1], positions[row:row + 1], torch.Generator())
        assert alone == [together[row]]


def test_seed_and_position_select_the_stream():
    logits = torch.zeros(1, 1000)  # uniform: the draw reveals the stream
    draw = lambda seed, pos: sample(logits, [SamplingParams(seed=seed)], [pos], torch.Generator())[0][0]
    assert draw(3, 7) == draw(3, 7)
    assert len({draw(3, pos) for pos in range(20)}) > 15
    assert len({draw(seed, 0) for seed in range(20)}) > 15
    assert len({position_seed(s, p) for s in range(50) for p in range(50)}) == 2500
    assert all(0 <= position_seed(s, p) < 2**63 for s in (-5, 0, 2**70) for p in (0, 10**6))


def test_unseeded_rows_use_the_engine_generator():
    logits = torch.zeros(1, 1000)
    params = [SamplingParams()]
    a = [sample(logits, params, [0], torch.Generator().manual_seed(1))[0][0] for _ in range(2)]
    g = torch.Generator().manual_seed(1)
    b = [sample(logits, params, [0], g)[0][0] for _ in range(2)]
    assert a[0] == a[1] == b[0] and b[0] != b[1]
