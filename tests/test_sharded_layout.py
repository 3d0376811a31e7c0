NUM_GPUS = 0
"""ShardedLayout and plan_copies on hand-written layouts (plain data, no megatron):
a column-parallel, a row-parallel, a replicated and a layer-stacked tensor moved from
TP=2 to TP=1 x DP=2, executed on tensors; and the distributed optimizer's state,
a flat range of each parameter per DP rank (range_boxes, state_pieces, box_view)."""
import math

import msgpack
import pytest
import torch

from dynarl.components.trainer.base import ParamSpec
from dynarl.components.trainer.megatron.layout import FlatRange, Piece, ShardedLayout, plan_copies, range_boxes, state_pieces
from dynarl.components.trainer.megatron.sharded_state import apply_copies, box_view

SHAPES = {"col": (4, 3), "row": (3, 4), "norm": (3,), "stack": (2, 2, 2)}


def specs():
    out, offset = [], 0
    for name, shape in SHAPES.items():
        out.append(ParamSpec(name, shape, "float32", offset))
        offset += out[-1].numel
    return tuple(out), offset


def tp2_pieces(rank):
    return (Piece("col", (2 * rank, 0), (2, 3), 0, "col", (0, 0)),
            Piece("row", (0, 2 * rank), (3, 2), 0, "row", (0, 0)),
            Piece("norm", (0,), (3,), rank, "norm", (0,)),
            # two layers stacked on a leading axis; each layer's parameter is [1, 2], TP cuts dim 1
            *(Piece("stack", (layer, rank, 0), (1, 1, 2), 0, f"layers.{layer}", (0, 0)) for layer in range(2)))


def tp1_pieces(rank):
    return (Piece("col", (0, 0), (4, 3), rank, "col", (0, 0)),
            Piece("row", (0, 0), (3, 4), rank, "row", (0, 0)),
            Piece("norm", (0,), (3,), rank, "norm", (0,)),
            *(Piece("stack", (layer, 0, 0), (1, 2, 2), rank, f"layers.{layer}", (0, 0)) for layer in range(2)))


def layout(pieces, tp):
    params, total = specs()
    return ShardedLayout(params=params, total_numel=total, world_size=2, tensor_parallel_size=tp,
                         pipeline_parallel_size=1, pieces=pieces)


def full_tensors():
    torch.manual_seed(0)
    return {name: torch.randn(shape) for name, shape in SHAPES.items()}


def local_tp2(full, rank):
    return {"col": full["col"][2 * rank:2 * rank + 2].clone(), "row": full["row"][:, 2 * rank:2 * rank + 2].clone(),
            "norm": full["norm"].clone(),
            **{f"layers.{layer}": full["stack"][layer, rank:rank + 1].clone() for layer in range(2)}}


def test_tp2_to_tp1_plan_rebuilds_every_rank_exactly():
    old = layout([tp2_pieces(r) for r in range(2)], tp=2)
    new = layout([tp1_pieces(r) for r in range(2)], tp=1)
    assert new.data_parallel_size == 2
    full = full_tensors()
    copies = plan_copies(old, new)
    for rank in range(2):
        dst = {"col": torch.zeros(4, 3), "row": torch.zeros(3, 4), "norm": torch.zeros(3),
               **{f"layers.{layer}": torch.zeros(2, 2) for layer in range(2)}}
        moved = apply_copies(copies, {r: local_tp2(full, r) for r in range(2)}, rank, dst)
        assert moved == sum(t.numel() for t in dst.values())
        assert torch.equal(dst["col"], full["col"]) and torch.equal(dst["row"], full["row"])
        assert torch.equal(dst["norm"], full["norm"])
        assert all(torch.equal(dst[f"layers.{layer}"], full["stack"][layer]) for layer in range(2))
    # the replicated norm is read from rank 0 only (replica 0), once per destination rank
    assert [c.src_rank for c in copies if c.key == "norm"] == [0, 0]


def test_tp1_to_tp2_reads_only_replica_zero():
    old = layout([tp1_pieces(r) for r in range(2)], tp=1)
    new = layout([tp2_pieces(r) for r in range(2)], tp=2)
    assert {c.src_rank for c in plan_copies(old, new)} == {0}


def test_flat_runs_are_state_layout_ranges():
    lay = layout([tp2_pieces(r) for r in range(2)], tp=2)
    row = lay.spec("row").offset
    assert lay.flat_runs(tp2_pieces(1)[1]) == [(row + 2, row + 4), (row + 6, row + 8), (row + 10, row + 12)]
    assert lay.flat_runs(tp2_pieces(1)[0]) == [(6, 12)]  # rows 2-3 of col: one run
    assert lay.flat_runs(tp2_pieces(0)[2]) == [(lay.spec("norm").offset, lay.spec("norm").offset + 3)]


@pytest.mark.parametrize("mutate, message", [
    pytest.param(lambda p: (p[0][:1] + (Piece("col", (1, 0), (2, 3), 0, "col", (0, 0)),) + p[0][1:], p[1]),
                 "overlap|cover", id="overlap"),
    pytest.param(lambda p: (p[0][1:], p[1]), "cover 6 of 12", id="gap"),
    pytest.param(lambda p: ((Piece("col", (3, 0), (2, 3), 0, "col", (0, 0)),) + p[0][1:], p[1]), "outside",
                 id="outside"),
    pytest.param(lambda p: ((Piece("nope", (0,), (1,), 0, "x", (0,)),) + p[0], p[1]), "not in params",
                 id="unknown-tensor"),
])
def test_bad_layouts_are_refused(mutate, message):
    with pytest.raises(ValueError, match=message):
        layout(mutate((tp2_pieces(0), tp2_pieces(1))), tp=2)


def test_plans_need_the_same_tensors():
    old = layout([tp2_pieces(r) for r in range(2)], tp=2)
    params, total = specs()
    other = ShardedLayout(params=params[:1], total_numel=12, world_size=1, tensor_parallel_size=1,
                          pipeline_parallel_size=1, pieces=[[Piece("col", (0, 0), (4, 3), 0, "col", (0, 0))]])
    with pytest.raises(ValueError, match="different tensors"):
        plan_copies(old, other)


def test_wire_round_trip_through_msgpack():
    lay = layout([tp2_pieces(r) for r in range(2)], tp=2)
    assert ShardedLayout.from_wire(msgpack.unpackb(msgpack.packb(lay.to_wire()))) == lay


def test_core_reshard_planner_takes_the_layout_and_agrees_on_replica_zero():
    from dynarl.core.reshard_plan import plan_reshard

    old = layout([tp2_pieces(r) for r in range(2)], tp=2)
    new = layout([tp1_pieces(r) for r in range(2)], tp=1)
    transfers = plan_reshard(old.to_shards("weight/"), new.to_shards("weight/"), new.extents("weight/"))
    ours = [c for c in plan_copies(old, new) if c.dst_rank == 0]  # rank 0 holds replica 0 of everything
    assert sorted((t.key.removeprefix("weight/"), t.src, t.dst, t.numel) for t in transfers) == \
        sorted((c.key, c.src_rank, c.dst_rank, c.numel) for c in ours)


@pytest.mark.parametrize("shape,start,end,boxes", [
    ((5,), 1, 4, [((1, 4),)]),
    ((3, 4), 0, 12, [((0, 3), (0, 4))]),  # the whole tensor: one box
    ((3, 4), 2, 3, [((0, 1), (2, 3))]),  # inside one row
    ((3, 4), 2, 10, [((0, 1), (2, 4)), ((1, 2), (0, 4)), ((2, 3), (0, 2))]),  # head, whole rows, tail
    ((3, 4), 4, 12, [((1, 3), (0, 4))]),  # whole rows only
    ((2, 2, 3), 4, 11, [((0, 1), (1, 2), (1, 3)), ((1, 2), (0, 1), (0, 3)), ((1, 2), (1, 2), (0, 2))]),
    ((3, 4), 5, 5, []),  # an empty range
])
def test_range_boxes_cut_a_flat_range_into_contiguous_boxes(shape, start, end, boxes):
    assert range_boxes(shape, start, end) == boxes


def tp1_dp2_ranges(rank):
    """A distributed optimizer's split of each TP=1 parameter between two DP ranks, mid-row."""
    cuts = {"col": ((4, 3), 5), "row": ((3, 4), 7), "norm": ((3,), 1), "layers.0": ((2, 2), 3), "layers.1": ((2, 2), 1)}
    return {name: FlatRange(name, *((0, cut) if rank == 0 else (cut, math.prod(shape))), shape)
            for name, (shape, cut) in cuts.items()}


def test_the_distributed_optimizers_flat_ranges_reshard_from_tp2():
    """TP=2 (each rank the whole state of its slices) -> TP=1 x DP=2 with the state in
    flat ranges: each new rank's 1-D shards are exactly its ranges of the full tensors."""
    shapes2 = {"col": (2, 3), "row": (3, 2), "norm": (3,), "layers.0": (1, 2), "layers.1": (1, 2)}
    old_ranges = [{n: FlatRange(n, 0, math.prod(s), s) for n, s in shapes2.items()} for _ in range(2)]
    old_pieces, new_pieces = [tp2_pieces(r) for r in range(2)], [tp1_pieces(r) for r in range(2)]
    old = layout_with_state(old_pieces, 2, old_ranges, mp_replica=lambda rank, p: p.replica)
    new = layout_with_state(new_pieces, 1, [tp1_dp2_ranges(r) for r in range(2)], mp_replica=lambda rank, p: 0)
    full = full_tensors()
    sources = {r: {n: t.reshape(-1) for n, t in local_tp2(full, r).items()} for r in range(2)}
    copies = plan_copies(old.state_layout(), new.state_layout())
    for rank in range(2):
        ranges = tp1_dp2_ranges(rank)
        dest = {n: torch.full((f.end - f.start,), float("nan")) for n, f in ranges.items()}
        moved = apply_copies(copies, sources, rank, dest, old, new, kind="exp_avg")
        assert moved == sum(f.end - f.start for f in ranges.values())
        wanted = {"col": full["col"], "row": full["row"], "norm": full["norm"],
                  "layers.0": full["stack"][0], "layers.1": full["stack"][1]}
        for name, f in ranges.items():
            assert torch.equal(dest[name], wanted[name].reshape(-1)[f.start:f.end]), name


def layout_with_state(pieces, tp, ranges, mp_replica):
    base = layout(pieces, tp)
    state = [state_pieces(list(pieces[r]), ranges[r], {i: mp_replica(r, p) for i, p in enumerate(pieces[r])})
             for r in range(2)]
    return ShardedLayout(base.params, base.total_numel, 2, tp, 1, pieces, state=state,
                         flat=[tuple(ranges[r].values()) for r in range(2)])


def test_box_view_refuses_a_box_outside_the_held_range():
    shard = torch.arange(5.0)
    fr = FlatRange("w", 3, 8, (3, 4))
    assert torch.equal(box_view(shard, ((1, 2), (0, 4)), fr), torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
    with pytest.raises(ValueError, match="outside the held range"):
        box_view(shard, ((0, 1), (0, 4)), fr)
    for not_a_shard in (torch.arange(10.0)[::2], torch.zeros(1, 5), torch.zeros(4)):  # strided, 2-D, short
        with pytest.raises(ValueError, match="not a dense 1-D shard"):
            box_view(not_a_shard, ((1, 2), (0, 4)), fr)
