NUM_GPUS = 0

import pytest
import torch

from dynarl.components.inference.logprobs import pack, response_logprobs, token_logprobs
from dynarl.components.model.config import TINY_CONFIGS
from dynarl.components.model.qwen2 import Qwen2ForCausalLM
from dynarl.components.rollout.base import GenerationRequest, SamplingParams
from dynarl.components.rollout.native.config import NativeEngineConfig
from dynarl.components.rollout.native.engine import NativeRolloutEngine

torch.set_num_threads(1)
CONFIG = TINY_CONFIGS["tiny-0.5m"]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Qwen2ForCausalLM(CONFIG, init_std=0.1).eval()


def rows(seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = [(5, 7), (12, 3), (1, 9), (8, 1)]
    make = lambda n: torch.randint(3, CONFIG.vocab_size, (n,), generator=g).tolist()
    return [make(p) for p, _ in lengths], [make(r) for _, r in lengths]


def manual(model, prompt, response, temperature):
    """One unpadded sequence at a time, log_softmax over the whole vocabulary."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response]))[0] / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return [logp[len(prompt) + i - 1, t].item() for i, t in enumerate(response)]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("micro_batch_size", [None, 1, 3])
def test_matches_manual_full_forward(model, temperature, micro_batch_size):
    prompts, responses = rows()
    got = response_logprobs(model, prompts, responses, temperature, micro_batch_size)
    for p, r, g in zip(prompts, responses, got):
        assert len(g) == len(r)
        torch.testing.assert_close(torch.tensor(g), torch.tensor(manual(model, p, r, temperature)), atol=1e-5, rtol=0)


def test_token_logprobs_masks_and_carries_gradients(model):
    prompts, responses = rows(1)
    input_ids, attention_mask, response_mask = pack(prompts, responses)
    assert response_mask.sum() == sum(map(len, responses))
    out = token_logprobs(model, input_ids, attention_mask, response_mask)
    assert out.shape == input_ids.shape and bool((out[response_mask == 0] == 0).all())
    assert bool((out[response_mask == 1] < 0).all())
    out.sum().backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0
    model.zero_grad(set_to_none=True)


async def test_matches_the_rollout_engines_logprobs(model):
    """The trainer-side recomputation agrees with what the engine reported while sampling."""
    prompts, _ = rows(2)
    engine = NativeRolloutEngine(model, NativeEngineConfig(block_size=4, num_blocks=128))
    results = await engine.generate([
        GenerationRequest(f"r{i}", p, SamplingParams(temperature=0.8, max_new_tokens=6, seed=i))
        for i, p in enumerate(prompts)])
    got = response_logprobs(model, prompts, [r.output_token_ids for r in results], temperature=0.8)
    for r, g in zip(results, got):
        torch.testing.assert_close(torch.tensor(g), torch.tensor(r.output_logprobs), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kwargs, error", [
    pytest.param(dict(temperature=-1.0), "temperature", id="temperature"),
    pytest.param(dict(micro_batch_size=0), "micro_batch_size", id="micro-batch"),
])
def test_rejects_bad_arguments(model, kwargs, error):
    prompts, responses = rows()
    with pytest.raises(ValueError, match=error):
        token_logprobs(model, *pack(prompts, responses), **kwargs)


def test_rejects_bad_rows(model):
    with pytest.raises(ValueError, match="empty"):
        pack([[]], [[3]])
    with pytest.raises(ValueError, match="response_mask"):
        ids = torch.ones(1, 3, dtype=torch.long)
        token_logprobs(model, ids, ids, ids)
