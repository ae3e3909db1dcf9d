"""Hook for TensorCast's paged-KV-cache ops: rows of kernel types `PagedAttention` (`tensor_cast.attention`) and
`ReshapeAndCache` (`tensor_cast.reshape_and_cache`), replayed on cpu and cuda by opperf.consumer.paged_attention.

A row is one call as msmodeling's runner issues it (docs/replay.md, "TensorCast's paged-cache ops"):

- PagedAttention: 8 input slots, query `T,Hq*D`, key and value cache `NB,BS,Hkv,D`, the mask slot empty, block
  table `B,MB`, query start locations `B+1`, seq_lens `B`, query_lens `B`; the lengths' values in
  `Runtime actual_seq_lengths_kv_values` (seq_lens) and `Runtime actual_seq_lengths_values` (query_lens).
- ReshapeAndCache: key and value `T,Hkv*D`, the cache `2,NB,BS,Hkv,D`, slot mapping `T`; the step's lengths in the
  same two columns where known, else the T tokens go to T distinct slots.

msmodeling records the block table and slot mapping on the meta device, without values: they are laid as a
serving engine lays them (`paged_attention.build_inputs`: each sequence its own consecutive blocks, the new tokens
after each sequence's context), and the row's `Replay Recipe` says so. A row whose shapes disagree with its lengths
(or with its other `Runtime …` columns) is refused naming the column: it would time another call than it describes.

Cache state (the order of a model step, not a measurement): the query, new keys and values and the small metadata
are warm (just written); a cache is cold where it holds context from earlier steps (decode, chunked prefill: a
whole forward's weights streamed through the cache since), warm in a pure prefill, whose cache reshape_and_cache
wrote just before; the cache reshape_and_cache writes into is cold. Key and value caches get storages of their own
so the timer can give a cold one copies in turn (it leaves inputs that share a storage as they are).
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import accumulate

import torch

from opperf import contract
from opperf.consumer.paged_attention import build_inputs, paged_attention, reshape_and_cache
from opperf.errors import OpperfError
from opperf.replay.inputs import BuildContext, ReplayCase, describe_call

# The peer's FIA column names (as opperf.parse.fia_metadata writes them; not imported: the parse stage reads with
# polars, which a replay environment need not have).
RUNTIME_SEQ_LENGTHS_KV_VALUES, RUNTIME_SEQ_LENGTHS_VALUES = contract.LENGTHS_SIGNATURE_COLUMNS
RUNTIME_AVG_SEQ_LEN = "Runtime avg_seq_len"
RUNTIME_BATCH_SIZE = "Runtime batch_size"
RUNTIME_BLOCK_SIZE = "Runtime block_size"
RUNTIME_NUM_HEADS = "Runtime num_heads"
RUNTIME_NUM_KEY_VALUE_HEADS = "Runtime num_key_value_heads"
ATTENTION_SLOTS = ("query", "key_cache", "value_cache", "attention_mask", "block_table", "query_start_loc",
                   "seq_lens", "query_lens")
CACHE_WRITE_SLOTS = ("key", "value", "kv_cache", "slot_mapping")
_API = "opperf.consumer.paged_attention"


def build_case(row: Mapping[str, str], ctx: BuildContext) -> ReplayCase:
    kernel_type = ctx.definition.type if ctx.definition is not None else ""
    builders = {"PagedAttention": _attention, "ReshapeAndCache": _cache_write}
    if kernel_type not in builders:
        raise ctx.error(f"hook has no builder for kernel type {kernel_type!r} (it builds {sorted(builders)})", "type")
    return builders[kernel_type](ctx)


def _attention(ctx: BuildContext) -> ReplayCase:
    shapes = _shapes(ctx, ATTENTION_SLOTS, optional={"attention_mask"})
    if shapes["attention_mask"] is not None:
        raise ctx.error(f"input slot 3 (attention_mask) holds {list(shapes['attention_mask'])}; only the maskless "
                        "paged form TensorCast issues with a KV cache is replayed")
    query, key, table = shapes["query"], shapes["key_cache"], shapes["block_table"]
    _rank(ctx, shapes, {"query": 2, "key_cache": 4, "value_cache": 4, "block_table": 2, "query_start_loc": 1,
                        "seq_lens": 1, "query_lens": 1})
    if shapes["value_cache"] != key:
        raise ctx.error(f"value_cache {list(shapes['value_cache'])} differs from key_cache {list(key)}")
    batch = shapes["seq_lens"][0]
    if batch < 1:
        raise ctx.error(f"seq_lens {list(shapes['seq_lens'])} holds no sequence")
    for name, got, expected in (("query_lens", shapes["query_lens"][0], batch),
                                ("query_start_loc", shapes["query_start_loc"][0], batch + 1),
                                ("block_table", table[0], batch)):
        if got != expected:
            raise ctx.error(f"{name} {list(shapes[name])} does not fit the {batch} sequences of seq_lens "
                            f"{list(shapes['seq_lens'])}")
    num_blocks, block_size, kv_heads, head_dim = key
    query_heads, remainder = divmod(query[1], head_dim)
    if remainder or query_heads % kv_heads:
        raise ctx.error(f"query width {query[1]} is not a multiple of head_dim {head_dim} times the {kv_heads} KV "
                        f"heads of key_cache {list(key)}")
    seq_lens = _lengths(ctx, RUNTIME_SEQ_LENGTHS_KV_VALUES, "seq_lens", batch)
    query_lens = _lengths(ctx, RUNTIME_SEQ_LENGTHS_VALUES, "query_lens", batch)
    _check_lengths(ctx, seq_lens, query_lens, query[0], "query")
    needed = [-(-length // block_size) for length in seq_lens]
    if max(needed) > table[1]:
        raise ctx.error(f"{RUNTIME_SEQ_LENGTHS_KV_VALUES} {seq_lens} need {max(needed)} blocks of {block_size}; the "
                        f"block table {list(table)} has {table[1]} columns", RUNTIME_SEQ_LENGTHS_KV_VALUES)
    _agree(ctx, {RUNTIME_BATCH_SIZE: batch, RUNTIME_BLOCK_SIZE: block_size, RUNTIME_NUM_HEADS: query_heads,
                 RUNTIME_NUM_KEY_VALUE_HEADS: kv_heads, RUNTIME_AVG_SEQ_LEN: sum(seq_lens) // batch})
    dtype = ctx.input_dtype(0)
    call = {"op": "tensor_cast.attention.default", "args": [
        _spec(query, dtype), _spec(key, dtype), _spec(key, dtype), None, _spec(table, torch.int64),
        {**_spec((batch + 1,), torch.int64), "values": [0, *accumulate(query_lens)]},
        {**_spec((batch,), torch.int64), "values": seq_lens}, {**_spec((batch,), torch.int64), "values": query_lens}]}
    inputs = _build(ctx, call, dtype)
    # Storages of their own (build_inputs lays one [2, blocks, ...] cache, as vLLM does): see the docstring.
    inputs["key_cache"], inputs["value_cache"] = inputs["key_cache"].clone(), inputs["value_cache"].clone()
    prefill = all(length == count for length, count in zip(seq_lens, query_lens))
    warm = [t for name, t in inputs.items() if prefill or name not in ("key_cache", "value_cache")]
    layout = _layout_note(needed, block_size, num_blocks, inputs["key_cache"].shape[0])
    cache = "warm (a pure prefill: written just before)" if prefill else "cold (context from earlier steps)"
    return ReplayCase(fn=one_range("tensor_cast::attention", paged_attention, ctx.device), kwargs=inputs,
                      warm=tuple(warm),
                      description=f"{describe_call(f'{_API}.paged_attention', (), inputs)}  [seq_lens {seq_lens}, "
                                  f"query_lens {query_lens}; {layout}; key/value cache {cache}]",
                      recipe=f"{ctx.definition.recipe}; {layout}")


def _cache_write(ctx: BuildContext) -> ReplayCase:
    shapes = _shapes(ctx, CACHE_WRITE_SLOTS)
    _rank(ctx, shapes, {"key": 2, "value": 2, "kv_cache": 5, "slot_mapping": 1})
    key, cache = shapes["key"], shapes["kv_cache"]
    _, num_blocks, block_size, kv_heads, head_dim = cache
    tokens = key[0]
    if shapes["value"] != key or shapes["slot_mapping"] != (tokens,) or cache[0] != 2 or key[1] != kv_heads * head_dim:
        raise ctx.error(f"key {list(key)}, value {list(shapes['value'])}, kv_cache {list(cache)} and slot_mapping "
                        f"{list(shapes['slot_mapping'])} do not fit together: key and value [tokens, Hkv * D], "
                        "kv_cache [2, blocks, block_size, Hkv, D], slot_mapping [tokens]")
    known = [column for column in (RUNTIME_SEQ_LENGTHS_KV_VALUES, RUNTIME_SEQ_LENGTHS_VALUES) if _text(ctx, column)]
    if len(known) == 1:
        missing = ({RUNTIME_SEQ_LENGTHS_KV_VALUES, RUNTIME_SEQ_LENGTHS_VALUES} - set(known)).pop()
        raise ctx.error(f"the row gives {known[0]} but not {missing}: the step's lengths need both", missing)
    if known:
        seq_lens = _lengths(ctx, RUNTIME_SEQ_LENGTHS_KV_VALUES, "seq_lens", None)
        query_lens = _lengths(ctx, RUNTIME_SEQ_LENGTHS_VALUES, "query_lens", None)
        _check_lengths(ctx, seq_lens, query_lens, tokens, "key")
        _agree(ctx, {RUNTIME_BATCH_SIZE: len(seq_lens), RUNTIME_BLOCK_SIZE: block_size})
    else:
        seq_lens, query_lens = [tokens], [tokens]
    dtype = ctx.input_dtype(0)
    call = {"op": "tensor_cast.reshape_and_cache.default", "args": [
        _spec(key, dtype), _spec(key, dtype), _spec(cache, dtype), _spec((tokens,), torch.int64)]}
    inputs = _build(ctx, call, dtype, seq_lens=seq_lens, query_lens=query_lens)
    needed = [-(-length // block_size) for length in seq_lens]
    if known:
        layout = _layout_note(needed, block_size, num_blocks, inputs["kv_cache"].shape[1])
    else:
        layout = (f"no {RUNTIME_SEQ_LENGTHS_VALUES}: the {tokens} tokens written to {tokens} distinct consecutive "
                  "slots (one sequence's prefill)")
    warm = [t for name, t in inputs.items() if name != "kv_cache"]
    return ReplayCase(fn=one_range("tensor_cast::reshape_and_cache", reshape_and_cache, ctx.device),
                      kwargs=inputs, warm=tuple(warm),
                      description=f"{describe_call(f'{_API}.reshape_and_cache', (), inputs)}  [{layout}; kv_cache "
                                  "cold]",
                      recipe=f"{ctx.definition.recipe}; {layout}")


def one_range(name: str, fn, device: torch.device):
    """The call as one op for the timer. Its calls are several torch ops, and the cuda timer counts the kernels that
    the ops at the top of a row's range launch themselves (SDPA's kernel is launched by an op nested in it): under
    one range of their own, which launches nothing itself, every kernel inside counts. The cpu timer sums the top
    ops' own times, which hold their nested ops' already; a range there would add the Python between the ops."""
    if device.type == "cpu":
        return fn

    def call(**kwargs):
        with torch.profiler.record_function(name):
            return fn(**kwargs)
    return call


def _shapes(ctx: BuildContext, names: tuple[str, ...], optional: set[str] = frozenset()) -> dict:
    count = len(ctx.slots.input_shapes)
    if count != len(names):
        raise ctx.error(f"the row has {count} input slots; {ctx.definition.type} takes {len(names)} "
                        f"({', '.join(names)})")
    shapes = {name: ctx.input_shape(index) for index, name in enumerate(names)}
    for index, name in enumerate(names):
        if shapes[name] is None and name not in optional:
            raise ctx.error(f"input slot {index} ({name}) is empty; this kernel needs it")
    return shapes


def _rank(ctx: BuildContext, shapes: dict, ranks: dict[str, int]) -> None:
    for name, rank in ranks.items():
        if len(shapes[name]) != rank:
            raise ctx.error(f"{name} {list(shapes[name])} is not {rank}-D")


def _text(ctx: BuildContext, column: str) -> str:
    text = contract.strip_profiler_quotes(ctx.row.get(column, "") or "").strip()
    return "" if text.upper() == "N/A" else text


def _lengths(ctx: BuildContext, column: str, name: str, batch: int | None) -> list[int]:
    """A `Runtime …_values` column as one length per sequence: `513,513,513,513` (as fia_metadata writes it)."""
    text = _text(ctx, column)
    if not text:
        raise ctx.error(f"the row has no {column}: the {name} values the call ran with (shapes do not carry them)",
                        column)
    try:
        values = [int(part) for part in text.strip("[]").replace(";", ",").split(",")]
    except ValueError:
        raise ctx.error(f"{text!r} is not a list of integers such as 513,513", column) from None
    if any(value < 0 for value in values):
        raise ctx.error(f"{name} {values}: a length is negative", column)
    if batch is not None and len(values) != batch:
        raise ctx.error(f"{name} {values} has {len(values)} lengths; the Input Shapes hold {batch} sequences", column)
    return values


def _check_lengths(ctx: BuildContext, seq_lens: list[int], query_lens: list[int], tokens: int, slot: str) -> None:
    if len(seq_lens) != len(query_lens):
        raise ctx.error(f"{len(seq_lens)} seq_lens {seq_lens} but {len(query_lens)} query_lens {query_lens}",
                        RUNTIME_SEQ_LENGTHS_VALUES)
    if sum(query_lens) != tokens:
        raise ctx.error(f"query_lens {query_lens} sum to {sum(query_lens)} new tokens; Input Shapes' {slot} has "
                        f"{tokens}", RUNTIME_SEQ_LENGTHS_VALUES)
    for sequence, (length, count) in enumerate(zip(seq_lens, query_lens)):
        if count > length:
            raise ctx.error(f"sequence {sequence}: query_len {count} exceeds its seq_len {length} (seq_lens count "
                            "the context with the new tokens)", RUNTIME_SEQ_LENGTHS_VALUES)


def _agree(ctx: BuildContext, expected: dict[str, int]) -> None:
    """The row's other `Runtime …` columns, where it has them, say what its shapes and lengths say."""
    for column, value in expected.items():
        text = _text(ctx, column)
        if not text:
            continue
        try:
            given = int(float(text))
        except ValueError:
            raise ctx.error(f"{text!r} is not a number", column) from None
        if given != value:
            raise ctx.error(f"{column} is {given}; the row's Input Shapes and lengths give {value}", column)


def _spec(shape, dtype: torch.dtype) -> dict:
    return {"shape": [int(d) for d in shape], "dtype": str(dtype).removeprefix("torch.")}


def _build(ctx: BuildContext, call: dict, dtype: torch.dtype, **lengths) -> dict[str, torch.Tensor]:
    try:
        return build_inputs(call, ctx.device, dtype=dtype, seed=ctx.generator.initial_seed(), **lengths)
    except OpperfError as exc:
        raise ctx.error(exc.reason) from exc


def _layout_note(needed: list[int], block_size: int, recorded_blocks: int, built_blocks: int) -> str:
    """The Replay Recipe's account of the inputs msmodeling recorded without values."""
    per_sequence = f"{needed[0]}" if len(set(needed)) == 1 else "/".join(map(str, needed))
    note = (f"block table and slots laid as a serving engine lays them (msmodeling records them without values): "
            f"each sequence its own {per_sequence} consecutive blocks of {block_size}, its new tokens after its "
            "context")
    if built_blocks != recorded_blocks:
        note += f", the cache grown from the recorded {recorded_blocks} to {built_blocks} blocks to hold them"
    return note
