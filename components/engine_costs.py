"""What the DynaRL scheduler and the workflows need to know of the configured engines
(workflows/dynamic.py, survival.py): device units, move costs, rate sources. Plain
config reads, no torch: the controller imports them (engine_factory.py makes the
engines, in the ranks)."""
from __future__ import annotations

import math
from typing import Any

def trainer_min_devices(cfg: Any) -> int:
    """Fewest devices the trainer runs on: an emulated trainer's fp32 state must fit in
    its devices' memory (at the engines' memory fraction); megatron: one replica
    (trainer_unit); native: 1."""
    if cfg.trainer.backend == "emulated":
        return emulated_trainer_min_devices(cfg.trainer.emulated)
    return trainer_unit(cfg)


def trainer_unit(cfg: Any) -> int:
    """The trainer gains and gives devices in multiples of this: a megatron trainer's
    tensor x pipeline parallel size (one data-parallel replica); 1 otherwise."""
    if cfg.trainer.backend != "megatron":
        return 1
    m = cfg.trainer.megatron
    return m.tensor_parallel_size * m.pipeline_parallel_size


def emulated_trainer_min_devices(emulation: Any) -> int:
    from dynarl.components.costmodel import DEFAULT_MEM_UTIL, get_device
    from dynarl.components.trainer.emulated.engine import full_state_bytes
    return max(1, math.ceil(full_state_bytes(emulation) / (DEFAULT_MEM_UTIL * get_device(emulation.device).memory_bytes)))


def move_costs(cfg: Any) -> Any:
    """What a move costs on the devices beyond its calls (core/migration/mover.py):
    nothing on real engines (the calls take the time they take); on emulated devices
    the cost model's role switch, engine restart and the trainer's state over one
    device link (docs/COSTMODEL.md §3)."""
    from dynarl.core.migration.mover import MoveCosts
    if cfg.rollout.backend != "emulated":
        return MoveCosts()
    from dynarl.components.costmodel import ROLE_SWITCH_S, role_switch_time
    return MoveCosts(release_s=ROLE_SWITCH_S / 2, switch_s=role_switch_time(),
                     restart_s=role_switch_time(restart=True), state_s=trainer_state_s(cfg.trainer.emulated))


def trainer_state_s(emulation: Any) -> float:
    """An emulated trainer's state over one device link (a P2P move's transfer)."""
    from dynarl.components.costmodel import get_device
    from dynarl.components.trainer.emulated.engine import full_state_bytes
    return full_state_bytes(emulation) / get_device(emulation.device).link_bandwidth


def scheduler_rates(cfg: Any, tp: int, devices: int) -> Any:
    """The predictor's source (workflows/rates.py): the cost model emulated engines run
    on, or profiles and measurements of real ones; workflow ppo's critic works on the
    trainer's devices too (rates.trainer_passes)."""
    from dynarl.components.workflows.rates import CostModelRates, MeasuredRates, trainer_passes
    passes = trainer_passes(cfg.workflow == "ppo")
    if cfg.rollout.backend == "emulated":
        r, t = cfg.rollout.emulated, cfg.trainer.emulated
        return CostModelRates(model=r.model, device=r.device, tp=tp, devices=devices, max_seqs=r.max_num_seqs,
                              mfu=t.mfu, recompute=t.recompute, trainer_passes=passes)
    return MeasuredRates(tp=tp, devices=devices, max_seqs=cfg.rollout.engine.max_num_seqs, trainer_passes=passes)


def time_scale(cfg: Any) -> float:
    """Real seconds per emulated second of the engines (1 for real ones)."""
    return cfg.rollout.emulated.time_scale if cfg.rollout.backend == "emulated" else 1.0


def inference_joins(cfg: Any) -> bool:
    """Whether inference ranks can take devices mid-step from a warm standby pool: an
    emulated rank holds no model; a real one does (a standby on every rollout device
    would hold a copy each), so real inference does not receive devices."""
    return cfg.inference.backend == "emulated"

