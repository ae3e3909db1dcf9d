"""NPU hook: MoE kernels (GroupedMatmul, GroupedMatmulSwigluQuant, MoeTokenPermute/Unpermute, DispatchFFNCombine).

Expert routing is data the profiler does not record. The builders use balanced routing: tokens are
split evenly over the experts (group lists sum to the token count), expert ids are drawn uniformly
from the experts the weights hold, and permutation indices are a true permutation. The replay then
measures the kernel at the shapes profiled under uniform load, and says so in the trace.

Grouped-matmul rows name their optional slots by position in the aclnn API, which differs between
versions; the builders therefore assign roles by shape and dtype (x: the 2-D activation, weight: the
3-D (E, K, N) stack, group_list: the 1-D integer vector of length E, scales by their lengths) and
fail naming the slot they cannot place.
"""

from __future__ import annotations

import os

import torch

from opperf import contract
from opperf.replay.hooks.npu_common import NpuCall, Slots, hook_entry_points, numel, split_evenly
from opperf.replay.inputs import BuildContext

_INTEGER_DTYPES = ("DT_INT64", "DT_INT32")
UNKNOWN_EXPERT_COUNT = 64     # MoeTokenPermute rows do not record the expert count


def _group_list(slots: Slots, index: int, tokens: int, experts: int) -> torch.Tensor:
    """Tokens per expert (group_list_type 1), balanced, summing to the token count."""
    counts = torch.tensor(split_evenly(tokens, experts, minimum=0), dtype=slots.dtype(index))
    return slots.record(index, counts.to(slots.ctx.device))


def _place_grouped_slots(slots: Slots, tokens: int, experts: int, n: int, reserved: set[int]) -> dict[str, int]:
    """Roles of the optional grouped-matmul slots, by shape and dtype."""
    roles: dict[str, int] = {}
    for index in range(slots.count):
        shape = slots.shape(index)
        if index in reserved or shape is None:
            continue
        dtype = slots.dtype_name(index)
        if dtype in _INTEGER_DTYPES and shape == (experts,):
            role = "group_list"
        elif len(shape) == 1 and shape[0] == tokens and dtype == "DT_FLOAT":
            role = "per_token_scale"
        elif shape in ((experts, n), (experts, 1, n)) and dtype in ("DT_FLOAT", "DT_BF16", "DT_INT64"):
            role = "scale"
        elif shape == (experts, n) and dtype in ("DT_FLOAT16", "DT_BF16", "DT_INT32"):
            role = "bias"
        else:
            raise slots.ctx.error(f"input slot {index} ({shape}, {dtype}) fits none of group_list ({experts},), "
                                  f"per_token_scale ({tokens},), scale/bias ({experts}, {n})")
        if role in roles:
            raise slots.ctx.error(f"input slot {index} would be a second {role} (first: slot {roles[role]})")
        roles[role] = index
    return roles


def _grouped_operands(slots: Slots) -> tuple[int, int, int, dict[str, int]]:
    """(tokens, experts, N, optional slot roles) of a grouped matmul: x (tokens, K), weight (experts, K, N)."""
    x_shape, w_shape = slots.require(0, "x"), slots.require(1, "weight")
    if len(x_shape) != 2 or len(w_shape) != 3:
        raise slots.ctx.error(f"grouped matmul replays x (tokens, K) with weight (experts, K, N); got {x_shape}, "
                              f"{w_shape}")
    tokens, experts, n = x_shape[0], w_shape[0], w_shape[2]
    return tokens, experts, n, _place_grouped_slots(slots, tokens, experts, n, {0, 1})


def _grouped_matmul(ctx: BuildContext) -> NpuCall:
    """torch_npu.npu_grouped_matmul([x], [weight], group_list=..., split_item=2, group_type=0, group_list_type=1)."""
    slots = Slots(ctx)
    tokens, experts, n, roles = _grouped_operands(slots)
    if "group_list" not in roles:
        raise ctx.error(f"no group_list slot (a 1-D integer vector of length {experts})")
    kwargs = {"group_list": _group_list(slots, roles["group_list"], tokens, experts), "split_item": 2,
              "group_type": 0, "group_list_type": 1}
    for role in ("scale", "bias"):
        if role in roles:
            kwargs[role] = [slots.tensor(roles[role], role, values="positive" if role == "scale" else "normal")]
    if "per_token_scale" in roles:
        kwargs["per_token_scale"] = [slots.tensor(roles["per_token_scale"], "per_token_scale", values="positive")]
    if slots.dtype(0) == torch.int8 and slots.output_count:    # quantised: the dequantised output's dtype
        kwargs["output_dtype"] = slots.output_dtype(0)
    return slots.call("torch_npu.npu_grouped_matmul", ([slots.tensor(0, "x")], [slots.tensor(1, "weight")]),
                      kwargs, notes=f"balanced routing: {tokens} tokens over {experts} experts")


def _grouped_matmul_swiglu_quant(ctx: BuildContext) -> NpuCall:
    """torch_npu.npu_grouped_matmul_swiglu_quant(x, weight, group_list, weight_scale, x_scale)."""
    slots = Slots(ctx)
    tokens, experts, n, roles = _grouped_operands(slots)
    missing = [r for r in ("group_list", "scale", "per_token_scale") if r not in roles]
    if missing:
        raise ctx.error(f"cannot place {missing} among the input slots (weight_scale ({experts}, {n}) FLOAT, "
                        f"x_scale ({tokens},) FLOAT, group_list ({experts},) INT64)")
    args = (slots.tensor(0, "x"), slots.tensor(1, "weight"),
            _group_list(slots, roles["group_list"], tokens, experts),
            slots.tensor(roles["scale"], "weight_scale", values="positive"),
            slots.tensor(roles["per_token_scale"], "x_scale", values="positive"))
    return slots.call("torch_npu.npu_grouped_matmul_swiglu_quant", args,
                      notes=f"balanced routing: {tokens} tokens over {experts} experts")


def _moe_token_permute(ctx: BuildContext) -> NpuCall:
    """torch_npu.npu_moe_token_permute(tokens, indices): indices are expert ids per (token, k)."""
    slots = Slots(ctx)
    slots.require(0, "tokens")
    indices_shape = slots.require(1, "indices")
    tokens = slots.tensor(0, "tokens")
    indices = slots.index(1, "indices", UNKNOWN_EXPERT_COUNT)
    kwargs = {}
    out = slots.output_shape(0)
    if out is not None and out[0] != numel(indices_shape):
        kwargs["num_out_tokens"] = out[0]
    return slots.call("torch_npu.npu_moe_token_permute", (tokens, indices), kwargs,
                      notes=f"expert ids uniform in [0, {UNKNOWN_EXPERT_COUNT})")


def _moe_token_unpermute(ctx: BuildContext) -> NpuCall:
    """torch_npu.npu_moe_token_unpermute(permuted_tokens, sorted_indices, probs): sorted_indices a permutation."""
    slots = Slots(ctx)
    permuted_shape = slots.require(0, "permuted_tokens")
    slots.require(1, "sorted_indices")
    permuted = slots.tensor(0, "permuted_tokens")
    sorted_indices = slots.index(1, "sorted_indices", permuted_shape[0], unique=True)
    kwargs = {}
    if slots.shape(2) is not None:
        kwargs["probs"] = slots.tensor(2, "probs", values="uniform")
    return slots.call("torch_npu.npu_moe_token_unpermute", (permuted, sorted_indices), kwargs)


def _dispatch_ffn_combine(ctx: BuildContext) -> NpuCall:
    """torch.ops._C_ascend.dispatch_ffn_combine over the EP group torchrun set up (one process per rank).

    Slots in aclnnDispatchFFNCombine order: x, weight1, weight2, expert_idx, scale1, scale2, probs.
    Expert ids are uniform over every rank's experts (weight1's experts x EP size).
    """
    slots = Slots(ctx)
    names = ("x", "weight1", "weight2", "expert_idx", "scale1", "scale2", "probs")
    if slots.count < len(names):
        raise ctx.error(f"DispatchFFNCombine rows have {len(names)} slots ({', '.join(names)}), "
                        f"this one has {slots.count}")
    ep_text = contract.strip_profiler_quotes(ctx.row.get(contract.EP_SIZE, ""))
    if not ep_text.isdigit() or int(ep_text) < 1:
        raise ctx.error(f"EP Size {ep_text!r} is not a positive integer", contract.EP_SIZE)
    ep_size = int(ep_text)
    slots.require(0, "x")
    w1_shape = slots.require(1, "weight1")
    local_experts = w1_shape[0]
    x = slots.tensor(0, "x")
    expert_idx = slots.index(3, "expert_idx", local_experts * ep_size)
    kwargs = {
        "x": x, "weight1": [slots.tensor(1, "weight1")], "weight2": [slots.tensor(2, "weight2")],
        "expert_idx": expert_idx,
        "scale1": [slots.tensor(4, "scale1", values="positive")],
        "scale2": [slots.tensor(5, "scale2", values="positive")],
        "probs": slots.tensor(6, "probs", values="uniform"),
        "group": "",            # the HCCL communicator's name, known once the EP group exists (join_ep_group)
        "max_output_size": numel(slots.require(3, "expert_idx")) * ep_size,
        "out": torch.empty_like(x),
        "expert_token_nums": torch.zeros(local_experts, dtype=torch.int32, device=ctx.device),
    }

    def join_ep_group(call: NpuCall) -> None:
        import torch.distributed as dist
        if not dist.is_initialized():
            if "WORLD_SIZE" not in os.environ:
                raise RuntimeError("DispatchFFNCombine replays under torchrun (one process per EP rank); "
                                   "scripts/replay.py launches it with the --dispatch-ffn-combine-* options")
            dist.init_process_group("hccl")
        if dist.get_world_size() != ep_size:
            raise RuntimeError(f"the row's EP Size is {ep_size}, torchrun started {dist.get_world_size()} ranks")
        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("npu"))
        call.kwargs["group"] = backend.get_hccl_comm_name(dist.get_rank())

    return slots.call("torch.ops._C_ascend.dispatch_ffn_combine", (), kwargs,
                      import_modules=("torch_npu", "vllm_ascend.vllm_ascend_C"), prepare=join_ep_group,
                      notes=f"EP {ep_size}, {local_experts} local experts, uniform expert ids")


_BUILDERS = {
    "GroupedMatmul": _grouped_matmul,
    "GroupedMatmulSwigluQuant": _grouped_matmul_swiglu_quant,
    "MoeTokenPermute": _moe_token_permute,
    "MoeTokenUnpermute": _moe_token_unpermute,
    "DispatchFFNCombine": _dispatch_ffn_combine,
}

build_call, build_case = hook_entry_points(_BUILDERS)
