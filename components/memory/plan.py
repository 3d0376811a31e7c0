"""The memory plan of a job: per device, the bytes each phase of a step needs there,
by component and part. A pure function of the validated config, the model's shape,
the placement and the device's memory (`plan_memory`); the launcher prints it with
`--dry-run` and refuses a plan over a device's memory before any worker starts
(`over_budget`).

Phases, one at a time on a device whose components time-share it (device_lock):

    rollout    the rollout engines generate; the others are parked
    inference  log-probs; the others parked
    train      the trainer's forward-backward and optimizer step; the others parked
    sync       weight sync: the trainer's weights onloaded, a bucket in flight on the
               sender and on every receiver
    move       scheduler dynarl: a P2P reshard of the trainer onto one more replica
               (create-before-destroy): each new rank's state and its receive buffers
               beside the old rank's parked state and the donor engine's released one

A device's peak is its largest phase. Components on devices of their own run
at once (spatial placement): their phases do not overlap on any device, so the
same sum applies.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from dynarl.components.model.config import ModelConfig

from dynarl.components.memory import engines as e

PHASES = ("rollout", "inference", "train", "sync", "move")
PHASE_OF = {"rollout": "rollout", "inference": "inference", "trainer": "train"}
"""The phase in which a component's `working` parts apply."""


@dataclass(frozen=True, slots=True)
class DevicePlan:
    device: int
    phases: dict[str, dict[str, dict[str, int]]]
    """phase -> "component.rank" -> part -> bytes."""

    def total(self, phase: str) -> int:
        return sum(sum(parts.values()) for parts in self.phases.get(phase, {}).values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.total)

    @property
    def peak(self) -> int:
        return self.total(self.peak_phase) if self.phases else 0

    def largest(self, phase: str) -> tuple[str, int]:
        """The component (rank) holding most in `phase`, and its bytes."""
        owners = self.phases[phase]
        name = max(owners, key=lambda k: sum(owners[k].values()))
        return name, sum(owners[name].values())


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    device_kind: str
    device_bytes: int
    seq_len: int
    devices: list[DevicePlan] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def over_budget(self) -> list[DevicePlan]:
        return [d for d in self.devices if d.peak > self.device_bytes]


def footprints(cfg: Any, model: ModelConfig, shape: e.Shape, devices: dict[str, list[int]]
               ) -> list[e.Footprint]:
    """Every rank of the job, with what it holds and adds, by phase."""
    out: list[e.Footprint] = []
    world = cfg.trainer.num_ranks
    bucket = {"sync bucket": cfg.trainer.sync_bucket_bytes}
    trainer = e.megatron_trainer if cfg.trainer.backend == "megatron" else e.native_trainer
    for rank, dev in enumerate(devices["trainer"]):
        held, working = trainer(cfg, model, shape, world)
        out.append(e.Footprint("trainer", rank, (dev,), {**_park(shape, held), **shape.context},
                               {**_unparked(shape, held), **working}, {**_unparked(shape, held), **bucket},
                               cfg.trainer.backend))
    backend = cfg.rollout.backend
    for rank, dev in enumerate(devices["rollout"]):
        if backend == "native":
            held, working = e.native_rollout(cfg, model, shape)
            sync, span = bucket, (dev,)
        else:
            tp, fraction, sync_bytes = _static_pool(cfg, backend)
            held, working = e.static_pool_rollout(cfg, model, shape, fraction, tp, backend)
            if backend == "vllm" and not shape.gpu:  # vLLM's CPU backend: a KV space of its own size
                gib = getattr(cfg.rollout.vllm, "cpu_kvcache_space_gib", None) or 1
                working = {"vllm (kv cache)": gib * 2**30}
            sync, span = {"sync bucket": sync_bytes}, tuple(range(dev, dev + tp))
        out.append(e.Footprint("rollout", rank, span, {**held, **shape.context}, working, sync, backend))
    for rank, dev in enumerate(devices["inference"]):
        held, working = e.native_inference(cfg, model, shape)
        out.append(e.Footprint("inference", rank, (dev,), {**_park(shape, held), **shape.context},
                               {**_unparked(shape, held), **working}, bucket, cfg.inference.backend))
    return out


def _park(shape: e.Shape, held: dict[str, int]) -> dict[str, int]:
    return {} if shape.gpu else dict(held)


def _unparked(shape: e.Shape, held: dict[str, int]) -> dict[str, int]:
    """What an offloaded engine brings back to a GPU to work (on CPU it never left)."""
    return dict(held) if shape.gpu else {}


def _static_pool(cfg: Any, backend: str) -> tuple[int, float, int]:
    """TP, memory fraction and weight-update bucket of an SGLang or vLLM engine."""
    if backend == "sglang":
        sg = cfg.rollout.sglang
        if sg is None:
            return 1, e.DEFAULT_SGLANG_FRACTION, 512 << 20
        return sg.tp_size, sg.mem_fraction_static or e.DEFAULT_SGLANG_FRACTION, sg.weight_bucket_bytes
    vl = getattr(cfg.rollout, "vllm", None)  # rollout.backend vllm (components/rollout/vllm)
    tp = getattr(vl, "tensor_parallel_size", None) or getattr(vl, "tp_size", None) or 1
    fraction = getattr(vl, "gpu_memory_utilization", None) or e.DEFAULT_VLLM_UTILIZATION
    return tp, fraction, cfg.trainer.sync_bucket_bytes


def plan_memory(cfg: Any, model: ModelConfig, devices: dict[str, list[int]], device_kind: str,
                device_bytes: int, seq_len: int) -> MemoryPlan:
    """Per device, per phase, per component: the bytes (see the module docstring)."""
    shape = e.Shape(device_kind, device_bytes, seq_len)
    prints = footprints(cfg, model, shape, devices)
    num_devices = cfg.runtime.cluster.num_devices
    phases = {d: {p: {} for p in PHASES[:4]} for d in range(num_devices)}
    for fp in prints:
        for dev in fp.devices:
            for phase in PHASES[:4]:
                parts = dict(fp.held)
                if phase == PHASE_OF[fp.component]:
                    parts.update(fp.working)
                if phase == "sync":
                    parts.update(fp.sync)
                phases[dev][phase][f"{fp.component}.{fp.rank}"] = parts
    notes = []
    if cfg.scheduler.policy == "dynarl" and not cfg.trainer.streaming:
        _add_move(cfg, model, shape, prints, devices, phases)
    else:
        notes.append("no move phase: scheduler.policy is not dynarl")
    used = {d for fp in prints for d in fp.devices}
    plans = [DevicePlan(d, {p: v for p, v in phases[d].items()}) for d in sorted(used)]
    return MemoryPlan(device_kind, device_bytes, seq_len, plans, notes)


def _add_move(cfg: Any, model: ModelConfig, shape: e.Shape, prints: list[e.Footprint],
              devices: dict[str, list[int]], phases: dict) -> None:
    """The trainer grows by one replica onto a rollout device: the new layout's ranks
    (one more replica's worth of data parallel) on the old trainer devices and the
    donor's, each with its state and receive buffers of its sharded state; the old
    ranks parked; the donor engine released; two warm standbys per device (a second
    move in one step makes a new rank beside each current one: workflows/dynamic.py)."""
    from dynarl.components.engine_costs import trainer_unit
    unit = trainer_unit(cfg)
    donors = [d for d in devices["rollout"] if d not in devices["trainer"]][:unit]
    new_devices = list(devices["trainer"]) + donors
    world = len(new_devices)
    trainer = e.megatron_trainer if cfg.trainer.backend == "megatron" else e.native_trainer
    held, _ = trainer(cfg, model, shape, world)
    receive = {"p2p receive buffers": sum(v for k, v in held.items() if k in ("weights", "optimizer state"))}
    for d, plan in phases.items():
        plan["move"] = {}
    for fp in prints:
        for dev in fp.devices:
            phases[dev]["move"][f"{fp.component}.{fp.rank}"] = dict(fp.held)
    for rank, dev in enumerate(new_devices):
        phases[dev]["move"][f"trainer'.{rank}"] = {**held, **receive, **shape.context}
    for dev in set(devices["trainer"]) | set(devices["rollout"]):
        if shape.gpu:
            phases[dev]["move"]["standby"] = {"2 warm standbys": 2 * e.CUDA_CONTEXT_BYTES}


def trainer_rank_bytes(cfg: Any, model: ModelConfig, plan: MemoryPlan, world: int) -> int:
    """What one trainer rank of `world` ranks holds and works with (its train phase)."""
    shape = e.Shape(plan.device_kind, plan.device_bytes, plan.seq_len)
    trainer = e.megatron_trainer if cfg.trainer.backend == "megatron" else e.native_trainer
    held, working = trainer(cfg, model, shape, world)
    return sum(held.values()) + sum(working.values()) + sum(shape.context.values())


def fits_beside(plan: MemoryPlan, devices: Sequence[int], extra_bytes: int) -> bool:
    """Whether `extra_bytes` more on each of `devices` (a throwaway trainer rank of the
    DynaRL profile, beside the job's own components) stays within every device's
    memory at the device's planned peak."""
    peaks = {d.device: d.peak for d in plan.devices}
    return all(peaks.get(d, 0) + extra_bytes <= plan.device_bytes for d in devices)
