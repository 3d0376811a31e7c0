"""Log-probabilities of given responses under a model (the policy, or a frozen reference).

One full forward per (micro-)batch of right-padded prompt + response rows. The
logprob of token t is log softmax(logits[t-1] / temperature)[token t], the same
definition the native rollout engine reports (temperature 0, i.e. greedy, counts as 1).
Gradients flow when the caller has them enabled (policy loss); wrap the call in
torch.no_grad() for old-policy or reference log-probs.
"""
from __future__ import annotations

from typing import Sequence

import torch

from dynarl.components.model.qwen2 import Qwen2ForCausalLM


def pack(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int = 0,
         device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (input_ids, attention_mask, response_mask), each [B, T]."""
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise ValueError(f"prompt {i} is empty: the first response token needs a context")
    width = max(len(p) + len(r) for p, r in zip(prompts, responses))
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(len(prompts), width, dtype=torch.long)
    response_mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, (p, r) in enumerate(zip(prompts, responses)):
        n = len(p) + len(r)
        input_ids[row, :n] = torch.tensor(list(p) + list(r), dtype=torch.long)
        attention_mask[row, :n] = 1
        response_mask[row, len(p):n] = 1
    return input_ids.to(device), attention_mask.to(device), response_mask.to(device)


def token_logprobs(model: Qwen2ForCausalLM, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   response_mask: torch.Tensor, temperature: float = 1.0,
                   micro_batch_size: int | None = None) -> torch.Tensor:
    """[B, T] float32: logprob of input_ids[b, t] given the tokens before it where
    response_mask[b, t] is 1, and 0 elsewhere (position 0 has no context and must not
    be a response token)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if input_ids.shape != attention_mask.shape or input_ids.shape != response_mask.shape:
        raise ValueError("input_ids, attention_mask and response_mask must have the same shape")
    if bool(response_mask[:, 0].any()):
        raise ValueError("response_mask[:, 0] must be 0: the first token has no context to score it")
    scale = 1.0 / (temperature or 1.0)
    step = input_ids.shape[0] if micro_batch_size is None else micro_batch_size
    if step < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    chunks = []
    for start in range(0, input_ids.shape[0], step):
        ids = input_ids[start:start + step]
        logits = model(ids, attention_mask=attention_mask[start:start + step])[:, :-1].float() * scale
        targets = ids[:, 1:]
        # gather - logsumexp: no [B, T, V] log_softmax tensor beside the logits
        chosen = logits.gather(-1, targets[..., None])[..., 0] - torch.logsumexp(logits, dim=-1)
        chunks.append(torch.nn.functional.pad(chosen, (1, 0)))
    return torch.cat(chunks) * response_mask.to(torch.float32)


def response_logprobs(model: Qwen2ForCausalLM, prompts: Sequence[Sequence[int]],
                      responses: Sequence[Sequence[int]], temperature: float = 1.0,
                      micro_batch_size: int | None = None) -> list[list[float]]:
    """The logprob of every response token, one list per response (no gradient)."""
    device = next(model.parameters()).device
    input_ids, attention_mask, response_mask = pack(prompts, responses, device=device)
    with torch.no_grad():
        out = token_logprobs(model, input_ids, attention_mask, response_mask, temperature, micro_batch_size)
    return [out[row, len(p):len(p) + len(r)].tolist() for row, (p, r) in enumerate(zip(prompts, responses))]
