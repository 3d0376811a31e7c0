"""What a trainer rank's resharding calls return across a process (core/roles.py
ReshardableRank; components/trainer/reshard.py makes them, p2p.py reads them), as
registered wire records (transport/wire.py register_struct, by their fields).

A trainer's state is of one of two kinds, and each call has a record per kind:
- flat ranges (the emulated trainer): each rank holds [start, end) of every state;
  the controller plans the transfers (RangeLayout, RangeDigest);
- boxes (native FSDP2, megatron TP x DP): each rank holds boxes of global tensors and
  the ranks plan their own copies from both layouts (BoxLayout, BoxDigest).
`full_state` (FullState) is the whole shard, for tests that compare it bitwise."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dynarl.transport.wire import register_struct


def _check_range(name: str, value: Any) -> None:
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value)
            and value[0] <= value[1]):
        raise ValueError(f"{name}: expected [start, end], got {value!r}")


@register_struct(67)
@dataclass(frozen=True, kw_only=True, slots=True)
class RangeLayout:
    """A flat-range trainer's layout (reshard_layout): the extent, and every rank's
    [start, end) per state (each rank reports the whole layout; rank r reads [r])."""
    total_numel: int
    ranges: dict[str, list[list[int]]]

    def __post_init__(self) -> None:
        if not isinstance(self.total_numel, int) or self.total_numel < 0:
            raise ValueError(f"total_numel: expected a count, got {self.total_numel!r}")
        if not isinstance(self.ranges, dict) or not all(isinstance(r, list) for r in self.ranges.values()):
            raise ValueError(f"ranges: expected a list of ranges per state, got {self.ranges!r}")
        for state, ranks in self.ranges.items():
            for r in ranks:
                _check_range(f"ranges[{state!r}]", r)


@register_struct(68)
@dataclass(frozen=True, kw_only=True, slots=True)
class BoxLayout:
    """A boxes trainer's layout (reshard_layout, collective over a model-parallel world):
    the extent; the trainer's own layout (megatron/layout.py ShardedLayout.to_wire,
    read only by the trainer ranks it is handed back to: reshard_send_boxes and
    reshard_recv_boxes); the state kinds it carries ("param", the optimizer moments,
    sorted) and the optimizer's counters ("adam_step")."""
    total_numel: int
    layout: dict[str, Any]
    kinds: list[str]
    scalars: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.total_numel, int) or self.total_numel < 0:
            raise ValueError(f"total_numel: expected a count, got {self.total_numel!r}")
        if not isinstance(self.layout, dict):
            raise ValueError(f"layout: expected the trainer's layout, got {self.layout!r}")


ReshardLayout = RangeLayout | BoxLayout


@register_struct(69)
@dataclass(frozen=True, kw_only=True, slots=True)
class RangeDigest:
    """A flat-range rank's state (state_digest; reshard_install's confirmation): its
    [start, end), its optimizer step and per state what stands in for a sum (its
    element count: an emulated state is sizes)."""
    range: list[int]
    step: int
    sums: dict[str, float]

    def __post_init__(self) -> None:
        _check_range("range", self.range)
        if not isinstance(self.step, int):
            raise ValueError(f"step: expected an int, got {self.step!r}")


@register_struct(70)
@dataclass(frozen=True, kw_only=True, slots=True)
class BoxDigest:
    """A boxes rank's state (state_digest; reshard_install's confirmation): the
    elements it holds as the one copy of (replica 0), its optimizer step, per state
    kind a float64 sum of those elements, and the optimizer's counters."""
    owned: int
    step: int
    sums: dict[str, float]
    scalars: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("owned", "step"):
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"{name}: expected an int, got {getattr(self, name)!r}")


StateDigest = RangeDigest | BoxDigest


@register_struct(71)
@dataclass(frozen=True, kw_only=True, slots=True)
class FullState:
    """A rank's whole state shard (full_state), by key: boxes, its tensors (tests
    compare them bitwise); flat ranges, its sizes per state, and `range` its
    [start, end) (None: boxes)."""
    step: int
    state: dict[str, Any]
    range: list[int] | None = None

    def __post_init__(self) -> None:
        if self.range is not None:
            _check_range("range", self.range)
