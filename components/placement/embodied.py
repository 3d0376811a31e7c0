"""Where the embodied workflow's components go (components/workflows/embodied.py):
`place`, `dynarl train`'s placement modes; on many devices, per `dynarl sim` policy
(`place_policy`),
and how long an iteration should take there (pure functions).

    colocated   an env worker, a policy rank and a learner rank on every device; env
                steps and acts take turns on each device
    spatial     env workers, policy ranks and learner ranks on devices of their own,
                in proportion to each one's work (split.py)
    hybrid      RLinf's embodied placement: env workers and policy ranks apart, in
                proportion to their work, so chunks pipeline; the learner on every device
    rlinf-auto  RLinf's planner: of colocated, every hybrid split and every spatial
                split, the placement of least predicted time (`predict`)
    dynarl      the learner on the fewest devices its state needs, env workers and
                policy ranks apart on the rest in proportion to their work; at each
                iteration's barrier the scheduler lends the learner the finished env and
                policy devices (components/workflows/embodied_barrier.py)

One env worker per env device; the job's envs are dealt evenly over the workers, and
where env workers and policy ranks are apart each worker's envs are cut into
PIPELINE_STAGES chunks. `predict` is the model the planner searches with: a chunk
alternates an act and an env step `acts` times; an env worker steps its chunks one at
a time, a policy rank acts for its chunks one at a time, a device that hosts both
(colocated) runs one call at a time; then the learner trains on its devices; sharing
devices costs a role switch each way.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dynarl.components.placement.split import proportional_split

POLICIES = ("colocated", "spatial", "hybrid", "rlinf-auto", "dynarl")
PIPELINE_STAGES = 2
"""Chunks per env worker where env workers and policy ranks have devices of their own
(hybrid, spatial): one steps while the policy acts for the other. Colocated keeps one:
its device runs one of them at a time either way."""


@dataclass(frozen=True, slots=True)
class EmbodiedPlacement:
    mode: str
    env: tuple[int, ...]
    """Each env worker's device."""
    rollout: tuple[int, ...]
    """Each policy rank's device."""
    trainer: tuple[int, ...]
    """Each learner rank's device."""
    envs: tuple[int, ...] = ()
    """Each env worker's envs (empty: embodied.envs_per_worker each)."""
    stages: int = 1
    """Pipeline stages per env worker: its envs in that many chunks, so the worker steps
    one while the policy acts for another (the data granularity of the pipeline)."""

    def __post_init__(self) -> None:
        if not (self.env and self.rollout and self.trainer):
            raise ValueError("a placement needs env workers, a policy rank and a learner rank")
        if self.envs and (len(self.envs) != len(self.env) or min(self.envs) < 1):
            raise ValueError(f"{len(self.envs)} env counts for {len(self.env)} env workers (each >= 1)")
        if self.stages < 1 or (self.envs and min(self.envs) < self.stages):
            raise ValueError(f"{self.stages} pipeline stages need as many envs on every env worker")

    def describe(self) -> str:
        stages = f" ({self.stages} chunks per env worker)" if self.stages > 1 else ""
        return f"env {_span(self.env)} | rollout {_span(self.rollout)} | trainer {_span(self.trainer)}{stages}"

    def chunks(self, envs_per_worker: int) -> list["ChunkSpec"]:
        """Every env worker's envs cut into `stages` chunks, worker by worker; each
        chunk's policy rank: the one on its worker's device where there is one
        (colocated), else the rank acting for the fewest envs so far (ties: the first)."""
        out: list[ChunkSpec] = []
        load = [0] * len(self.rollout)
        for worker, device in enumerate(self.env):
            first = 0
            for count in even(self.envs[worker] if self.envs else envs_per_worker, self.stages):
                if device in self.rollout:
                    rank = self.rollout.index(device)
                else:
                    rank = min(range(len(load)), key=lambda r: (load[r], r))
                load[rank] += count
                out.append(ChunkSpec(worker, first, count, rank))
                first += count
        return out


@dataclass(frozen=True, slots=True)
class ChunkSpec:
    """A pipeline chunk: envs first .. first + count of env worker `worker`, acted for by
    policy rank `rank`."""
    worker: int
    first: int
    count: int
    rank: int


def even(total: int, parts: int) -> tuple[int, ...]:
    """`total` envs dealt over `parts` (workers or chunks), as even as they divide
    (earlier ones more)."""
    if not 1 <= parts <= total:
        raise ValueError(f"{total} envs cannot be dealt over {parts} parts")
    return tuple(total // parts + (1 if i < total % parts else 0) for i in range(parts))


def _span(devices: tuple[int, ...]) -> str:
    if len(devices) > 2 and list(devices) == list(range(devices[0], devices[0] + len(devices))):
        return f"{devices[0]}-{devices[-1]}"
    return str(list(devices)) if len(devices) != 1 else str(devices[0])


def place(mode: str, env_workers: int, num_devices: int, stages: int = 1, learner_ranks: int = 1
          ) -> EmbodiedPlacement:
    """Pure: the devices of each component of `dynarl train`'s embodied job (one policy
    rank; see the module's docstring). The learner's data-parallel ranks each on a
    device of their own, from its first device on (wrapping round the cluster, sharing
    devices with env workers): NCCL takes no two members of its gradient group on one GPU."""
    if learner_ranks > num_devices:
        raise ValueError(f"embodied.learner_ranks {learner_ranks}: one rank per device, the cluster has "
                         f"{num_devices}")
    if mode == "colocated":
        return EmbodiedPlacement(mode, tuple(i % num_devices for i in range(env_workers)), (0,),
                                 _learner(0, learner_ranks, num_devices), stages=stages)
    need = env_workers + (1 if mode == "hybrid" else 2)
    if mode not in ("hybrid", "spatial"):
        raise ValueError(f"the embodied workflow places envs colocated, hybrid or spatial, not {mode!r}")
    if num_devices < need:
        raise ValueError(f"{mode} placement of {env_workers} env workers needs {need} devices, the cluster has "
                         f"{num_devices}")
    first = env_workers + (0 if mode == "hybrid" else 1)
    return EmbodiedPlacement(mode, tuple(range(env_workers)), (env_workers,),
                             _learner(first, learner_ranks, num_devices), stages=stages)


def _learner(first: int, ranks: int, num_devices: int) -> tuple[int, ...]:
    return tuple((first + i) % num_devices for i in range(ranks))


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
    learner_min: int = 1
    """Fewest devices the learner's state fits on."""

    def work(self) -> dict[str, float]:
        """Device-seconds per component per iteration."""
        return {"env": self.envs * self.acts * self.env_s, "rollout": self.envs * self.acts * self.act_s,
                "trainer": self.train_s}


def colocated(n: int, envs: int) -> EmbodiedPlacement:
    every = tuple(range(n))
    return EmbodiedPlacement("colocated", every, every, every, even(envs, n))


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
    chunks = dataclasses.replace(p, envs=p.envs or even(c.envs, len(p.env))).chunks(0)
    device: dict[int, float] = {}
    for spec in chunks:  # each device's busy seconds per act step
        d_env, d_act = p.env[spec.worker], p.rollout[spec.rank]
        device[d_env] = device.get(d_env, 0.0) + spec.count * c.env_s
        device[d_act] = device.get(d_act, 0.0) + spec.count * c.act_s
    step = max(max(device.values()), max(spec.count * (c.env_s + c.act_s) for spec in chunks))
    shared = bool(set(p.rollout) & set(p.trainer))
    return c.acts * step + c.train_s / len(p.trainer) + (2 * c.switch_s if shared else 0.0)


def place_policy(policy: str, n: int, c: EmbodiedCosts) -> EmbodiedPlacement:
    """The `dynarl sim` policy's placement of the embodied job on `n` devices."""
    work = c.work()
    if policy == "colocated":
        return colocated(n, c.envs)
    if n < 3:
        raise ValueError(f"{policy} places env workers, policy and learner apart: it needs 3 devices, got {n}")
    if policy == "hybrid":
        split = proportional_split(work, n, components=("env", "rollout"))
        return hybrid(n, c.envs, split["env"])
    if policy == "spatial":
        split = proportional_split(work, n, components=("env", "rollout", "trainer"))
        return spatial(n, c.envs, split["env"], split["rollout"])
    if policy == "rlinf-auto":
        return min(candidates(n, c.envs), key=lambda p: predict(p, c))  # (ties: the first: colocated first)
    if policy == "dynarl":
        rest = n - c.learner_min
        if rest < 2:
            raise ValueError(f"dynarl places the learner on {c.learner_min} devices and env workers and policy apart: "
                             f"it needs {c.learner_min + 2} devices, got {n}")
        split = proportional_split(work, rest, components=("env", "rollout"))
        return spatial(n, c.envs, split["env"], rest - split["env"])
    raise ValueError(f"the embodied workload runs policies {', '.join(POLICIES)}, not {policy!r}")


def candidates(n: int, envs: int) -> list[EmbodiedPlacement]:
    """What rlinf-auto searches: colocated, then hybrid and spatial at every split (at
    most ~64 sizes per component on large clusters)."""
    stride = max(1, n // 64)
    out = [colocated(n, envs)]
    out += [hybrid(n, envs, e) for e in range(1, n, stride) if e <= envs]
    out += [spatial(n, envs, e, r) for e in range(1, n - 1, stride) if e <= envs
            for r in range(1, n - e, stride)]
    return out
