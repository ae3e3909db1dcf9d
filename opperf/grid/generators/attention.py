"""FusedInferAttentionScore (FIA): prefill and paged decode rows in the kernel's full input-slot layout.

The profiler reports FIA's inputs in the op prototype's order, optional inputs as empty slots:

  0 query  1 key  2 value  3 pse_shift  4 atten_mask  5 actual_seq_lengths  6 actual_seq_lengths_kv
  7 dequant_scale1 ... 13 antiquant_offset  14 block_table  15 query_padding_size ... 23 actual_shared_prefix_len
  24 query_rope  25 key_rope  26 key_rope_antiquant_scale ... (31 slots in CANN 8.x)

Dense models (per TP rank: query heads N, KV heads Nkv, head_dim D):
- prefill, layout TND, causal (sparse_mode 3, compressed mask): query (T,N,D), key/value (T,Nkv,D),
  atten_mask (mask,mask), actual_seq_lengths = cumulative query lengths, actual_seq_lengths_kv = per-sequence
  lengths; output (T,N,D), T = batch * seq_len (<= max_tokens).
- decode over a paged KV cache, layout TND with block_table: query (B,N,D), key/value caches
  (blocks,Nkv,block_size,D), block_table (B, ceil(context/block_size)); output (B,N,D).
MLA models (DeepSeek; per rank N heads, kv_lora_rank L, rope dim R), decode only (vLLM-Ascend runs MLA
prefill through a different kernel), layout BNSD: query (B,N,1,L), key/value cache (blocks,1,block_size,L),
query_rope (B,N,1,R), key_rope (blocks,1,block_size,R), actual_seq_lengths_kv and block_table only (one
query token per sequence needs no query lengths); output (B,N,1,L).

The actual sequence lengths (and heads, layout, sparse mode) ride along in `Runtime …` columns, the names
the peer's runtime metadata uses, since they are values, not shapes.

Density: each scene sweeps batch (ATTN_BATCH_GRID) x sequence or context length (ATTN_SEQ_GRID) per
model layout; then, at one anchor (batch `sweep_batch`, length `sweep_seq_len`), query heads over
HEADS_GRID (KV heads and head_dim of a model layout), KV heads over KV_HEADS_GRID (query heads and head_dim
held) and head_dim over HEAD_DIM_GRID (heads held); MLA decode sweeps its query heads. A value the kernel
cannot take there (query heads not a multiple of the KV heads) is skipped as Outside.
"""

from __future__ import annotations

from collections.abc import Iterator

from opperf.grid.candidate import SWEEP, Candidate, Outside
from opperf.grid.generators.base import INT, SOURCE, Generator, ParamSpec, source_values
from opperf.grid.values import ValueGrids
from opperf.parse.fia_metadata import (RUNTIME_BLOCK_SIZE, RUNTIME_INPUT_LAYOUT, RUNTIME_NUM_HEADS,
                                       RUNTIME_NUM_KEY_VALUE_HEADS, RUNTIME_SEQ_LENGTHS_KV_VALUES,
                                       RUNTIME_SEQ_LENGTHS_VALUES, RUNTIME_SOURCE_PROFILE, RUNTIME_SPARSE_MODE,
                                       SLOT_ATTEN_MASK, SLOT_BLOCK_TABLE, SLOT_KEY, SLOT_QUERY, SLOT_SEQ_LENGTHS,
                                       SLOT_SEQ_LENGTHS_KV, SLOT_VALUE)

SLOT_QUERY_ROPE, SLOT_KEY_ROPE = 24, 25


def _slots(count: int, filled: dict[int, tuple[int, ...]]) -> tuple[tuple[int, ...] | None, ...]:
    return tuple(filled.get(index) for index in range(count))


def _int_list(values) -> str:
    return ",".join(str(v) for v in values)


def _cumulative(lengths: list[int]) -> list[int]:
    total, out = 0, []
    for length in lengths:
        total += length
        out.append(total)
    return out


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _runtime(scene: str, *, q_lengths, kv_lengths, heads, kv_heads, layout, sparse_mode, block_size=""):
    return ((RUNTIME_SOURCE_PROFILE, f"shape_grid:{scene}"), (RUNTIME_SEQ_LENGTHS_VALUES, _int_list(q_lengths)),
            (RUNTIME_SEQ_LENGTHS_KV_VALUES, _int_list(kv_lengths)), (RUNTIME_NUM_HEADS, str(heads)),
            (RUNTIME_NUM_KEY_VALUE_HEADS, str(kv_heads)), (RUNTIME_INPUT_LAYOUT, layout),
            (RUNTIME_SPARSE_MODE, str(sparse_mode)), (RUNTIME_BLOCK_SIZE, str(block_size)))


def dense_prefill(batch: int, seq_len: int, heads: int, kv_heads: int, head_dim: int, *, slots: int,
                  mask_size: int) -> Candidate:
    tokens = batch * seq_len
    inputs = _slots(slots, {SLOT_QUERY: (tokens, heads, head_dim), SLOT_KEY: (tokens, kv_heads, head_dim),
                            SLOT_VALUE: (tokens, kv_heads, head_dim), SLOT_ATTEN_MASK: (mask_size, mask_size),
                            SLOT_SEQ_LENGTHS: (batch,), SLOT_SEQ_LENGTHS_KV: (batch,)})
    columns = _runtime("dense_prefill", q_lengths=_cumulative([seq_len] * batch), kv_lengths=[seq_len] * batch,
                       heads=heads, kv_heads=kv_heads, layout="TND", sparse_mode=3)
    return Candidate(inputs, ((tokens, heads, head_dim), None), columns)


def dense_decode(batch: int, context: int, heads: int, kv_heads: int, head_dim: int, *, slots: int,
                 block_size: int) -> Candidate:
    blocks_per_sequence = _ceil_div(context, block_size)
    cache = (batch * blocks_per_sequence, kv_heads, block_size, head_dim)
    inputs = _slots(slots, {SLOT_QUERY: (batch, heads, head_dim), SLOT_KEY: cache, SLOT_VALUE: cache,
                            SLOT_SEQ_LENGTHS: (batch,), SLOT_SEQ_LENGTHS_KV: (batch,),
                            SLOT_BLOCK_TABLE: (batch, blocks_per_sequence)})
    columns = _runtime("dense_decode", q_lengths=_cumulative([1] * batch), kv_lengths=[context] * batch,
                       heads=heads, kv_heads=kv_heads, layout="TND", sparse_mode=0, block_size=block_size)
    return Candidate(inputs, ((batch, heads, head_dim), None), columns)


def mla_decode(batch: int, context: int, heads: int, kv_lora_rank: int, rope_dim: int, *, slots: int,
               block_size: int) -> Candidate:
    blocks = batch * _ceil_div(context, block_size)
    inputs = _slots(slots, {SLOT_QUERY: (batch, heads, 1, kv_lora_rank),
                            SLOT_KEY: (blocks, 1, block_size, kv_lora_rank),
                            SLOT_VALUE: (blocks, 1, block_size, kv_lora_rank), SLOT_SEQ_LENGTHS_KV: (batch,),
                            SLOT_BLOCK_TABLE: (batch, _ceil_div(context, block_size)),
                            SLOT_QUERY_ROPE: (batch, heads, 1, rope_dim),
                            SLOT_KEY_ROPE: (blocks, 1, block_size, rope_dim)})
    columns = _runtime("mla_decode", q_lengths=[], kv_lengths=[context] * batch, heads=heads, kv_heads=1,
                       layout="BNSD", sparse_mode=0, block_size=block_size)
    return Candidate(inputs, ((batch, heads, 1, kv_lora_rank), None), columns)


BATCH, SEQ, HEADS, KV_HEADS, HEAD_DIM = "ATTN_BATCH_GRID", "ATTN_SEQ_GRID", "HEADS_GRID", "KV_HEADS_GRID", "HEAD_DIM_GRID"
PREFILL, DECODE, MLA_DECODE = "dense_prefill", "dense_decode", "mla_decode"


def _with_position(candidate: Candidate, group, axes, users) -> Candidate:
    return Candidate(candidate.inputs, candidate.outputs, candidate.columns, tuple(group), tuple(axes), users)


def _dense(scene: str, batch: int, length: int, heads: int, kv_heads: int, head_dim: int, params: dict) -> Candidate:
    if scene == PREFILL:
        return dense_prefill(batch, length, heads, kv_heads, head_dim, slots=params["input_slots"],
                             mask_size=params["mask_size"])
    return dense_decode(batch, length, heads, kv_heads, head_dim, slots=params["input_slots"],
                        block_size=params["block_size"])


def _scene_grid(scene: str, params: dict, grids: ValueGrids) -> tuple[list[int], list[int]]:
    where = "generator fused_infer_attention"
    if scene == PREFILL:
        return (source_values(params["prefill_batches"], grids, where),
                source_values(params["prefill_seq_lens"], grids, where))
    return (source_values(params["decode_batches"], grids, where),
            source_values(params["decode_context_lens"], grids, where))


def _fits_tokens(scene: str, batch: int, length: int, grids: ValueGrids) -> bool:
    return scene != PREFILL or batch * length <= grids.max_tokens


def fused_infer_attention(params: dict, grids: ValueGrids) -> Iterator[Candidate | Outside]:
    where = "generator fused_infer_attention"
    layouts = grids.values("model.attention", field=where)
    for scene in (PREFILL, DECODE):
        batches, lengths = _scene_grid(scene, params, grids)
        for heads, kv_heads, head_dim in layouts:
            users = grids.users("model.attention", (heads, kv_heads, head_dim))
            group = (("scene", scene), ("heads", heads), ("kv_heads", kv_heads), ("head_dim", head_dim))
            for batch in batches:
                for length in lengths:
                    axes = (("batch", BATCH, batch), ("seq_len", SEQ, length))
                    if _fits_tokens(scene, batch, length, grids):
                        yield _with_position(_dense(scene, batch, length, heads, kv_heads, head_dim, params),
                                             group, axes, users)
                    else:                       # prefill over the token cap
                        yield Outside(group, axes)
        yield from _dense_sweeps(scene, params, grids)
    batches, contexts = _scene_grid(DECODE, params, grids)
    for layout in _mla_layouts(grids):
        heads, kv_lora_rank, _nope, rope_dim, _v = layout
        group = (("scene", MLA_DECODE), ("heads", heads), ("kv_lora_rank", kv_lora_rank), ("rope_dim", rope_dim))
        users = grids.users("model.mla", layout)
        for batch in batches:
            for context in contexts:
                yield _with_position(mla_decode(batch, context, heads, kv_lora_rank, rope_dim,
                                                slots=params["input_slots"], block_size=params["block_size"]),
                                     group, (("batch", BATCH, batch), ("seq_len", SEQ, context)), users)
    yield from _mla_sweep(params, grids)


# One sweep per structural axis: (swept name, its axis, the model grid giving the two held values, their names).
_DENSE_SWEEPS = (
    ("heads", HEADS, "model.kv_layout", ("kv_heads", "head_dim")),
    ("kv_heads", KV_HEADS, "model.head_layout", ("heads", "head_dim")),
    ("head_dim", HEAD_DIM, "model.heads_kv", ("heads", "kv_heads")),
)


def _dense_sweeps(scene: str, params: dict, grids: ValueGrids) -> Iterator[Candidate | Outside]:
    """Heads, KV heads and head_dim, one at a time, at the anchor batch and length around each model layout;
    FIA takes query heads that are a multiple of the KV heads only."""
    where = "generator fused_infer_attention"
    batch, length = params["sweep_batch"], params["sweep_seq_len"]
    if not _fits_tokens(scene, batch, length, grids):
        return
    anchor = (("batch", batch), ("seq_len", length))
    for swept, axis, source, held_names in _DENSE_SWEEPS:
        for held in grids.values(source, field=where):
            group = (("scene", scene), (SWEEP, swept)) + tuple(zip(held_names, held)) + anchor
            users = grids.users(source, held)
            for value in grids.values(axis, field=where):
                layout = dict(zip(held_names, held), **{swept: value})
                axes = ((swept, axis, value),)
                if layout["kv_heads"] > layout["heads"] or layout["heads"] % layout["kv_heads"]:
                    yield Outside(group, axes)
                    continue
                yield _with_position(_dense(scene, batch, length, layout["heads"], layout["kv_heads"],
                                            layout["head_dim"], params), group, axes, users)


def _mla_sweep(params: dict, grids: ValueGrids) -> Iterator[Candidate]:
    """MLA decode: query heads over HEADS_GRID at the anchor batch and context (one shared KV head)."""
    where = "generator fused_infer_attention"
    if not grids.models and "mla_rank" not in grids.generic:
        return
    batch, context = params["sweep_batch"], params["sweep_seq_len"]
    for ranks in grids.values("model.mla_rank", field=where):
        kv_lora_rank, _nope, rope_dim, _v = ranks
        group = (("scene", MLA_DECODE), (SWEEP, "heads"), ("kv_lora_rank", kv_lora_rank), ("rope_dim", rope_dim),
                 ("batch", batch), ("seq_len", context))
        users = grids.users("model.mla_rank", ranks)
        for heads in grids.values(HEADS, field=where):
            yield _with_position(mla_decode(batch, context, heads, kv_lora_rank, rope_dim, slots=params["input_slots"],
                                            block_size=params["block_size"]),
                                 group, (("heads", HEADS, heads),), users)


def _mla_layouts(grids: ValueGrids):
    """MLA layouts of the target models; with no target model, the generic list if grid.yaml has one."""
    if not grids.models and "mla" not in grids.generic:
        return []
    return grids.values("model.mla", field="generator fused_infer_attention")


GENERATORS = [
    Generator("fused_infer_attention", {
        "prefill_batches": ParamSpec(SOURCE, BATCH),
        "prefill_seq_lens": ParamSpec(SOURCE, SEQ),
        "decode_batches": ParamSpec(SOURCE, BATCH),
        "decode_context_lens": ParamSpec(SOURCE, SEQ),
        "sweep_batch": ParamSpec(INT, 1),
        "sweep_seq_len": ParamSpec(INT, 256),
        "block_size": ParamSpec(INT, 128),
        "mask_size": ParamSpec(INT, 2048),
        "input_slots": ParamSpec(INT, 31),
    }, fused_infer_attention),
]
