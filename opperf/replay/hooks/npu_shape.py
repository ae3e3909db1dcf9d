"""NPU hook: memory and shape kernels whose arguments live in the shapes (Slice, PadV3, Transpose, Cast,
Index, GatherV2, MaskedFill, ArgMaxV2, ScatterNdUpdate).

These kernels take their configuration (offsets, paddings, permutation, axis, target dtype) as small
tensors or attributes the profiler records only as shapes; the builders read it back from the input
and output shapes. Where two configurations give the same shapes (a permutation of equal dims), the
first one in order is used and named in the trace: the kernel's work is the same.
"""

from __future__ import annotations

import itertools

import torch

from opperf.replay.hooks.npu_common import NpuCall, Slots, hook_entry_points, numel
from opperf.replay.inputs import BuildContext


def _slice(ctx: BuildContext) -> NpuCall:
    """torch_npu.npu_slice(x, offsets, size): the size is the output shape, offsets start at 0."""
    slots = Slots(ctx)
    shape, out = slots.require(0, "x"), slots.require_output(0, "y")
    if len(out) != len(shape) or any(o > s for o, s in zip(out, shape)):
        raise ctx.error(f"output {out} is not a slice of input {shape}")
    return slots.call("torch_npu.npu_slice", (slots.tensor(0, "x"), [0] * len(shape), list(out)))


def _pad(ctx: BuildContext) -> NpuCall:
    """torch.nn.functional.pad(x, pad): each dimension padded at its end by output - input."""
    slots = Slots(ctx)
    shape, out = slots.require(0, "x"), slots.require_output(0, "y")
    if len(out) != len(shape) or any(o < s for o, s in zip(out, shape)):
        raise ctx.error(f"output {out} is not a padding of input {shape}")
    pad: list[int] = []
    for before, after in zip(reversed(shape), reversed(out)):
        pad += [0, after - before]
    while len(pad) > 2 and pad[-2:] == [0, 0]:
        pad = pad[:-2]
    return slots.call("torch.nn.functional.pad", (slots.tensor(0, "x"), pad), notes=f"pad={pad}")


def _transpose(ctx: BuildContext) -> NpuCall:
    """torch_npu.npu_transpose(x, perm): the permutation that maps the input shape onto the output shape."""
    slots = Slots(ctx)
    shape, out = slots.require(0, "x"), slots.require_output(0, "y")
    identity = tuple(range(len(shape)))
    candidates = [p for p in itertools.permutations(identity) if tuple(shape[i] for i in p) == tuple(out)]
    moving = [p for p in candidates if p != identity]
    if not moving:
        raise ctx.error(f"no non-trivial permutation maps input {shape} onto output {out}")
    perm = list(moving[0])
    notes = f"perm={perm}" + (f" (one of {len(moving)} with these shapes)" if len(moving) > 1 else "")
    return slots.call("torch_npu.npu_transpose", (slots.tensor(0, "x"), perm), {"require_contiguous": True},
                      notes=notes)


def _cast(ctx: BuildContext) -> NpuCall:
    """torch_npu.npu_dtype_cast(x, dtype): the target dtype is the output's."""
    slots = Slots(ctx)
    return slots.call("torch_npu.npu_dtype_cast", (slots.tensor(0, "x"), slots.output_dtype(0)))


def _index(ctx: BuildContext) -> NpuCall:
    """aten.index.Tensor(x, [indices...]).

    aclnnIndex rows are `x; indexed_sizes; indexed_strides; index_0; ...` (the sizes/strides slots are
    the kernel's own metadata); rows of two slots are `x; index`. Index i addresses dimension i.
    """
    slots = Slots(ctx)
    shape = slots.require(0, "x")
    first_index = 3 if slots.count >= 4 else 1
    index_slots = [i for i in range(first_index, slots.count) if slots.shape(i) is not None]
    if not index_slots or len(index_slots) > len(shape):
        raise ctx.error(f"found {len(index_slots)} index tensors for an input of rank {len(shape)}")
    indices = [slots.index(slot, f"index_{dim}", shape[dim]) for dim, slot in enumerate(index_slots)]
    return slots.call("torch.ops.aten.index.Tensor", (slots.tensor(0, "x"), indices))


def _gather(ctx: BuildContext) -> NpuCall:
    """GatherV2(x, indices, axis): index_select along the axis the output shape reveals (embedding for N-D ids)."""
    slots = Slots(ctx)
    shape, index_shape = slots.require(0, "x"), slots.require(1, "indices")
    out = slots.require_output(0, "y")
    axes = [d for d in range(len(shape)) if tuple(out) == shape[:d] + index_shape + shape[d + 1:]]
    if not axes:
        raise ctx.error(f"output {out} is not input {shape} gathered along any axis with indices {index_shape}")
    axis = axes[0]
    indices = slots.index(1, "indices", shape[axis])
    x = slots.tensor(0, "x")
    if len(index_shape) == 1:
        return slots.call("torch.index_select", (x, axis, indices), notes=f"axis={axis}")
    if axis == 0 and len(shape) == 2:
        return slots.call("torch.nn.functional.embedding", (indices, x), notes="axis=0, N-D indices")
    raise ctx.error(f"gathering N-D indices {index_shape} along axis {axis} of a rank-{len(shape)} input "
                    "has no single-kernel torch equivalent")


def _masked_fill(ctx: BuildContext) -> NpuCall:
    """torch.masked_fill(x, mask, value): the value slot (a one-element tensor) if recorded, else 0."""
    slots = Slots(ctx)
    slots.require(0, "x")
    slots.require(1, "mask")
    x = slots.tensor(0, "x")
    mask = slots.tensor(1, "mask", dtype=torch.bool)
    value_shape = slots.shape(2)
    if value_shape is not None and numel(value_shape) != 1:
        raise ctx.error(f"value slot has shape {value_shape}; masked_fill takes a one-element value")
    value = slots.tensor(2, "value", shape=()) if value_shape is not None else 0.0
    return slots.call("torch.masked_fill", (x, mask, value))


def _argmax(ctx: BuildContext) -> NpuCall:
    """torch.argmax(x, dim): the dimension missing from the output shape (keepdim when it is kept as 1)."""
    slots = Slots(ctx)
    shape, out = slots.require(0, "x"), slots.output_shape(0) or ()
    dims = [d for d in range(len(shape)) if tuple(out) == shape[:d] + shape[d + 1:]]
    keepdim = False
    if not dims:
        dims = [d for d in range(len(shape)) if tuple(out) == shape[:d] + (1,) + shape[d + 1:]]
        keepdim = True
    if not dims:
        raise ctx.error(f"output {out} is not input {shape} reduced along one dimension")
    dim = dims[-1]
    return slots.call("torch.argmax", (slots.tensor(0, "x"),), {"dim": dim, "keepdim": keepdim}, notes=f"dim={dim}")


def _scatter_nd_update(ctx: BuildContext) -> NpuCall:
    """torch_npu.npu_scatter_nd_update(var, indices, updates): distinct, in-bounds target positions."""
    slots = Slots(ctx)
    var_shape, index_shape = slots.require(0, "var"), slots.require(1, "indices")
    slots.require(2, "updates")
    depth = index_shape[-1]
    if depth > len(var_shape):
        raise ctx.error(f"indices address {depth} dimensions of a rank-{len(var_shape)} var")
    positions = numel(index_shape[:-1])
    space = numel(var_shape[:depth])
    if positions > space:
        raise ctx.error(f"{positions} distinct positions do not fit in var's first {depth} dims {var_shape[:depth]}")
    flat = torch.randperm(space, generator=ctx.generator)[:positions]
    coordinates = torch.stack(torch.unravel_index(flat, var_shape[:depth]), dim=-1) if depth else flat[:, None]
    indices = slots.record(1, coordinates.reshape(index_shape).to(slots.dtype(1)).to(ctx.device))
    return slots.call("torch_npu.npu_scatter_nd_update", (slots.tensor(0, "var"), indices,
                                                          slots.tensor(2, "updates")))


_BUILDERS = {
    "Slice": _slice,
    "PadV3": _pad,
    "Transpose": _transpose,
    "Cast": _cast,
    "Index": _index,
    "GatherV2": _gather,
    "MaskedFill": _masked_fill,
    "ArgMaxV2": _argmax,
    "ScatterNdUpdate": _scatter_nd_update,
}

build_call, build_case = hook_entry_points(_BUILDERS)
