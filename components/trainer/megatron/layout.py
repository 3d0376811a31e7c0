"""Where each piece of a model-parallel trainer's weights lives, and which boxes must
be copied from which old rank to which new one when the layout changes (TP/PP/DP).

Plain Python, no torch: the P2P reshard planner reads this like it reads the native
trainer's StateLayout. The vocabulary is the same: `params` are ParamSpecs tiling
one flat space [0, total_numel) in order; they describe *global* (unsharded)
tensors, named by their megatron dist_checkpointing key, so both layouts of a
reshard name the same tensors. What a rank holds is not one flat range (a
row-parallel slice is strided) but boxes in global coordinates, the ShardedTensor
offsets of megatron's sharded_state_dict. `flat_runs` turns a box into StateLayout-
style [start, end) ranges when a planner wants bytes in the flat space.

`to_shards`/`extents` give the replica-0 boxes in core/reshard_plan.py's terms, so
its plan_reshard works on a megatron layout unchanged; `plan_copies` also fills the
replicas (every new rank gets its own copy), in local parameter coordinates.

megatron's distributed optimizer keeps each local parameter's optimizer state
(main weights, Adam moments) sharded over data parallel: a rank holds a flat range
of the parameter (`FlatRange`), not boxes. `range_boxes` cuts such a range into
boxes, each one contiguous run, and `state_pieces` turns them into global Pieces;
the layout then carries a second geometry (`state`, with `flat`) beside the
weights', and `plan_copies` plans the state on it the same way.

A box may have leading axes that its parameter lacks (megatron stacks layers: key
"decoder.layers.mlp.linear_fc2.weight" has shape [num_layers, hidden, ffn], a layer
holds a [1, hidden, ffn/tp] box). Those axes have extent 1 in the box.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from dynarl.core.reshard_plan import Shard

from dynarl.components.trainer.base import ParamSpec, check_param_offsets

WEIGHTS = "param"
"""The state kind of the weights themselves; every other kind is optimizer state."""

Box = tuple[tuple[int, int], ...]
"""[start, stop) per dimension."""


@dataclass(slots=True, frozen=True)
class Piece:
    """A box of a global tensor that one rank holds: a view of one local parameter."""
    key: str
    """The global tensor (ParamSpec.name)."""
    offset: tuple[int, ...]
    """Global coordinates of the box's first element."""
    shape: tuple[int, ...]
    """Extent of the box in each global dimension."""
    replica: int
    """0: the copy plans read from; > 0: an identical copy (data parallel, or a tensor
    every TP rank holds whole, such as a norm)."""
    param: str
    """Name of the local parameter the box is part of."""
    param_offset: tuple[int, ...]
    """Where the box starts inside that parameter (the parameter's own dimensions)."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def param_box(self) -> "Box":
        """The whole box in its local parameter's coordinates."""
        return _to_param(tuple((o, o + e) for o, e in zip(self.offset, self.shape)), self)

    def to_wire(self) -> list[Any]:
        return [self.key, list(self.offset), list(self.shape), self.replica, self.param, list(self.param_offset)]

    @classmethod
    def from_wire(cls, w: list[Any]) -> "Piece":
        key, offset, shape, replica, param, param_offset = w
        return cls(key, tuple(offset), tuple(shape), replica, param, tuple(param_offset))


@dataclass(slots=True, frozen=True)
class BoxCopy:
    """Copy src_rank's src_param[src_box] into dst_rank's dst_param[dst_box]."""
    key: str
    src_rank: int
    src_param: str
    src_box: Box
    dst_rank: int
    dst_param: str
    dst_box: Box

    @property
    def numel(self) -> int:
        return math.prod(stop - start for start, stop in self.dst_box)


@dataclass(slots=True, frozen=True)
class FlatRange:
    """The flat range [start, end) of one local parameter (shape `shape`, row-major)
    whose optimizer state a rank holds: megatron's distributed optimizer gives each
    data-parallel rank one such range of each parameter (possibly empty)."""
    param: str
    start: int
    end: int
    shape: tuple[int, ...]

    def to_wire(self) -> list[Any]:
        return [self.param, self.start, self.end, list(self.shape)]

    @classmethod
    def from_wire(cls, w: list[Any]) -> "FlatRange":
        param, start, end, shape = w
        return cls(param, start, end, tuple(shape))


@dataclass(slots=True)
class ShardedLayout:
    params: tuple[ParamSpec, ...]
    total_numel: int
    world_size: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    pieces: tuple[tuple[Piece, ...], ...]
    """pieces[rank]: every box that rank holds, replicas included."""
    state: tuple[tuple[Piece, ...], ...] = ()
    """The optimizer state's boxes per rank when it is sharded apart from the weights
    (megatron's distributed optimizer); empty: the state has the weights' geometry."""
    flat: tuple[tuple[FlatRange, ...], ...] = ()
    """With `state`: per rank, the flat range of each local parameter it holds state of
    (its state tensors are 1-D, that range's elements)."""
    _flat_index: dict[tuple[int, str], FlatRange] = field(default_factory=dict, init=False, repr=False,
                                                          compare=False)

    def __post_init__(self) -> None:
        self.params = tuple(self.params)
        self.pieces = tuple(tuple(p) for p in self.pieces)
        self.state = tuple(tuple(p) for p in self.state)
        self.flat = tuple(tuple(f) for f in self.flat)
        if len(self.pieces) != self.world_size:
            raise ValueError(f"pieces has {len(self.pieces)} ranks for world_size {self.world_size}")
        if (self.state or self.flat) and (len(self.state) != self.world_size or len(self.flat) != self.world_size):
            raise ValueError(f"state has {len(self.state)} ranks and flat {len(self.flat)} for world_size "
                             f"{self.world_size}")
        self._flat_index = {(rank, f.param): f for rank, ranges in enumerate(self.flat) for f in ranges}
        if self.world_size % (self.tensor_parallel_size * self.pipeline_parallel_size):
            raise ValueError(f"world_size {self.world_size} is not a multiple of tp*pp = "
                             f"{self.tensor_parallel_size * self.pipeline_parallel_size}")
        check_param_offsets(self.params, self.total_numel)
        self._check_coverage(self.pieces)
        if self.state:
            self._check_coverage(self.state)

    def state_layout(self) -> "ShardedLayout":
        """The optimizer state's geometry as a layout of its own (itself if the state has
        the weights' geometry): plan_copies on two of these plans the state."""
        if not self.state:
            return self
        return ShardedLayout(self.params, self.total_numel, self.world_size, self.tensor_parallel_size,
                             self.pipeline_parallel_size, self.state)

    def geometry(self, kind: str) -> "ShardedLayout":
        """The boxes that state `kind` is held in: the weights' for WEIGHTS, else the
        optimizer state's."""
        return self if kind == WEIGHTS else self.state_layout()

    def flat_range(self, rank: int, kind: str, param: str) -> FlatRange | None:
        """Where `rank` keeps `kind` of `param`: None for the weights and for state of the
        weights' geometry (the whole parameter); else the flat range it holds."""
        if kind == WEIGHTS or not self.state:
            return None
        if (rank, param) not in self._flat_index:
            raise KeyError(f"rank {rank} holds no state range of {param!r}")
        return self._flat_index[(rank, param)]

    @property
    def data_parallel_size(self) -> int:
        return self.world_size // (self.tensor_parallel_size * self.pipeline_parallel_size)

    def spec(self, key: str) -> ParamSpec:
        return self._specs()[key]

    def _specs(self) -> dict[str, ParamSpec]:
        return {p.name: p for p in self.params}

    def _check_coverage(self, all_pieces: tuple[tuple[Piece, ...], ...]) -> None:
        """Every global tensor is tiled exactly once by the replica-0 boxes, and every
        box lies inside its tensor: a plan then reads each element from one place."""
        specs = self._specs()
        main: dict[str, list[Piece]] = {name: [] for name in specs}
        for rank, pieces in enumerate(all_pieces):
            for piece in pieces:
                spec = specs.get(piece.key)
                if spec is None:
                    raise ValueError(f"rank {rank} holds {piece.key!r}, which is not in params")
                if len(piece.offset) != len(spec.shape) or len(piece.shape) != len(spec.shape) or any(
                        o < 0 or e < 1 or o + e > s for o, e, s in zip(piece.offset, piece.shape, spec.shape)):
                    raise ValueError(f"rank {rank}: box {piece.offset}+{piece.shape} is outside "
                                     f"{piece.key} {spec.shape}")
                if piece.replica == 0:
                    main[piece.key].append(piece)
        for name, boxes in main.items():
            covered = sum(b.numel for b in boxes)
            if covered != specs[name].numel:
                raise ValueError(f"replica-0 boxes of {name} cover {covered} of {specs[name].numel} elements")
            for i, a in enumerate(boxes):
                for b in boxes[i + 1:]:
                    if _intersect(a, b) is not None:
                        raise ValueError(f"replica-0 boxes of {name} overlap: {a.offset} and {b.offset}")

    def flat_runs(self, piece: Piece) -> list[tuple[int, int]]:
        """The box as [start, end) ranges of the flat space (row-major), merged where contiguous."""
        spec = self.spec(piece.key)
        shape, strides = spec.shape, [math.prod(spec.shape[d + 1:]) for d in range(len(spec.shape))]
        # j = the last dimension the box does not span fully; everything inside it is one run
        j = len(shape) - 1
        while j >= 0 and piece.shape[j] == shape[j]:
            j -= 1
        if j < 0:
            return [(spec.offset, spec.offset + spec.numel)]
        run = piece.shape[j] * strides[j]
        runs: list[tuple[int, int]] = []
        for index in itertools.product(*(range(piece.shape[d]) for d in range(j))):
            start = spec.offset + piece.offset[j] * strides[j]
            start += sum((piece.offset[d] + i) * strides[d] for d, i in enumerate(index))
            if runs and runs[-1][1] == start:
                runs[-1] = (runs[-1][0], start + run)
            else:
                runs.append((start, start + run))
        return runs

    def to_shards(self, prefix: str = "") -> list[Shard]:
        """The replica-0 boxes as core.reshard_plan Shards (keys prefixed, e.g. "exp_avg/"
        for optimizer state of the same geometry): each element once, as plan_reshard
        requires. Replicas are not in it; plan_copies covers them too."""
        return [Shard(prefix + p.key, rank, p.offset, p.shape)
                for rank, pieces in enumerate(self.pieces) for p in pieces if p.replica == 0]

    def extents(self, prefix: str = "") -> dict[str, tuple[int, ...]]:
        return {prefix + p.name: p.shape for p in self.params}

    def to_wire(self) -> dict[str, Any]:
        return {"params": [[p.name, list(p.shape), p.dtype, p.offset] for p in self.params],
                "total_numel": self.total_numel, "world_size": self.world_size,
                "tensor_parallel_size": self.tensor_parallel_size,
                "pipeline_parallel_size": self.pipeline_parallel_size,
                "pieces": [[p.to_wire() for p in rank] for rank in self.pieces],
                "state": [[p.to_wire() for p in rank] for rank in self.state],
                "flat": [[f.to_wire() for f in rank] for rank in self.flat]}

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "ShardedLayout":
        return cls(params=tuple(ParamSpec(n, tuple(s), dt, o) for n, s, dt, o in d["params"]),
                   total_numel=d["total_numel"], world_size=d["world_size"],
                   tensor_parallel_size=d["tensor_parallel_size"],
                   pipeline_parallel_size=d["pipeline_parallel_size"],
                   pieces=tuple(tuple(Piece.from_wire(p) for p in rank) for rank in d["pieces"]),
                   state=tuple(tuple(Piece.from_wire(p) for p in rank) for rank in d.get("state", ())),
                   flat=tuple(tuple(FlatRange.from_wire(f) for f in rank) for rank in d.get("flat", ())))


def plan_copies(old: ShardedLayout, new: ShardedLayout) -> list[BoxCopy]:
    """Every copy that fills each new rank's boxes (replicas included) from the old
    ranks' replica-0 boxes. Raises ValueError if the two layouts describe different tensors."""
    old_specs, new_specs = old._specs(), new._specs()
    if {k: s.shape for k, s in old_specs.items()} != {k: s.shape for k, s in new_specs.items()}:
        diff = sorted(set(old_specs.items()) ^ set(new_specs.items()), key=lambda kv: kv[0])[:2]
        raise ValueError(f"layouts describe different tensors, e.g. {diff}")
    sources: dict[str, list[tuple[int, Piece]]] = {}
    for rank, pieces in enumerate(old.pieces):
        for piece in pieces:
            if piece.replica == 0:
                sources.setdefault(piece.key, []).append((rank, piece))
    copies: list[BoxCopy] = []
    for dst_rank, pieces in enumerate(new.pieces):
        for dst in pieces:
            for src_rank, src in sources[dst.key]:
                box = _intersect(src, dst)
                if box is not None:
                    copies.append(BoxCopy(dst.key, src_rank, src.param, _to_param(box, src), dst_rank, dst.param,
                                          _to_param(box, dst)))
    return copies


def _intersect(a: Piece, b: Piece) -> Box | None:
    box = []
    for ao, ae, bo, be in zip(a.offset, a.shape, b.offset, b.shape):
        lo, hi = max(ao, bo), min(ao + ae, bo + be)
        if lo >= hi:
            return None
        box.append((lo, hi))
    return tuple(box)


def box_slices(box: Box) -> tuple[slice, ...]:
    """The box as an index into a tensor."""
    return tuple(slice(lo, hi) for lo, hi in box)


def range_boxes(shape: tuple[int, ...], start: int, end: int) -> list[Box]:
    """The elements [start, end) of a row-major tensor of `shape` as boxes, in order,
    each one contiguous run (a partial row, whole rows, a partial row)."""
    if start >= end:
        return []
    if not shape:
        return [()]
    if len(shape) == 1:
        return [((start, end),)]
    inner = math.prod(shape[1:])
    first, last = start // inner, (end - 1) // inner
    if first == last:
        return [((first, first + 1), *b) for b in range_boxes(shape[1:], start - first * inner, end - first * inner)]
    boxes: list[Box] = []
    if start % inner:
        boxes += [((first, first + 1), *b) for b in range_boxes(shape[1:], start % inner, inner)]
        first += 1
    whole_end = last + 1 if end % inner == 0 else last
    if whole_end > first:
        boxes.append(((first, whole_end), *((0, n) for n in shape[1:])))
    if end % inner:
        boxes += [((last, last + 1), *b) for b in range_boxes(shape[1:], 0, end % inner)]
    return boxes


def state_pieces(pieces: list[Piece], ranges: Mapping[str, FlatRange], mp_replica: Mapping[int, int]) -> list[Piece]:
    """One rank's optimizer-state boxes when it holds a flat range of each local
    parameter (`ranges`, by parameter): each weight piece cut to the range's boxes.
    `mp_replica[i]` is pieces[i]'s replica index leaving data parallel out (the state
    of a norm every TP rank holds whole is a replica there too; over data parallel
    each element has one holder)."""
    out: list[Piece] = []
    for i, piece in enumerate(pieces):
        fr = ranges[piece.param]
        whole = piece.param_box
        for box in range_boxes(fr.shape, fr.start, fr.end):
            cut = tuple((max(a, c), min(b, d)) for (a, b), (c, d) in zip(whole, box))
            if any(lo >= hi for lo, hi in cut):
                continue
            lead = len(piece.offset) - len(piece.param_offset)
            offset = piece.offset[:lead] + tuple(
                piece.offset[lead + d] + lo - piece.param_offset[d] for d, (lo, _) in enumerate(cut))
            out.append(Piece(piece.key, offset, piece.shape[:lead] + tuple(hi - lo for lo, hi in cut),
                             mp_replica[i], piece.param, tuple(lo for lo, _ in cut)))
    return out


def _to_param(box: Box, piece: Piece) -> Box:
    """A global box inside `piece`, in the coordinates of piece's parameter (the
    leading axes the parameter lacks have extent 1 and are dropped)."""
    lead = len(piece.offset) - len(piece.param_offset)
    out = []
    for d in range(lead, len(box)):
        shift = piece.param_offset[d - lead] - piece.offset[d]
        out.append((box[d][0] + shift, box[d][1] + shift))
    return tuple(out)

