"""Turn a batch of next-token logits into tokens: greedy, temperature, top-k, top-p.

Reproducibility: a request with a seed draws the token at output position i from a
torch.Generator seeded by mix(seed, i), and every other step of the choice depends
only on its own row of logits. So the same request picks the same tokens whatever
else is in the batch, and a request exported mid-generation and continued on another
engine draws exactly what an uninterrupted run would. Requests without a seed use
the engine's generator (reproducible only for the same engine history).

Reported logprob: log softmax(logits / temperature)[token], i.e. under the
temperature-scaled distribution *before* top-k/top-p truncation (what RL trainers
recompute with their forward pass). With temperature 0 (greedy) it is
log softmax(logits)[token].
"""
from __future__ import annotations

from typing import Sequence

import torch

from dynarl.components.rollout.base import SamplingParams

_MASK64 = (1 << 64) - 1


def position_seed(seed: int, position: int) -> int:
    """splitmix64 of (seed, position): nearby seeds/positions give unrelated streams."""
    z = (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)  # manual_seed takes a non-negative int64


def _uniforms(params: Sequence[SamplingParams], positions: Sequence[int], fallback: torch.Generator) -> torch.Tensor:
    seeded = torch.Generator()  # re-seeded per row: same stream as a fresh generator, cheaper
    out = []
    for p, position in zip(params, positions):
        if p.seed is None:
            out.append(torch.rand((), generator=fallback, dtype=torch.float64).item())
        else:
            seeded.manual_seed(position_seed(p.seed, position))
            out.append(torch.rand((), generator=seeded, dtype=torch.float64).item())
    return torch.tensor(out, dtype=torch.float64)


def sample(logits: torch.Tensor, params: Sequence[SamplingParams], positions: Sequence[int],
           fallback: torch.Generator) -> tuple[list[int], list[float]]:
    """logits [B, V]; positions[b] = output position of the token being drawn for row b."""
    logits = logits.float()
    temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32)
    greedy = temperature == 0
    scaled = logits / torch.where(greedy, 1.0, temperature)[:, None]
    logprobs = torch.log_softmax(scaled, dim=-1)
    tokens = logits.argmax(dim=-1)
    if not bool(greedy.all()):
        tokens = torch.where(greedy, tokens, _draw(scaled, params, positions, fallback))
    chosen = logprobs.gather(1, tokens[:, None])[:, 0]
    return tokens.tolist(), chosen.tolist()


def _draw(scaled: torch.Tensor, params: Sequence[SamplingParams], positions: Sequence[int],
          fallback: torch.Generator) -> torch.Tensor:
    # Invert each row's CDF (in vocabulary order) at the row's uniform draw. Rows with
    # top-k/top-p first zero the truncated tokens; a row's result never depends on the
    # other rows, so the sort is skipped when no row truncates.
    probs = torch.softmax(scaled, dim=-1)
    if any(p.top_k > 0 or p.top_p < 1 for p in params):
        probs = torch.where(_truncation_mask(scaled, params), probs, 0.0)
    cdf = torch.cumsum(probs.double(), dim=-1)
    u = _uniforms(params, positions, fallback) * cdf[:, -1]
    index = torch.searchsorted(cdf, u[:, None], right=True)[:, 0]
    last_kept = (probs > 0).long().cumsum(-1).argmax(-1)  # guards u rounding up to the total mass
    return torch.minimum(index, last_kept)


def _truncation_mask(scaled: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """True for the tokens top-k then top-p keep (as HF applies them); all True for a row
    with top_k=0 and top_p=1."""
    vocab = scaled.shape[-1]
    sorted_logits, order = scaled.sort(dim=-1, descending=True, stable=True)  # stable: ties keep vocab order
    rank = torch.arange(vocab)
    top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params])
    sorted_logits = sorted_logits.masked_fill(rank[None, :] >= top_k[:, None], float("-inf"))
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32)
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # mass of the strictly better tokens
    keep = (before < top_p[:, None]) | (top_p[:, None] >= 1) | (rank[None, :] == 0)
    keep &= rank[None, :] < top_k[:, None]
    return torch.zeros_like(keep).scatter(1, order, keep)
