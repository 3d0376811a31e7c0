"""Where the embodied workflow's components go on many devices, per `dynarl sim`
policy, and how long an iteration should take there (pure functions).

    colocated   temporal: an env worker, a policy rank and a learner rank on every
                device; env steps and acts take turns on each device
    spatial     env workers, policy ranks and learner ranks on devices of their own,
                in proportion to each one's work (split.py)
    hybrid      RLinf's embodied placement: env workers and policy ranks apart, in
                proportion to their work, so chunks pipeline; the learner on every device
    rlinf-auto  RLinf's planner: of temporal, every hybrid split and every spatial
                split, the placement of least predicted time (`predict`)

One env worker per env device; the job's envs are dealt evenly over the workers, and
where env workers and policy ranks are apart each worker's envs are cut into
PIPELINE_STAGES chunks. `predict` is the model the planner searches with: a chunk
alternates an act and an env step `acts` times; an env worker steps its chunks one at
a time, a policy rank acts for its chunks one at a time, a device that hosts both
(temporal) runs one call at a time; then the learner trains on its devices; sharing
devices costs a role switch each way.
"""
from __future__ import annotations

from dataclasses import dataclass

from dynarl.components.workflows.embodied import EmbodiedPlacement, even

from .split import proportional_split

POLICIES = ("colocated", "spatial", "hybrid", "rlinf-auto")
PIPELINE_STAGES = 2
"""Chunks per env worker where env workers and policy ranks have devices of their own
(hybrid, spatial): one steps while the policy acts for the other. Temporal keeps one:
its device runs one of them at a time either way."""


@dataclass(frozen=True, slots=True)
class EmbodiedCosts:
    envs: int
    """Envs in the job."""
    acts: int
    """Acts per env per iteration (steps of a chunk)."""
    env_s: float
    """One env's step over one act (its action chunk's env steps)."""
    act_s: float
    """One env's share of an act (the policy's forward is linear in its envs)."""
    train_s: float
    """Device-seconds of the learner per iteration (value forward and PPO step)."""
    switch_s: float
    """One role's offload and onload on a time-shared device."""

    def work(self) -> dict[str, float]:
        """Device-seconds per component per iteration."""
        return {"env": self.envs * self.acts * self.env_s, "rollout": self.envs * self.acts * self.act_s,
                "trainer": self.train_s}


def temporal(n: int, envs: int) -> EmbodiedPlacement:
    every = tuple(range(n))
    return EmbodiedPlacement("temporal", every, every, every, even(envs, n))


def hybrid(n: int, envs: int, env_devices: int, stages: int = PIPELINE_STAGES) -> EmbodiedPlacement:
    if not 1 <= env_devices < n:
        raise ValueError(f"hybrid needs 1 to {n - 1} env devices of {n}, got {env_devices}")
    return EmbodiedPlacement("hybrid", tuple(range(env_devices)), tuple(range(env_devices, n)), tuple(range(n)),
                             even(envs, env_devices), min(stages, envs // env_devices))


def spatial(n: int, envs: int, env_devices: int, policy_devices: int,
            stages: int = PIPELINE_STAGES) -> EmbodiedPlacement:
    learner = n - env_devices - policy_devices
    if min(env_devices, policy_devices, learner) < 1:
        raise ValueError(f"spatial needs a device each for env, policy and learner: {env_devices}, {policy_devices}, "
                         f"{learner} of {n}")
    first = env_devices + policy_devices
    return EmbodiedPlacement("spatial", tuple(range(env_devices)), tuple(range(env_devices, first)),
                             tuple(range(first, n)), even(envs, env_devices), min(stages, envs // env_devices))


def predict(p: EmbodiedPlacement, c: EmbodiedCosts) -> float:
    """The iteration's seconds on placement `p` (the module's model): each act step takes
    as long as its busiest resource (an env device stepping all its worker's chunks, a
    policy rank acting for all of its chunks, a device doing both) or its slowest
    chunk's own step then act, whichever is longer."""
    counts = p.envs or even(c.envs, len(p.env))
    chunks = p.chunks(0) if p.envs else EmbodiedPlacement(p.mode, p.env, p.rollout, p.trainer, counts,
                                                          p.stages).chunks(0)
    device: dict[int, float] = {}
    for spec in chunks:  # each device's busy seconds per act step
        d_env, d_act = p.env[spec.worker], p.rollout[spec.rank]
        device[d_env] = device.get(d_env, 0.0) + spec.count * c.env_s
        device[d_act] = device.get(d_act, 0.0) + spec.count * c.act_s
    step = max(max(device.values()), max(spec.count * (c.env_s + c.act_s) for spec in chunks))
    shared = bool(set(p.rollout) & set(p.trainer))
    return c.acts * step + c.train_s / len(p.trainer) + (2 * c.switch_s if shared else 0.0)


def place(policy: str, n: int, c: EmbodiedCosts) -> EmbodiedPlacement:
    """The policy's placement of the embodied job on `n` devices."""
    work = c.work()
    if policy == "colocated":
        return temporal(n, c.envs)
    if n < 3:
        raise ValueError(f"{policy} places env workers, policy and learner apart: it needs 3 devices, got {n}")
    if policy == "hybrid":
        split = proportional_split(work, n, components=("env", "rollout"))
        return hybrid(n, c.envs, split["env"])
    if policy == "spatial":
        split = proportional_split(work, n, components=("env", "rollout", "trainer"))
        return spatial(n, c.envs, split["env"], split["rollout"])
    if policy == "rlinf-auto":
        return min(candidates(n, c.envs), key=lambda p: predict(p, c))  # (ties: the first: temporal first)
    raise ValueError(f"the embodied workload runs policies {', '.join(POLICIES)}, not {policy!r}")


def candidates(n: int, envs: int) -> list[EmbodiedPlacement]:
    """What rlinf-auto searches: temporal, then hybrid and spatial at every split (at
    most ~64 sizes per component on large clusters)."""
    stride = max(1, n // 64)
    out = [temporal(n, envs)]
    out += [hybrid(n, envs, e) for e in range(1, n, stride) if e <= envs]
    out += [spatial(n, envs, e, r) for e in range(1, n - 1, stride) if e <= envs
            for r in range(1, n - e, stride)]
    return out
