"""The named workloads of `dynarl sim --workload NAME`, each number with its source.

Tags as in docs/COSTMODEL.md: [P] primary source, [S] secondary, [E] estimate made here.

    math-{1.5b,7b,32b}          the DynaRL paper's setup: AReaL-boba prompts on a distilled
                                reasoning model, 512 x 16, 28,672-token sequences (§7.1) [P]
    math-{size}-zero            zero-RL from a base model: short answers, 16k cap
    math-{size}-longcot         long chain-of-thought: most answers in the thousands
    ppo-{size}                  math-{size} trained with PPO: a critic of the policy's size
    agentic-rstar[-{size}]      rStar2-Agent-style code-tool episodes (the paper's agentic run)
    agentic-rstar-grow[-{size}], agentic-rstar-bimodal[-{size}]
                                adversarial traces for the priority: later turns that grow;
                                episodes whose later turns grow or shrink (bimodal)
    agentic-search[-{size}]     Search-R1-style retrieval episodes
    embodied                    RLinf's ManiSkill recipe: a 7B VLA policy acting on rendered
                                frames, PPO with a value head (workflow embodied)

Model size fixes the TPs as in the paper (§7.1): rollout TP 1 / 2 / 4 for
1.5B / 7B / 32B (trainer TP 2 / 4 / 8 is not modelled: the emulated trainer is
data parallel, one rank per device, and its time scales linearly either way).
"""
from __future__ import annotations

import dataclasses

from dynarl.components.workloads.spec import AgenticWorkload, EmbodiedWorkload, LogNormal, MathWorkload, Workload

SIZES = {"1.5b": ("qwen2.5-1.5b", 1), "7b": ("qwen2.5-7b", 2), "32b": ("qwen2.5-32b", 4)}
"""size -> (cost-model key, rollout TP) [P: DynaRL §7.1]."""

RESPONSE_CAP = 28_672 - 1_024
"""The paper's 28,672-token max sequence less room for the prompt [P: DynaRL §7.1]."""

PROMPT_TOKENS = LogNormal(median=200, sigma=0.4, cap=1024)
"""Math prompts: a few hundred tokens with a chat template [E]."""

MATH_RESPONSES = {
    # [E] fitted to the paper's Fig 2 (1.5B): ~95% of queries done by 150 s of a 259.5 s
    # longest decode, i.e. p95 at ~58-64% of the cap; with σ 0.9 the median is 4k and
    # 1.7% hit the cap (AReaL-boba: truncation < 5% [P]).
    "": LogNormal(median=4096, sigma=0.9, cap=RESPONSE_CAP),
    # docs/COSTMODEL.md §1 "Suggested distributions": zero-RL LN(450, 1.1) cap 16k [E from RollPacker, P].
    "-zero": LogNormal(median=450, sigma=1.1, cap=16_384),
    # docs/COSTMODEL.md §1: long CoT LN(8k, 0.7) cap 27k, ~4% truncation [E].
    "-longcot": LogNormal(median=8192, sigma=0.7, cap=27_000),
}

PROMPT_CORRELATION = 0.5
"""Responses to one prompt have similar lengths (Seer [S], RhymeRL); half the
log-variance shared is an estimate [E]."""


def _math(size: str, variant: str) -> MathWorkload:
    model, tp = SIZES[size]
    return MathWorkload(
        name=f"math-{size}{variant}", model=model, prompts=512, samples=16, prompt_tokens=PROMPT_TOKENS,
        response_tokens=MATH_RESPONSES[variant], prompt_correlation=PROMPT_CORRELATION, rollout_tp=tp,
        source="512 x 16 [P: DynaRL §7.1, AReaL-boba, DAPO]; lengths docs/COSTMODEL.md §1")


def _rstar(size: str) -> AgenticWorkload:
    model, tp = SIZES[size]
    return AgenticWorkload(
        name=f"agentic-rstar-{size}", model=model, prompts=256, samples=8,
        prompt_tokens=PROMPT_TOKENS, mean_turns=4.0, max_turns=10,
        # Round 0 is the longest and later rounds shrink (DynaRL observation 3 [P]); 8k
        # response budget per episode (rStar2-Agent stage 1) [S]; per-turn sizes [E].
        first_turn_tokens=LogNormal(median=700, sigma=0.8, cap=4096), turn_decay=0.75,
        max_response_tokens=8192,
        obs_tokens=LogNormal(median=120, sigma=1.0, cap=1024),  # code-execution output [E]
        # mean ≈ 0.2 s per call (rStar2-Agent Fig 6: 0.15-0.3 s [P]): median·e^{σ²/2} = 0.2
        tool_latency_s=LogNormal(median=0.145, sigma=0.8, cap=30.0, floor=0.0),
        rollout_tp=tp, source="rStar2-Agent [P Fig 6] tool latency; turns and sizes [E]; batch [E] sized for speed")


def _search(size: str) -> AgenticWorkload:
    model, tp = SIZES[size]
    return AgenticWorkload(
        name=f"agentic-search-{size}", model=model, prompts=512, samples=5,  # 512 x 5 [P: Search-R1]
        prompt_tokens=PROMPT_TOKENS, mean_turns=2.0, max_turns=3,  # max_turns=2 searches + the answer [P]
        first_turn_tokens=LogNormal(median=150, sigma=0.8, cap=500), turn_decay=1.0,  # ≤ 500 per turn [P]
        max_response_tokens=1500,
        obs_tokens=LogNormal(median=500, sigma=0.0, cap=500),  # top-3 passages ≈ 500 tokens [P]
        tool_latency_s=LogNormal(median=0.03, sigma=0.7, cap=1.0, floor=0.0),  # local retriever 10-100 ms [E]
        rollout_tp=tp, source="Search-R1 train_grpo.sh [P]; retriever latency [E]")


ENV_STEP_S = 2303.5e-6
"""One env step of Reacher-v5 (MuJoCo) with a 224x224 RGB frame rendered offscreen (EGL),
on this project's 2-core CPU machine: `dynarl bench env --json`, 2026-12-05, rgb_us
2303.5 (state only 25.8) [M]. A GPU simulator (RLinf's ManiSkill3) renders faster; a
frame rendered on a CPU is the figure measured here."""


def _embodied() -> EmbodiedWorkload:
    # RLinf examples/embodiment/config/maniskill_ppo_openvlaoft.yaml [P]: OpenVLA-OFT (7B,
    # LoRA; here fully trained: the emulated trainer) with a value head, PPO + GAE, 128 envs
    # on 8 GPUs (16 per device), 224x224 frames; OpenVLA's 256 patch tokens plus a ~30-token
    # instruction [S: OpenVLA]; 8-step chunks of 7-dim actions decoded in parallel, 56
    # tokens [S: OpenVLA-OFT]; 80 steps per episode [E]. The 7B backbone's cost is the
    # qwen2.5-7b shape's [E] (Llama-2-7B is within 12% in parameters).
    return EmbodiedWorkload(
        name="embodied", model="qwen2.5-7b", env_id="Reacher-v5", env_step_s=ENV_STEP_S, envs_per_device=16,
        horizon=80, action_chunk=8, obs_tokens=286, action_tokens=56,
        source="RLinf maniskill_ppo_openvlaoft [P]; env step: dynarl bench env [M]; tokens [S]; horizon [E]")


def _build() -> dict[str, Workload]:
    out: dict[str, Workload] = {}
    for size in SIZES:
        for variant in MATH_RESPONSES:
            w = _math(size, variant)
            out[w.name] = w
        for w in (_rstar(size), _search(size)):
            out[w.name] = w
        # PPO on the math batch: the critic is the policy's size and trains on every
        # sample beside it (Open-Reasoner-Zero's PPO, RL2 examples/orz_ppo.sh: critic
        # Qwen2.5-7B for a Qwen2.5-7B actor, GAE [S]); prompts and lengths as math-{size}.
        ppo = _math(size, "")
        out[f"ppo-{size}"] = dataclasses.replace(ppo, name=f"ppo-{size}", critic=True,
                                                 source=ppo.source + "; critic the policy's size [S: ORZ, RL2]")
    out["agentic-rstar"] = dataclasses.replace(out["agentic-rstar-7b"], name="agentic-rstar")
    # Adversarial for the (tool_count, cached_prefix) priority (issue 23, issue 48):
    # agentic-rstar-grow[-{size}]     later turns grow instead of shrinking (first turn
    #                                 median 300 tokens, x1.4 per turn), the rest as agentic-rstar [E];
    # agentic-rstar-bimodal[-{size}]  a quarter of the episodes grow (x1.8 per turn) and
    #                                 the rest shrink (x0.5), drawn per episode, so that the turn index
    #                                 alone does not tell whether a later turn is long; on average a
    #                                 later turn is still shorter than a first one [E].
    # The 7B ones (no suffix) form no queue at 16-64 devices (docs/benchmarks.md); at 32B an
    # engine holds 0.8 M tokens of KV (TP 4) and the order acts.
    for size in SIZES:
        rstar = out[f"agentic-rstar-{size}"]
        out[f"agentic-rstar-grow-{size}"] = dataclasses.replace(
            rstar, name=f"agentic-rstar-grow-{size}", turn_decay=1.4,
            first_turn_tokens=LogNormal(median=300, sigma=0.8, cap=4096),
            source="agentic-rstar with turns that grow (x1.4 per turn): an adversarial trace for the priority [E]")
        out[f"agentic-rstar-bimodal-{size}"] = dataclasses.replace(
            rstar, name=f"agentic-rstar-bimodal-{size}", turn_decay=0.5, long_fraction=0.25,
            long_turn_decay=1.8, first_turn_tokens=LogNormal(median=400, sigma=0.8, cap=4096),
            source="agentic-rstar with bimodal episodes (25% grow x1.8 per turn, the rest x0.5): "
                   "an adversarial trace for the priority [E]")
    out["agentic-rstar-grow"] = dataclasses.replace(out["agentic-rstar-grow-7b"], name="agentic-rstar-grow")
    out["agentic-rstar-bimodal"] = dataclasses.replace(out["agentic-rstar-bimodal-7b"], name="agentic-rstar-bimodal")
    out["agentic-search"] = dataclasses.replace(out["agentic-search-7b"], name="agentic-search")
    out["embodied"] = _embodied()
    return out


WORKLOADS: dict[str, Workload] = _build()


def get_workload(name: str) -> Workload:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(sorted(WORKLOADS))}")
    return WORKLOADS[name]


def prompts_for(workload: Workload, num_devices: int) -> int:
    """Prompts per iteration on `num_devices`: the workload's batch (the paper keeps
    512 x 16 at 64 and 128 GPUs) up to 256 devices; beyond, 2 prompts per device
    (32 math responses per device), so that a large cluster is not idle by construction."""
    if num_devices <= 256:
        return workload.prompts
    return max(workload.prompts, 2 * num_devices)
