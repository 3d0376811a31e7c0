"""megatron-core's own optimizer behind the trainer's optimizer interface, with its
state as tensors by local parameter name: what P2P resharding and checkpoints move.

get_megatron_optimizer gives a ChainedOptimizer over either DistributedOptimizer
(ZeRO-1: each data-parallel rank keeps the main weights and Adam moments of one flat
range of each parameter, from megatron's grad-buffer ranges) or
Float16OptimizerWithFloat16Params / FP32Optimizer (every rank the whole state).
`state_tensors` gives per local parameter "exp_avg/<name>", "exp_avg_sq/<name>" and,
when the model is not float32, "main_param/<name>" (the fp32 master weights): 1-D
shards of the rank's range under the distributed optimizer (`owned_ranges`, which
the layout records), whole parameter shapes otherwise; and "adam_step". They are
megatron's live tensors where it keeps them, so a reshard reads in place.

Written against megatron-core 0.16.1. Each model parameter's main weights are found
by pairing megatron's own lists, in the order it builds them (model_float16_groups
with shard_fp32_from_float16_groups, model_fp32_groups with shard_fp32_groups; the
float16 optimizer's float16_groups with fp32_from_float16_groups), and its Adam state
is the inner torch optimizer's state of those. Not through
_get_main_param_and_optimizer_states: its model_param_group_index_map counts a
group's parameters in grad-buffer order while the group lists fp32 parameters first,
so in a bfloat16 model with fp32 parameters (norms) it returns another parameter's
state. The ranges come from _get_model_param_range_map; missing state is made by
_init_optimizer_states_with_dummy_values, as megatron's checkpoint loading does.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

MOMENTS = ("exp_avg", "exp_avg_sq")


class CoreOptimizer:
    def __init__(self, optimizer: Any, module: torch.nn.Module, keep_main: bool) -> None:
        self.inner = optimizer
        self.subs = list(getattr(optimizer, "chained_optimizers", [optimizer]))
        self.named = list(module.named_parameters())
        self.keep_main = keep_main
        """Export the fp32 main weights too (a float16/bfloat16 model: they are not its weights)."""
        kinds = {_is_distributed(sub) for sub in self.subs}
        if len(kinds) > 1:
            raise NotImplementedError("a chain of distributed and non-distributed megatron optimizers")
        if any(getattr(sub.config, "use_precision_aware_optimizer", False) for sub in self.subs):
            raise NotImplementedError("megatron's precision-aware optimizer keeps its main weights in its state")
        self.distributed = kinds == {True}
        self.held: dict[torch.nn.Parameter, tuple[Any, torch.Tensor]] = {}
        """Model parameter -> (its sub-optimizer, its main weights on this rank): under the
        distributed optimizer a 1-D shard, and only for the parameters this rank holds."""
        for sub in self.subs:
            for model, main in _pairs(sub):
                self.held[model] = (sub, main)

    def __getattr__(self, name: str) -> Any:  # zero_grad, step, param_groups, offload_to_cpu, restore_from_cpu
        if name == "inner":  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def owned_ranges(self) -> dict[str, tuple[int, int]] | None:
        """Under the distributed optimizer, the flat range [start, end) of each local
        parameter whose state this rank holds (absent: none of it); else None."""
        if not self.distributed:
            return None
        out = {}
        for name, p in self.named:
            if p in self.held:
                r = self.held[p][0]._get_model_param_range_map(p)["param"]
                out[name] = (r.start, r.end)
        return out

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """"<kind>/<local parameter name>" -> tensor, and "adam_step". Before the first
        step megatron has no moments yet: zeros stand in (what Adam would start from)."""
        out: dict[str, torch.Tensor] = {}
        for name, p in self.named:
            main, state = self._main_and_state(p)
            for m in MOMENTS:
                out[f"{m}/{name}"] = state[m] if m in state else torch.zeros_like(main, dtype=torch.float32)
            if self.keep_main:
                out[f"main_param/{name}"] = main
        out["adam_step"] = torch.tensor([self._step()], dtype=torch.int64)
        return out

    def state_keys(self) -> list[str]:
        """The keys state_tensors gives (without making its zero stand-ins)."""
        kinds = (*MOMENTS, "main_param") if self.keep_main else MOMENTS
        return [f"{kind}/{name}" for name, _ in self.named for kind in kinds] + ["adam_step"]

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Install state_tensors' output of the rank at the same place in the same layout
        (an adamw checkpoint's "step" stands in for "adam_step"). The trainer then writes
        the weights and calls weights_loaded()."""
        missing = [k for k in self.state_keys() if k not in tensors and not (k == "adam_step" and "step" in tensors)]
        if missing:
            raise ValueError(f"optimizer state lacks {missing[:4]}")
        step = int(tensors.get("adam_step", tensors.get("step")).reshape(-1)[0])
        # (optimizer.state is a defaultdict: reading it made empty entries, so look for moments)
        if step and not any(MOMENTS[0] in st for sub in self.subs for st in sub.optimizer.state.values()):
            self._create_state()
        for name, p in self.named:
            main, state = self._main_and_state(p)
            if step and main.numel() and not all(m in state for m in MOMENTS):
                raise RuntimeError(f"megatron's optimizer made no Adam state for {name}")
            src = {m: (state[m], tensors[f"{m}/{name}"]) for m in MOMENTS if m in state}
            if self.keep_main:
                src["main_param"] = (main, tensors[f"main_param/{name}"])
            for key, (have, t) in src.items():
                if tuple(t.shape) != tuple(have.shape):
                    raise ValueError(f"{key}/{name}: shape {tuple(t.shape)}, this rank holds {tuple(have.shape)}")
            with torch.no_grad():
                for have, t in src.values():
                    have.copy_(t)
                if "step" in state:  # torch's Adam counts steps per parameter
                    state["step"] = _like(state["step"], step)
        for sub in self.subs:
            for group in sub.optimizer.param_groups:
                if "step" in group:  # fused Adams (TE, apex) count them per group
                    group["step"] = _like(group["step"], step)

    def weights_loaded(self) -> None:
        """After the trainer wrote the model's weights: a float32 model's main weights are
        those weights (its state exports no main_param), so copy them in. Usually they
        are views of them already, but an offload and onload (megatron's
        offload_to_cpu/restore_from_cpu reassign .data) leaves separate copies."""
        if self.keep_main:
            return
        with torch.no_grad():
            for p, (sub, main) in self.held.items():
                if main is p:
                    continue
                if self.distributed:
                    r = sub._get_model_param_range_map(p)["param"]
                    main.copy_(p.detach().reshape(-1)[r.start:r.end])
                else:
                    main.copy_(p.detach())

    def _main_and_state(self, p: torch.nn.Parameter) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """p's main weights on this rank and its Adam state ({} before the first step)."""
        if p not in self.held:  # the distributed optimizer: another DP rank holds all of p's state
            return torch.empty(0, dtype=torch.float32, device=p.device), {}
        sub, main = self.held[p]
        return main, sub.optimizer.state.get(main, {})

    def _step(self) -> int:
        for sub in self.subs:
            for state in sub.optimizer.state.values():
                if "step" in state:
                    return int(state["step"])
            for group in sub.optimizer.param_groups:
                if "step" in group:
                    return int(group["step"])
        return 0

    def _create_state(self) -> None:
        """Adam's state tensors, made by one step on zero gradients (as megatron does
        before loading a checkpoint); the caller then overwrites them and the weights."""
        for sub in self.subs:
            if self.distributed:
                sub._init_optimizer_states_with_dummy_values()
                continue
            for group in sub.optimizer.param_groups:
                for q in group["params"]:
                    q.grad = torch.zeros_like(q)
            sub.optimizer.step()
            sub.optimizer.zero_grad()


def _like(old: Any, step: int) -> Any:
    """`step` as the type the optimizer keeps it in (a tensor, or an int)."""
    return torch.full_like(old, step) if isinstance(old, torch.Tensor) else step


def _is_distributed(sub: Any) -> bool:
    return hasattr(sub, "shard_fp32_from_float16_groups")


def _pairs(sub: Any) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """(model parameter, its main weights) for every parameter `sub` holds state of."""
    if _is_distributed(sub):  # DistributedOptimizer: main shards, in the order megatron made them
        lists = [(sub.model_float16_groups, sub.shard_fp32_from_float16_groups),
                 (sub.model_fp32_groups, sub.shard_fp32_groups)]
    elif hasattr(sub, "float16_groups"):  # Float16OptimizerWithFloat16Params
        lists = [(sub.float16_groups, sub.fp32_from_float16_groups),
                 (sub.fp32_from_fp32_groups, sub.fp32_from_fp32_groups)]
    else:  # FP32Optimizer: the model's own parameters
        groups = [g["params"] for g in sub.optimizer.param_groups]
        lists = [(groups, groups)]
    return [(model, main) for models, mains in lists for mg, sg in zip(models, mains) for model, main in zip(mg, sg)]
