"""Log-probs of target tokens and entropy from vocabulary-sharded logits.

With tensor parallelism each rank holds logits for its slice of the vocabulary
[start, start + V/tp). Gathering full logits costs tokens x vocab floats per rank
(2.5 GB for 4k tokens of Qwen's 152k vocab), so the softmax is assembled from sums
instead:

    m        = max over all slices (no gradient: log-sum-exp is shift invariant)
    s_v      = l_v - m
    Z        = sum_r sum_v exp(s_v)                       all-reduce of one float per token
    logp_t   = s_t - log Z                                s_t lives on one rank: all-reduce
    H        = log Z - (sum_r sum_v exp(s_v) s_v) / Z      all-reduce

The all-reduces are megatron's `reduce_from_tensor_model_parallel_region` (sum
forward, identity backward). Identity is the right backward only if everything
after the sum is the same computation on every rank: each rank then receives the
whole gradient of the sum. So no rank-local term may use a summed value (the
textbook H = -sum p_v log p_v would put log Z inside each rank's local sum, and each
rank would see only its own share of d/dlog Z); the forms above sum first.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def vocab_parallel_logprobs(logits: torch.Tensor, targets: torch.Tensor, entropy_grad: bool
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [n, V/tp] (this rank's vocab slice), targets [n] global token ids ->
    (log-prob of each target [n], entropy [n]), in fp32 whatever the input. The
    entropy carries a gradient only if entropy_grad (it is also a reported metric)."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    logits = logits.float()
    tp_size = parallel_state.get_tensor_model_parallel_world_size()
    local_vocab = logits.shape[-1]
    start = parallel_state.get_tensor_model_parallel_rank() * local_vocab

    def total(x: torch.Tensor) -> torch.Tensor:
        return reduce_from_tensor_model_parallel_region(x) if tp_size > 1 else x

    m = logits.detach().max(dim=-1).values
    if tp_size > 1:
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=parallel_state.get_tensor_model_parallel_group())
    shifted = logits - m.unsqueeze(-1)
    exp = shifted.exp()
    z = total(exp.sum(dim=-1))
    mine = (targets >= start) & (targets < start + local_vocab)
    local_index = (targets - start).clamp(0, local_vocab - 1)
    target_logit = total(shifted.gather(-1, local_index.unsqueeze(-1)).squeeze(-1) * mine)
    logprobs = target_logit - z.log()
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = z.log() - total((exp * shifted).sum(dim=-1)) / z
    return logprobs, entropy
