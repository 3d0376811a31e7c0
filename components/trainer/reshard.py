"""The worker side of P2P trainer resharding (core/migration/p2p.py drives it).

A trainer worker keeps a `Resharding` and hands it its trainer engine on every call;
through it the worker hands its state to a new set of ranks, create-before-destroy.
A trainer holds boxes of global tensors (megatron/layout.py ShardedLayout): the
native FSDP2 trainer each parameter's dim-0 rows (native/layout.py), megatron its TP
slices. Each rank plans its own part of the copies from both layouts
(layout.plan_copies, pure and the same on every rank):
- old ranks `reshard_send_boxes` what the plan reads from them, straight from their
  live state, to new ranks over a transfer process group, for the weights and every
  optimizer moment;
- new ranks `reshard_recv_boxes` into buffers laid out for their own boxes, checking
  that every element arrives exactly once;
- new ranks `reshard_install` what they received, then confirm with a digest.
All transfers are posted at once, in an order every rank agrees on
(transport/device_group.post_all: by peer pair; local hand-offs between ranks on
one device), so no ordering can deadlock. Under megatron's distributed optimizer the
state kinds have their own boxes (each rank a flat range of each parameter:
ShardedLayout.state, sharded_state.box_view); the optimizer's counters ("adam_step")
travel in the old layout's `scalars`.
With a standby pool, old ranks `reshard_retire` after the switch: they drop their
state and wait, parked, to be adopted by a later migration (`start` rebuilds).
The worker's methods (core/roles.py ReshardableRank) are thin calls into this object,
which owns what a new rank received until it installs it.

The emulated trainer's state is sizes in flat ranges (base.py StateLayout): the
controller plans its transfers (`reshard_send` / `reshard_recv`) and no byte moves.
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable

import torch
import torch.distributed as dist

from dynarl.components.trainer.base import STATE_NAMES
from dynarl.components.trainer.engine import TrainerEngine
from dynarl.transport.device_group import post_all
from dynarl.components.trainer.megatron.layout import WEIGHTS, BoxCopy, ShardedLayout, plan_copies
from dynarl.components.trainer.megatron.sharded_state import box_view
from dynarl.components.trainer.threaded import ThreadedTrainer
from dynarl.core.migration.reshard_records import (BoxDigest, BoxLayout, FullState, RangeDigest, RangeLayout,
                                                   ReshardLayout, StateDigest)
from dynarl.core.reshard_plan import LayoutError, Shard, check_tiling

Transfer = list
"""Wire form: [key, src, dst, offset, length, tag]; src/dst are ranks of the transfer
group and the tag is the transfer's index in the whole plan, unique per message."""


class Resharding:
    """A trainer worker's side of a P2P reshard. `process_group` resolves a group's
    name (only once a transfer is due); `device` is where sent slices go for the wire."""

    def __init__(self, process_group: Callable[[str], Any], device: str) -> None:
        self.process_group = process_group
        self.device = device
        self.received: dict[str, Any] | None = None
        """What this new rank received, until it installs it."""

    async def layout(self, engine: TrainerEngine) -> ReshardLayout:
        """What the planner needs: the flat extent and this rank's range per state; or
        for a model-parallel trainer (collective over its world) the boxes layout and
        the state kinds it carries."""
        # a blocking engine's layout() may be a collective (megatron's first): off the event loop
        threaded = isinstance(engine, ThreadedTrainer)
        layout = await asyncio.to_thread(engine.layout) if threaded else engine.layout()
        if isinstance(layout, ShardedLayout):
            state = engine.export_state_shard()
            return BoxLayout(total_numel=int(layout.total_numel), layout=layout.to_wire(), kinds=_kinds(state),
                             scalars=_scalars(state))
        return RangeLayout(total_numel=int(layout.total_numel),
                           ranges={s: [list(r) for r in layout.shards[s]] for s in STATE_NAMES})

    async def send_boxes(self, engine: TrainerEngine, group: str, old: BoxLayout, new: BoxLayout, offset: int) -> int:
        """An old rank sends every box the plan reads from it (each state kind), to new
        rank r at rank offset + r of the transfer group. Returns the elements sent."""
        me, pg = engine.rank, self.process_group(group)
        layout = ShardedLayout.from_wire(old.layout)
        state = engine.export_state_shard()

        def run() -> int:
            ops, sent = [], 0
            for tag, kind, c in _box_plan(old, new):
                if c.src_rank != me:
                    continue
                piece = box_view(state[f"{kind}/{c.src_param}"], c.src_box,
                                 layout.flat_range(me, kind, c.src_param)).contiguous()
                ops.append(dist.P2POp(dist.isend, piece, group=pg, tag=tag, group_peer=offset + c.dst_rank))
                sent += piece.numel()
            for w in post_all(ops):
                w.wait()
            return sent
        return await asyncio.to_thread(run)

    async def recv_boxes(self, engine: TrainerEngine, group: str, old: BoxLayout, new: BoxLayout) -> int:
        """A new rank receives every box of its own tensors (replicas too), checking that
        each element of each arrives exactly once. Returns the elements received."""
        me, pg = engine.rank, self.process_group(group)
        layout = ShardedLayout.from_wire(new.layout)
        copies = [(tag, kind, c) for tag, kind, c in _box_plan(old, new) if c.dst_rank == me]
        own = engine.export_state_shard()
        buffers = {f"{kind}/{c.dst_param}": torch.empty_like(own[f"{kind}/{c.dst_param}"]) for _, kind, c in copies}
        covered = dict.fromkeys(buffers, 0)
        for _, kind, c in copies:
            covered[f"{kind}/{c.dst_param}"] += c.numel
        for key, t in buffers.items():  # every element exactly once: checked before any byte moves
            if covered[key] != t.numel():
                raise RuntimeError(f"reshard plan covers {covered[key]} of {t.numel()} elements of {key}")
        missing = [k for k, t in own.items() if "/" in k and k not in buffers and t.numel()]
        if missing:
            raise RuntimeError(f"reshard plan leaves {missing[:3]} of this rank unfilled")
        buffers.update({k: torch.empty_like(t) for k, t in own.items() if "/" in k and k not in buffers})  # empty
        buffers.update({k: torch.tensor([v], dtype=torch.int64) for k, v in old.scalars.items()})

        def run() -> int:
            ops, copied = [], []
            for tag, kind, c in copies:
                dst = box_view(buffers[f"{kind}/{c.dst_param}"], c.dst_box, layout.flat_range(me, kind, c.dst_param))
                into = dst if dst.is_contiguous() else torch.empty_like(dst, memory_format=torch.contiguous_format)
                ops.append(dist.P2POp(dist.irecv, into, group=pg, tag=tag, group_peer=c.src_rank))
                copied.append((into, dst))
            for work in post_all(ops):
                work.wait()
            for into, dst in copied:
                if into is not dst:
                    dst.copy_(into)
            return sum(into.numel() for into, _ in copied)
        received = await asyncio.to_thread(run)
        self.received = buffers
        return received

    async def send(self, engine: TrainerEngine, group: str, transfers: list[Transfer]) -> int:
        """A flat-range (emulated) old rank's part: its state is sizes, so nothing goes on
        the wire (the mover charges the bytes' time). Returns the elements it would send."""
        return sum(t[4] for t in transfers)

    async def recv(self, engine: TrainerEngine, group: str, transfers: list[Transfer], start: int, end: int) -> int:
        """A flat-range (emulated) new rank's range [start, end) of every state: the plan
        must cover it exactly once; its sizes arrive. Returns the elements received."""
        size = end - start
        for key in STATE_NAMES:  # every element arrives exactly once: checked on the plan
            pieces = [Shard(key, src, (offset - start,), (length,))
                      for k, src, _, offset, length, _ in transfers if k == key]
            try:
                check_tiling(pieces, (size,), f"reshard of {key!r} into [{start}, {end})")
            except LayoutError as exc:
                raise RuntimeError(f"reshard plan covers {key!r} of range [{start}, {end}) unevenly: {exc}") from None
        self.received = {key: {"start": start, "end": end, "numel": size, "nbytes": size * 4} for key in STATE_NAMES}
        return sum(t[4] for t in transfers)

    async def install(self, engine: TrainerEngine, step: int) -> None:
        """Collective over the new DP group: installs the received shard."""
        if self.received is None:
            raise RuntimeError("reshard_install before reshard_recv")
        shard: dict[str, Any] = dict(self.received)
        shard["step"] = torch.tensor([step], dtype=torch.int64)
        await engine.import_state_shard(shard)
        self.received = None

    @staticmethod
    def digest(engine: TrainerEngine) -> StateDigest:
        """Per state: this rank's range and a float64 sum of it (a cheap confirmation);
        boxes: the elements it holds as the one copy of (replica 0) and their sums."""
        state = engine.export_state_shard()
        layout = engine.layout()
        if isinstance(layout, ShardedLayout):
            me = engine.rank
            sums = {}
            for kind in _kinds(state):  # each element's one copy (replica 0), in its kind's geometry
                sums[kind] = sum(float(box_view(state[f"{kind}/{p.param}"], p.param_box,
                                                layout.flat_range(me, kind, p.param)).double().sum())
                                 for p in layout.geometry(kind).pieces[me] if p.replica == 0)
            return BoxDigest(owned=sum(p.numel for p in layout.pieces[me] if p.replica == 0),
                             step=int(engine.global_step), sums=sums, scalars=_scalars(state))
        start, end = engine.layout().shards["master"][engine.rank]
        return RangeDigest(range=[start, end], step=int(engine.global_step),
                           sums={k: _sum(state[k]) for k in STATE_NAMES})

    @staticmethod
    def full_state(engine: Any) -> FullState:
        """Boxes: the rank's whole state shard by key, as tensors (tests compare them
        bitwise); flat ranges (emulated): its range and their sizes."""
        state = engine.export_state_shard()
        if isinstance(engine.layout(), ShardedLayout):
            return FullState(step=int(engine.global_step),
                             state={k: v.clone() for k, v in state.items() if k != "step"})
        start, end = engine.layout().shards["master"][engine.rank]
        return FullState(step=int(engine.global_step), state={k: state[k] for k in STATE_NAMES}, range=[start, end])


def _box_plan(old: BoxLayout, new: BoxLayout) -> list[tuple[int, str, BoxCopy]]:
    """(tag, kind, copy) for every box of every state kind: the weights ("param") on the
    weights' boxes, the optimizer's kinds on the state's (the same boxes unless the
    state is sharded apart). The same list on every rank: the tag is the index."""
    a, b = ShardedLayout.from_wire(old.layout), ShardedLayout.from_wire(new.layout)
    weights = plan_copies(a, b)
    state = plan_copies(a.state_layout(), b.state_layout()) if a.state or b.state else weights
    plan = [(kind, c) for kind in old.kinds for c in (weights if kind == WEIGHTS else state)]
    return [(tag, kind, c) for tag, (kind, c) in enumerate(plan)]


def _scalars(state: dict[str, Any]) -> dict[str, int]:
    """The optimizer's counters of a boxes shard ("adam_step"): keys without a kind, but the step."""
    return {k: int(v.reshape(-1)[0]) for k, v in state.items() if "/" not in k and k != "step"}


def _kinds(state: dict[str, Any]) -> list[str]:
    """The state kinds of a boxes shard ("param", the optimizer moments), sorted."""
    return sorted({k.split("/", 1)[0] for k in state if "/" in k})


def _sum(shard: Any) -> float:
    """An emulated rank's range stands in by its element count (what a move must preserve)."""
    return float(shard["numel"])
