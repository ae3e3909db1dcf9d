"""Rotary position embedding kernels, with heads and rotary dim from the target models.

`model.rope` gives (heads, rotary dim) per rank for the query and the key tensors (MLA: the shared k_pe,
one head, qk_rope_head_dim); token counts T sweep ELEM_TOKENS_GRID.

- interleave (InterleaveRope, torch_npu.npu_interleave_rope): x (T,heads,1,d), cos (T,1,1,d), sin (T,1,1,d)
  → (T,heads,1,d).
- rotary_mul (RotaryMul, torch_npu.npu_rotary_mul, BSND): x (1,T,heads,d), cos (1,T,1,d), sin (1,T,1,d)
  → (1,T,heads,d).

Density: besides (heads, d) x T, at the sweeps' token count the heads sweep HEADS_GRID (each model's rotary
dim held) and the rotary dim sweeps HEAD_DIM_GRID (each model's query heads held).
"""

from __future__ import annotations

from collections.abc import Iterator

from opperf.grid.candidate import SWEEP, Candidate
from opperf.grid.generators.base import Generator, ParamSpec
from opperf.grid.values import ValueGrids

LAYOUTS = ("interleave", "rotary_mul")
TOKENS_AXIS, HEADS_AXIS, DIM_AXIS = "ELEM_TOKENS_GRID", "HEADS_GRID", "HEAD_DIM_GRID"


def _rope_row(layout: str, t: int, heads: int, dim: int, group, axes, users) -> Candidate:
    if layout == "interleave":
        x, table = (t, heads, 1, dim), (t, 1, 1, dim)
    else:
        x, table = (1, t, heads, dim), (1, t, 1, dim)
    return Candidate((x, table, table), (x,), (), group, axes, users)


def rope(params: dict, grids: ValueGrids) -> Iterator[Candidate]:
    layout = params["layout"]
    where = f"generator rope ({layout})"
    for heads, dim in grids.values("model.rope", field=where):
        users = grids.users("model.rope", (heads, dim))
        for t in grids.values(TOKENS_AXIS, field=where):
            yield _rope_row(layout, t, heads, dim, (("heads", heads), ("dim", dim)), (("t", TOKENS_AXIS, t),), users)
    t = grids.values("sweep_tokens", field=where)[0]
    for dim in grids.values("model.rope_dim", field=where):
        group = ((SWEEP, "heads"), ("dim", dim), ("t", t))
        for heads in grids.values(HEADS_AXIS, field=where):
            yield _rope_row(layout, t, heads, dim, group, (("heads", HEADS_AXIS, heads),),
                            grids.users("model.rope_dim", dim))
    for heads in grids.values("model.heads", field=where):
        group = ((SWEEP, "dim"), ("heads", heads), ("t", t))
        for dim in grids.values(DIM_AXIS, field=where):
            yield _rope_row(layout, t, heads, dim, group, (("dim", DIM_AXIS, dim),), grids.users("model.heads", heads))


GENERATORS = [Generator("rope", {"layout": ParamSpec(LAYOUTS, "interleave")}, rope)]
