"""NPU hook: fused norm / RoPE / KV-cache kernels (AddRmsNormBias, split_qkv_rmsnorm_rope_kernel,
KvRmsNormRopeCache, ReshapeAndCacheNdKernel).

The KV-cache kernels write into the cache at slot indices: those are distinct and inside the cache
(blocks x block_size), never out of bounds. In-place kernels return the caches they wrote, so the
verification compares them with the row's output slots.
"""

from __future__ import annotations

import math

import torch

from opperf.replay.hooks.npu_common import NpuCall, Slots, hook_entry_points, numel
from opperf.replay.inputs import BuildContext

CUSTOM_OP_IMPORTS = ("torch_npu", "vllm_ascend.vllm_ascend_C")
RMS_NORM_EPSILON = 1e-6
KV_RMS_NORM_EPSILON = 1e-5


def _add_rms_norm_bias(ctx: BuildContext) -> NpuCall:
    """torch.ops._C_ascend.npu_add_rms_norm_bias(x1, x2, gamma, beta, epsilon) -> (y, rstd, x).

    A residual recorded as (T, H) beside x1 (1, T, H) is the same storage: the kernel needs equal
    shapes, so x2 is built with x1's shape (what the serving stack hands the kernel after its view).
    """
    slots = Slots(ctx)
    x1_shape, x2_shape = slots.require(0, "x1"), slots.require(1, "x2")
    gamma_shape = slots.require(2, "gamma")
    notes = ""
    if x2_shape != x1_shape:
        if len(x1_shape) == 3 and x1_shape[0] == 1 and x2_shape == x1_shape[1:]:
            notes = f"x2 {x2_shape} built as x1's storage-equivalent {x1_shape}"
        else:
            raise ctx.error(f"x1 {x1_shape} and x2 {x2_shape} must have equal shapes")
    if gamma_shape != (x1_shape[-1],):
        raise ctx.error(f"gamma {gamma_shape} must be ({x1_shape[-1]},), the hidden size")
    x1 = slots.tensor(0, "x1")
    x2 = slots.tensor(1, "x2", shape=x1_shape)
    beta = slots.optional(3, "beta")
    return slots.call("torch.ops._C_ascend.npu_add_rms_norm_bias",
                      (x1, x2, slots.tensor(2, "gamma"), beta, RMS_NORM_EPSILON),
                      import_modules=CUSTOM_OP_IMPORTS, notes=notes)


def _head_dim(q_hidden: int, kv_hidden: int, rope_dim: int) -> int:
    """The head size: the rope dimension if it divides both widths, else their smallest common divisor above it."""
    common = math.gcd(q_hidden, kv_hidden)
    candidates = [d for d in range(rope_dim, common + 1) if common % d == 0]
    if not candidates:
        raise ValueError(f"no head size >= rope dim {rope_dim} divides both {q_hidden} and {kv_hidden}")
    return candidates[0]


def _init_triton(call: NpuCall) -> None:
    from vllm_ascend.ops.triton.triton_utils import init_device_properties_triton
    init_device_properties_triton()


def _split_qkv_rmsnorm_rope(ctx: BuildContext) -> NpuCall:
    """torch.ops.vllm.qkv_rmsnorm_rope (vLLM-Ascend's Triton kernel): input, cos_sin_cache[, positions].

    q/kv widths come from the outputs (q, k[, v]); positions index the cos/sin cache's rows.
    """
    slots = Slots(ctx)
    input_shape, cache_shape = slots.require(0, "input"), slots.require(1, "cos_sin_cache")
    if slots.output_count < 2:
        raise ctx.error("needs the q and k output shapes to know the q / kv widths")
    q_hidden = slots.require_output(0, "q")[-1]
    kv_hidden = slots.require_output(1, "k")[-1]
    try:
        head_dim = _head_dim(q_hidden, kv_hidden, cache_shape[-1])
    except ValueError as exc:
        raise ctx.error(str(exc)) from exc
    tokens = input_shape[0]
    if slots.shape(2) is not None:
        positions = slots.index(2, "positions", cache_shape[0])
    else:                                   # older rows record (input, cos_sin_cache) only
        positions = ctx.index_tensor((tokens,), torch.int64, 0, cache_shape[0])
    dtype = slots.dtype(0)
    kwargs = {
        "input": slots.tensor(0, "input"), "cos_sin_cache": slots.tensor(1, "cos_sin_cache"), "positions": positions,
        "q_weight": ctx.tensor((head_dim,), dtype), "k_weight": ctx.tensor((head_dim,), dtype),
        "q_hidden_size": q_hidden, "kv_hidden_size": kv_hidden, "head_dim": head_dim, "eps": RMS_NORM_EPSILON,
    }
    return slots.call("torch.ops.vllm.qkv_rmsnorm_rope", (), kwargs,
                      import_modules=("torch_npu", "vllm_ascend.ops.register_custom_ops"), prepare=_init_triton,
                      notes=f"head_dim={head_dim} (from q {q_hidden}, kv {kv_hidden}, rope {cache_shape[-1]})")


def _cache_slots(slots: Slots, index: int, name: str, cache_shape: tuple[int, ...]) -> torch.Tensor:
    """Distinct cache slot ids in [0, blocks * block_size) for the tokens of slot `index`."""
    if len(cache_shape) < 2:
        raise slots.ctx.error(f"cache shape {cache_shape} has no (blocks, block_size, ...) layout")
    return slots.index(index, name, cache_shape[0] * cache_shape[1], unique=True)


def _kv_rms_norm_rope_cache(ctx: BuildContext) -> NpuCall:
    """torch_npu.npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache, ..., cache_mode=PA_BNSD)."""
    slots = Slots(ctx)
    names = ("kv", "gamma", "cos", "sin", "index", "k_cache", "ckv_cache")
    for index, name in enumerate(names):
        slots.require(index, name)
    k_cache_shape = slots.shape(5)
    if len(k_cache_shape) != 4 or len(slots.shape(4)) != 1:
        raise ctx.error(f"paged caches (blocks, block_size, heads, dim) and a 1-D index are replayed; got "
                        f"k_cache {k_cache_shape}, index {slots.shape(4)}")
    args = [slots.tensor(i, n) for i, n in enumerate(names[:4])]
    args.append(_cache_slots(slots, 4, "index", k_cache_shape))
    args += [slots.tensor(5, "k_cache"), slots.tensor(6, "ckv_cache")]
    optional = ("k_rope_scale", "c_kv_scale", "k_rope_offset", "c_kv_offset")
    kwargs = {name: slots.optional(7 + i, name, values="positive") for i, name in enumerate(optional)}
    kwargs.update(epsilon=KV_RMS_NORM_EPSILON, cache_mode="PA_BNSD", is_output_kv=slots.output_count >= 4)
    return slots.call("torch_npu.npu_kv_rmsnorm_rope_cache", args, kwargs)


def _reshape_and_cache(ctx: BuildContext) -> NpuCall:
    """torch_npu._npu_reshape_and_cache(key, value, key_cache, value_cache, slot_indices): writes the caches."""
    slots = Slots(ctx)
    names = ("key", "value", "key_cache", "value_cache", "slot_indices")
    for index, name in enumerate(names):
        slots.require(index, name)
    cache_shape = slots.shape(2)
    if numel(slots.shape(4)) > cache_shape[0] * cache_shape[1]:
        raise ctx.error(f"{numel(slots.shape(4))} tokens do not fit in a cache of {cache_shape[0]} x "
                        f"{cache_shape[1]} slots")
    key_cache, value_cache = slots.tensor(2, "key_cache"), slots.tensor(3, "value_cache")
    args = (slots.tensor(0, "key"), slots.tensor(1, "value"), key_cache, value_cache,
            _cache_slots(slots, 4, "slot_indices", cache_shape))
    return slots.call("torch_npu._npu_reshape_and_cache", args, outputs=lambda _: (key_cache, value_cache))


_BUILDERS = {
    "AddRmsNormBias": _add_rms_norm_bias,
    "split_qkv_rmsnorm_rope_kernel": _split_qkv_rmsnorm_rope,
    "KvRmsNormRopeCache": _kv_rms_norm_rope_cache,
    "ReshapeAndCacheNdKernel": _reshape_and_cache,
}

build_call, build_case = hook_entry_points(_BUILDERS)
