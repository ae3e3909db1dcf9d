"""Rotary position embedding kernels, with heads and rotary dim from the target models.

`model.rope` gives (heads, rotary dim) per rank for the query and the key tensors (MLA: the shared k_pe,
one head, qk_rope_head_dim); token counts T come from the `tokens` grid.

- interleave (InterleaveRope, torch_npu.npu_interleave_rope): x (T,heads,1,d), cos (T,1,1,d), sin (T,1,1,d)
  → (T,heads,1,d).
- rotary_mul (RotaryMul, torch_npu.npu_rotary_mul, BSND): x (1,T,heads,d), cos (1,T,1,d), sin (1,T,1,d)
  → (1,T,heads,d).
"""

from __future__ import annotations

from collections.abc import Iterator

from opperf.grid.candidates import Candidate
from opperf.grid.generators.base import Generator, ParamSpec
from opperf.grid.values import ValueGrids

LAYOUTS = ("interleave", "rotary_mul")


def rope(params: dict, grids: ValueGrids) -> Iterator[Candidate]:
    layout = params["layout"]
    for heads, dim in grids.values("model.rope", field=f"generator rope ({layout})"):
        for t in grids.tokens:
            if layout == "interleave":
                x, table = (t, heads, 1, dim), (t, 1, 1, dim)
            else:
                x, table = (1, t, heads, dim), (1, t, 1, dim)
            yield Candidate((x, table, table), (x,))


GENERATORS = [Generator("rope", {"layout": ParamSpec(LAYOUTS, "interleave")}, rope)]
