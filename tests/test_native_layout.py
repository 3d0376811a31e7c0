NUM_GPUS = 0
"""The native trainer's FSDP2 layout (components/trainer/native/layout.py): each
parameter's dim-0 rows per rank as torch.chunk splits them, in the box terms the P2P
reshard planner reads; and the plan between two DP sizes copies every element once."""

import pytest
import torch
from hypothesis import given, strategies as st

from dynarl.components.trainer.megatron.layout import plan_copies
from dynarl.components.trainer.native.layout import dim0_rows, fsdp_layout


@pytest.mark.parametrize("rows, world, expected", [
    pytest.param(10, 3, [(0, 4), (4, 8), (8, 10)], id="ceil_chunks_last_short"),
    pytest.param(8, 4, [(0, 2), (2, 4), (4, 6), (6, 8)], id="even"),
    pytest.param(3, 4, [(0, 1), (1, 2), (2, 3), (3, 3)], id="last_rank_empty"),
    pytest.param(5, 4, [(0, 2), (2, 4), (4, 5), (5, 5)], id="short_then_empty"),
    pytest.param(7, 1, [(0, 7)], id="one_rank"),
])
def test_dim0_rows_table(rows, world, expected):
    assert [dim0_rows(rows, r, world) for r in range(world)] == expected


@given(rows=st.integers(1, 300), world=st.integers(1, 9))
def test_dim0_rows_are_torch_chunk(rows, world):
    chunks = torch.arange(rows).chunk(world)
    got = [dim0_rows(rows, r, world) for r in range(world)]
    assert [(int(c[0]), int(c[-1]) + 1) for c in chunks] == [g for g in got if g[1] > g[0]]


def test_layout_boxes_tile_each_parameter_and_skip_empty_chunks():
    layout = fsdp_layout([("w", (5, 3), "float32"), ("b", (3,), "float32")], 4)
    assert [p.offset for p in layout.params] == [0, 15] and layout.total_numel == 18
    assert [[(p.key, p.offset, p.shape) for p in rank] for rank in layout.pieces] == [
        [("w", (0, 0), (2, 3)), ("b", (0,), (1,))],
        [("w", (2, 0), (2, 3)), ("b", (1,), (1,))],
        [("w", (4, 0), (1, 3)), ("b", (2,), (1,))],
        [],
    ]
    with pytest.raises(ValueError, match="no dimension"):
        fsdp_layout([("s", (), "float32")], 2)


@pytest.mark.parametrize("old, new", [(2, 1), (1, 2), (2, 3), (3, 2), (4, 3)])
def test_a_plan_between_dp_sizes_fills_every_new_element_once(old, new):
    params = [("w", (7, 4), "float32"), ("b", (3,), "float32"), ("e", (1, 2), "float32")]
    a, b = fsdp_layout(params, old), fsdp_layout(params, new)
    copies = plan_copies(a, b)
    filled = {}
    for c in copies:
        box = c.dst_box
        for row in range(*box[0]):
            key = (c.dst_rank, c.key, row)
            filled[key] = filled.get(key, 0) + (box[1][1] - box[1][0] if len(box) > 1 else 1)
    for rank, pieces in enumerate(b.pieces):
        for p in pieces:
            width = p.shape[1] if len(p.shape) > 1 else 1
            assert all(filled.get((rank, p.key, r)) == width for r in range(p.shape[0])), (rank, p.key)
    assert sum(c.numel for c in copies) == a.total_numel
