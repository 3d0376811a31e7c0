"""Draw one iteration's batch of a workload from a seed.

Deterministic: (workload, seed, iteration, prompts) -> the same groups, in any
process. numpy's PCG64 seeded through a SeedSequence of (seed, iteration).

Math: a prompt's samples share a random effect, so their log-lengths correlate:
    ln L = ln median + sigma * (sqrt(rho) * z_prompt + sqrt(1 - rho) * z_sample)
keeps every sample's marginal LN(median, sigma), with within-prompt correlation rho.
"""
from __future__ import annotations

import math

import numpy as np

from dynarl.components.workloads.samples import Group, SampleSpec, Turn
from dynarl.components.workloads.spec import AgenticWorkload, LogNormal, MathWorkload, Workload


def generate(workload: Workload, seed: int, iteration: int, prompts: int | None = None) -> list[Group]:
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, iteration, 0x51D])))
    n = workload.prompts if prompts is None else prompts
    if n < 1:
        raise ValueError(f"prompts must be >= 1, got {n}")
    ids = [f"it{iteration}-p{i}" for i in range(n)]
    prompt_lens = draw(rng, workload.prompt_tokens, n)
    if isinstance(workload, MathWorkload):
        return _math(workload, rng, ids, prompt_lens)
    return _agentic(workload, rng, ids, prompt_lens)


def draw(rng: np.random.Generator, dist: LogNormal, size: int | tuple[int, ...],
         z: np.ndarray | None = None) -> np.ndarray:
    """Integer draws (rounded, clipped to [floor, cap]); `z` gives the standard normals."""
    z = rng.standard_normal(size) if z is None else z
    values = np.exp(math.log(dist.median) + dist.sigma * z)
    return np.clip(np.rint(values), dist.floor, dist.cap).astype(np.int64)


def _math(w: MathWorkload, rng: np.random.Generator, ids: list[str], prompt_lens: np.ndarray) -> list[Group]:
    rho = w.prompt_correlation
    shared = rng.standard_normal((len(ids), 1))
    own = rng.standard_normal((len(ids), w.samples))
    lengths = draw(rng, w.response_tokens, own.shape, math.sqrt(rho) * shared + math.sqrt(1 - rho) * own)
    return [Group(pid, int(plen), tuple(SampleSpec(f"{pid}/{k}", int(n)) for k, n in enumerate(row)))
            for pid, plen, row in zip(ids, prompt_lens, lengths.tolist())]


def _agentic(w: AgenticWorkload, rng: np.random.Generator, ids: list[str], prompt_lens: np.ndarray) -> list[Group]:
    shape = (len(ids), w.samples)
    turns = np.minimum(rng.geometric(1.0 / w.mean_turns, shape), w.max_turns)
    first = draw(rng, w.first_turn_tokens, shape + (w.max_turns,))
    decay = w.turn_decay ** np.arange(w.max_turns)
    gen = np.clip(np.rint(first * decay), 1, None).astype(np.int64)
    obs = draw(rng, w.obs_tokens, shape + (w.max_turns,))
    latency = np.exp(math.log(w.tool_latency_s.median) + w.tool_latency_s.sigma * rng.standard_normal(
        shape + (w.max_turns,)))
    latency = np.clip(latency, w.tool_latency_s.floor, w.tool_latency_s.cap)
    if w.long_fraction > 0:  # drawn after the rest, so that the other draws stay those of long_fraction 0
        long = rng.random(shape) < w.long_fraction
        grown = np.clip(np.rint(first * w.long_turn_decay ** np.arange(w.max_turns)), 1, None).astype(np.int64)
        gen = np.where(long[..., None], grown, gen)
    groups = []
    for p, pid in enumerate(ids):
        samples = []
        for k in range(w.samples):
            samples.append(SampleSpec(f"{pid}/{k}", turns=_episode(
                int(turns[p, k]), gen[p, k].tolist(), obs[p, k].tolist(), latency[p, k].tolist(),
                w.max_response_tokens)))
        groups.append(Group(pid, int(prompt_lens[p]), tuple(samples)))
    return groups


def _episode(num_turns: int, gen: list[int], obs: list[int], latency: list[float], budget: int) -> tuple[Turn, ...]:
    """The last turn answers: no tool call after it. Turns past the token budget are cut
    (the last one kept is shortened to fit)."""
    out: list[Turn] = []
    left = budget
    for i in range(num_turns):
        tokens = min(gen[i], left)
        left -= tokens
        last = i == num_turns - 1 or left == 0
        out.append(Turn(tokens, 0.0 if last else round(latency[i], 6), 0 if last else obs[i]))
        if last:
            break
    return tuple(out)
