"""The worker side of P2P trainer resharding (core/migration/p2p.py drives it).

A trainer worker that mixes in `ReshardableTrainer` (and keeps its trainer engine,
a ThreadedTrainer over a NativeTrainer, in `self.trainer`) can hand its ZeRO-1
state to a new set of ranks:
- old ranks `reshard_send` the slices the plan assigns them, straight from their
  live state, to new ranks over a transfer process group;
- new ranks `reshard_recv` into buffers laid out for their own range, checking
  that every element arrives exactly once;
- new ranks `reshard_install` the received shard (a collective over their new
  DP group that also rebuilds the full weights), then confirm.
All transfers are posted at once (isend/irecv), so no ordering can deadlock.
With a standby pool, old ranks `reshard_retire` after the switch: they drop their
state and wait, parked, to be adopted by a later migration (`start` rebuilds).
"""
from __future__ import annotations

import asyncio
from typing import Any

import torch
import torch.distributed as dist

from dynarl.components.trainer.base import STATE_NAMES
from dynarl.core.reshard_plan import LayoutError, Shard, check_tiling

Transfer = list
"""Wire form: [key, src, dst, offset, length, tag]; src/dst are ranks of the transfer
group and the tag is the transfer's index in the whole plan, unique per message."""


class ReshardableTrainer:
    trainer: Any
    _received: dict[str, torch.Tensor] | None = None

    async def reshard_layout(self) -> dict:
        """What the planner needs: the flat extent and this rank's range per state."""
        layout = self.trainer.layout()
        return {"total_numel": layout.total_numel,
                "ranges": {s: [list(r) for r in layout.shards[s]] for s in STATE_NAMES}}

    async def reshard_send(self, group: str, transfers: list[Transfer]) -> int:
        """Sends this old rank's slices. Returns the elements sent."""
        pg = self.process_group(group)
        state = self.trainer.export_state_shard()
        start = self.trainer.layout().shards["master"][self.trainer.rank][0]

        def run() -> int:
            works, sent = [], 0
            for key, _, dst, offset, length, tag in transfers:
                piece = state[key][offset - start: offset - start + length].contiguous()
                works.append(dist.isend(piece, group_dst=dst, group=pg, tag=tag))
                sent += length
            for w in works:
                w.wait()
            return sent
        return await asyncio.to_thread(run)

    async def reshard_recv(self, group: str, transfers: list[Transfer], start: int, end: int) -> int:
        """Receives this new rank's range [start, end) of every state. Returns elements received."""
        size = end - start
        for key in STATE_NAMES:  # every element arrives exactly once: checked on the plan, before any byte moves
            pieces = [Shard(key, src, (offset - start,), (length,))
                      for k, src, _, offset, length, _ in transfers if k == key]
            try:
                check_tiling(pieces, (size,), f"reshard of {key!r} into [{start}, {end})")
            except LayoutError as exc:
                raise RuntimeError(f"reshard plan covers {key!r} of range [{start}, {end}) unevenly: {exc}") from None
        pg = self.process_group(group)
        buffers = {key: torch.empty(size, dtype=torch.float32) for key in STATE_NAMES}

        def run() -> int:
            works = []
            for key, src, _, offset, length, tag in transfers:
                view = buffers[key][offset - start: offset - start + length]
                works.append(dist.irecv(view, group_src=src, group=pg, tag=tag))
            for w in works:
                w.wait()
            return sum(t[4] for t in transfers)
        received = await asyncio.to_thread(run)
        self._received = buffers
        return received

    async def reshard_install(self, step: int) -> dict:
        """Collective over the new DP group: installs the received shard. Returns a
        digest of the installed range for the controller's confirmation."""
        if self._received is None:
            raise RuntimeError("reshard_install before reshard_recv")
        shard: dict[str, torch.Tensor] = dict(self._received)
        shard["step"] = torch.tensor([step], dtype=torch.int64)
        await self.trainer.import_state_shard(shard)
        self._received = None
        return await self.state_digest()

    async def reshard_warm(self) -> None:
        """A standby's one-off warm-up: build (and drop) a trainer alone, so the lazy
        imports and first allocations are not paid inside a migration."""
        await self.start(None)
        await self.reshard_retire()

    async def reshard_retire(self) -> None:
        """After the switch: this old rank's state now lives on the new ranks; drop it."""
        self.trainer = None
        self._received = None

    async def state_digest(self) -> dict:
        """Per state: this rank's range and a float64 sum of it (a cheap confirmation)."""
        state = self.trainer.export_state_shard()
        start, end = self.trainer.layout().shards["master"][self.trainer.rank]
        return {"range": [start, end], "step": self.trainer.global_step,
                "sums": {k: float(state[k].double().sum()) for k in STATE_NAMES}}

    async def full_state(self) -> dict:
        """Rank's state ranges and weights as tensors (tests compare them bitwise)."""
        state = self.trainer.export_state_shard()
        start, end = self.trainer.layout().shards["master"][self.trainer.rank]
        return {"range": [start, end], "step": self.trainer.global_step,
                **{k: state[k].clone() for k in STATE_NAMES},
                "params": {n: p.detach().clone() for n, p in self.trainer.engine.model.named_parameters()}}
