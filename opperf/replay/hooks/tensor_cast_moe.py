"""Hook for TensorCast's MoE routing ops: rows of kernel types `MoeGatingTopK` (`tensor_cast.moe_gating_top_k_softmax`),
`MoeTokenPermute` (`tensor_cast.init_routing_v2`) and `MoeTokenUnpermute` (`tensor_cast.unpermute_tokens`), replayed
on cpu and cuda by opperf.consumer.moe_routing.

A row is one call as msmodeling's runner issues it (docs/replay.md, "TensorCast's MoE routing ops"):

- MoeGatingTopK: router logits `T,E` and an empty slot whose `Input Scalars` entry is k (`4,8;`, scalars `;2`).
- MoeTokenPermute: the tokens `1,T,H` and their expert ids `T,k` (int64); `Runtime num_experts` E.
- MoeTokenUnpermute: the routed rows `T*k,H` and the expert ids `T,k`; `Runtime num_experts` E.

msmodeling records the expert ids on the meta device, without values, and the permute and unpermute calls do not
show how many experts there are: the row says (`Runtime num_experts`), and the ids are laid as a router aims to route
(`moe_routing.balanced_expert_ids`: every expert the same share, a token's k experts distinct), which the row's
`Replay Recipe` says. Every input was just written by the op before it in the layer (the router's linear, the gating,
the experts' FFN): all warm.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from opperf import contract
from opperf.consumer.moe_routing import (RUNTIME_NUM_EXPERTS, balanced_expert_ids, init_routing_v2,
                                         moe_gating_top_k_softmax, unpermute_tokens)
from opperf.replay.hooks.tensor_cast_paged import one_range
from opperf.replay.inputs import BuildContext, ReplayCase, describe_call

_API = "opperf.consumer.moe_routing"


def build_case(row: Mapping[str, str], ctx: BuildContext) -> ReplayCase:
    kernel_type = ctx.definition.type if ctx.definition is not None else ""
    builders = {"MoeGatingTopK": _gating, "MoeTokenPermute": _permute, "MoeTokenUnpermute": _unpermute}
    if kernel_type not in builders:
        raise ctx.error(f"hook has no builder for kernel type {kernel_type!r} (it builds {sorted(builders)})", "type")
    return builders[kernel_type](ctx)


def _gating(ctx: BuildContext) -> ReplayCase:
    _slot_count(ctx, ("logits", "top_k"))
    logits = _required(ctx, 0, "logits")
    if ctx.input_shape(1) is not None:
        raise ctx.error(f"input slot 1 (top_k) holds a tensor {list(ctx.input_shape(1))}; it is the scalar k, given "
                        "in Input Scalars")
    experts, top_k = logits[-1], ctx.scalar(1)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= experts:
        raise ctx.error(f"top_k is {top_k!r}: Input Scalars' slot 1 must be an integer k from 1 to the {experts} "
                        f"experts of logits {list(logits)}", contract.INPUT_SCALARS)
    expected = (*logits[:-1], top_k)
    for index, shape in enumerate(ctx.slots.output_shapes):
        if shape is not None and tuple(shape) != expected:
            raise ctx.error(f"output {index} {list(shape)} is not the {list(expected)} of the top {top_k} of logits "
                            f"{list(logits)}", contract.OUTPUT_SHAPES)
    kwargs = {"x": ctx.tensor(logits, ctx.input_dtype(0)), "top_k": top_k}
    return ReplayCase(fn=one_range("tensor_cast::moe_gating_top_k_softmax", moe_gating_top_k_softmax, ctx.device),
                      kwargs=kwargs, description=describe_call(f"{_API}.moe_gating_top_k_softmax", (), kwargs))


def _permute(ctx: BuildContext) -> ReplayCase:
    _slot_count(ctx, ("x", "topk_indices"))
    tokens_shape, ids_shape = _required(ctx, 0, "x"), _required(ctx, 1, "topk_indices")
    tokens = math.prod(ids_shape[:-1])
    if math.prod(tokens_shape[:-1]) != tokens:
        raise ctx.error(f"x {list(tokens_shape)} holds {math.prod(tokens_shape[:-1])} tokens; topk_indices "
                        f"{list(ids_shape)} routes {tokens}")
    ids, note = _expert_ids(ctx, ids_shape)
    kwargs = {"x": ctx.tensor(tokens_shape, ctx.input_dtype(0)), "topk_indices": ids}
    return _routing_case(ctx, "init_routing_v2", init_routing_v2, kwargs, note)


def _unpermute(ctx: BuildContext) -> ReplayCase:
    _slot_count(ctx, ("x", "topk_indices"))
    rows_shape, ids_shape = _required(ctx, 0, "x"), _required(ctx, 1, "topk_indices")
    if len(rows_shape) != 2 or rows_shape[0] != math.prod(ids_shape):
        raise ctx.error(f"x {list(rows_shape)} is not the [{math.prod(ids_shape)}, hidden] rows of topk_indices "
                        f"{list(ids_shape)} (one per token and expert)")
    ids, note = _expert_ids(ctx, ids_shape)
    kwargs = {"x": ctx.tensor(rows_shape, ctx.input_dtype(0)), "topk_indices": ids}
    return _routing_case(ctx, "unpermute_tokens", unpermute_tokens, kwargs, note)


def _routing_case(ctx: BuildContext, name: str, fn, kwargs: dict, note: str) -> ReplayCase:
    return ReplayCase(fn=one_range(f"tensor_cast::{name}", fn, ctx.device), kwargs=kwargs,
                      description=f"{describe_call(f'{_API}.{name}', (), kwargs)}  [{note}]",
                      recipe=f"{ctx.definition.recipe}; {note}")


def _expert_ids(ctx: BuildContext, shape: tuple[int, ...]) -> tuple[torch.Tensor, str]:
    """The expert ids the call routes by, balanced over the row's `Runtime num_experts`, and the recipe's note."""
    dtype = ctx.input_dtype(1)
    if dtype.is_floating_point or dtype == torch.bool:
        raise ctx.error(f"topk_indices is {str(dtype).removeprefix('torch.')}; expert ids are integers (INT64)",
                        contract.INPUT_DTYPES)
    text = contract.strip_profiler_quotes(ctx.row.get(RUNTIME_NUM_EXPERTS, "") or "").strip()
    if not text or text.upper() == "N/A":
        raise ctx.error(f"the row has no {RUNTIME_NUM_EXPERTS}: the experts the ids route over (the shapes do not "
                        "carry it)", RUNTIME_NUM_EXPERTS)
    try:
        experts = int(text)
    except ValueError:
        raise ctx.error(f"{text!r} is not a whole number of experts", RUNTIME_NUM_EXPERTS) from None
    tokens, top_k = math.prod(shape[:-1]), shape[-1]
    if not 1 <= top_k <= experts:
        raise ctx.error(f"topk_indices {list(shape)} picks {top_k} distinct experts of each token's; "
                        f"{RUNTIME_NUM_EXPERTS} is {experts}", RUNTIME_NUM_EXPERTS)
    ids = balanced_expert_ids(tokens, top_k, experts, seed=ctx.generator.initial_seed(), device=ctx.device)
    note = (f"expert ids laid as a router aims to route (msmodeling records them without values): {tokens} tokens x "
            f"{top_k} over {experts} experts, each expert {tokens * top_k // experts}"
            f"{'' if tokens * top_k % experts == 0 else ' or ' + str(tokens * top_k // experts + 1)}")
    return ids.view(shape).to(dtype), note


def _slot_count(ctx: BuildContext, names: tuple[str, ...]) -> None:
    count = len(ctx.slots.input_shapes)
    if count != len(names):
        raise ctx.error(f"the row has {count} input slots; {ctx.definition.type} takes {len(names)} "
                        f"({', '.join(names)})")


def _required(ctx: BuildContext, index: int, name: str) -> tuple[int, ...]:
    shape = ctx.input_shape(index)
    if not shape:
        raise ctx.error(f"input slot {index} ({name}) is {'empty' if shape is None else '0-d'}; this kernel needs "
                        "a tensor of at least one dimension")
    return shape
