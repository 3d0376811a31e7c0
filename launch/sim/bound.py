"""A lower bound on one iteration's time, whatever the policy:

    bound = max(total work / N, critical path)         (docs/COSTMODEL.md §4)

Work, in device-seconds, counts what every schedule must compute, at the best
efficiency the emulated devices allow; each term is exactly additive over how
the work is batched, so no batching can beat it:
  rollout    decode: summing the cost model's step time over any batching gives
             max(compute, memory) >= the larger of  (2P·T + 4·layers·d·ΣC) / (η_c·F)
             and  (T/B_max · weights + kv·ΣC) / (η_m·BW),  plus T0 per step (T/B_max
             steps at least), where T = decoded tokens, ΣC = the sum of each token's
             context and B_max = max_num_seqs; prefill: each prompt once (siblings may
             share it), each tool output once.
  inference  (6P·Σn + 6·layers·d·Σn²) / 3 / (MFU·F) over sequence lengths n
  trainer    (6P·Σn + 6·layers·d·Σn²) / (MFU·F); with a critic (ppo) twice that plus a
             forward pass (the critic's values, then its step, on the trainer's devices)
Critical path: the longest sample alone at batch 1 on its rollout TP (prefill,
every decode step, tool latencies), then its group's inference and training
spread over all N devices, after the weight sync that opens every iteration but
the first. Role switches and migrations are the policies' own overhead: not in it.
"""
from __future__ import annotations

from dataclasses import dataclass

from dynarl.components import costmodel as cm
from dynarl.components.workflows.rates import trainer_passes
from dynarl.components.workloads.samples import Group


@dataclass(frozen=True, slots=True)
class Bound:
    work_s: dict[str, float]
    """Device-seconds per component."""
    critical_path_s: float
    num_devices: int

    @property
    def bound_s(self) -> float:
        return max(sum(self.work_s.values()) / self.num_devices, self.critical_path_s)


def iteration_bound(groups: list[Group], *, model: str, device: str, rollout_tp: int, max_num_seqs: int,
                    num_devices: int, weight_bytes: int, with_sync: bool, critic: bool = False) -> Bound:
    m, d = cm.get_model(model), cm.get_device(device)
    tokens = contexts = prefill = 0
    seq_sum = seq_sq = 0
    longest = 0.0
    for g in groups:
        prefill += g.prompt_tokens
        group_seqs = []
        for s in g.samples:
            context, path = g.prompt_tokens, cm.prefill_time(m, d, g.prompt_tokens, rollout_tp)
            for gen, latency, obs in _turns(s):
                tokens += gen
                contexts += gen * context + gen * (gen - 1) // 2
                path += cm.decode_steps_time(m, d, 1, context, gen, rollout_tp) + latency
                context += gen + obs
                if obs:
                    prefill += obs
                    path += cm.prefill_time(m, d, obs, rollout_tp)
            group_seqs.append(context)
            longest = max(longest, path + _downstream(m, d, context, num_devices, critic))
        n = sum(group_seqs)
        seq_sum += n
        seq_sq += sum(x * x for x in group_seqs)
    work = {"rollout": _decode_work(m, d, tokens, contexts, max_num_seqs, rollout_tp)
            + 2 * m.num_params * prefill / (cm.PREFILL_EFFICIENCY * d.bf16_flops),
            "inference": _forward_work(m, d, seq_sum, seq_sq) / cm.LOGPROB_SPEEDUP,
            "trainer": _forward_work(m, d, seq_sum, seq_sq) * trainer_passes(critic)}
    sync = cm.weight_sync_time(weight_bytes, d.link_bandwidth, rollout_tp) if with_sync else 0.0
    return Bound(work, longest + sync, num_devices)


def _turns(sample) -> list[tuple[int, float, int]]:
    if sample.turns:
        return [(t.gen_tokens, t.tool_latency_s, t.obs_tokens) for t in sample.turns]
    return [(sample.response_tokens, 0.0, 0)]


def _downstream(m: cm.ModelShape, d: cm.DeviceSpec, seq: int, n: int, critic: bool) -> float:
    """The sample must be scored, then trained, after it ends: on all n devices at best
    (its group only adds to this); with a critic, its values come before the policy's
    step (the critic's own step is left out: on devices of its own it could run beside
    the policy's, so the bound does not count it on the path)."""
    return (1 + critic) * cm.logprob_time(m, d, seq, seq, n) + cm.train_time(m, d, seq, seq, n)


def _decode_work(m: cm.ModelShape, d: cm.DeviceSpec, tokens: int, contexts: int, max_num_seqs: int,
                 tp: int) -> float:
    if tokens == 0:
        return 0.0
    steps = tokens / max_num_seqs
    compute = (2 * m.num_params * tokens + 4 * m.num_layers * m.hidden_size * contexts) / (
        cm.COMPUTE_EFFICIENCY * d.bf16_flops)
    memory = (steps * m.weight_bytes + contexts * m.kv_bytes_per_token) / (cm.HBM_EFFICIENCY * d.hbm_bandwidth)
    return cm.DECODE_STEP_OVERHEAD_S * tp * steps + max(compute, memory)


def _forward_work(m: cm.ModelShape, d: cm.DeviceSpec, seq_sum: int, seq_sq: int) -> float:
    flops = 6 * m.num_params * seq_sum + 6 * m.num_layers * m.hidden_size * seq_sq
    return flops / (cm.DEFAULT_MFU * d.bf16_flops)
