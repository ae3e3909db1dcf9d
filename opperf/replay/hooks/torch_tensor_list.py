"""Ops whose first argument is a list of tensors (aten::cat, aten::stack): the row flattens the list.

torch.profiler records `cat(TensorList tensors, int dim)`; the database row keeps one slot per list
element followed by the scalar slots, e.g. Input Shapes `1,4,65,32;1,4,1,32;` with Input Scalars
`;;2`. Every leading non-empty slot is a list element; the slots after them are the remaining
arguments, taken from Input Scalars.

record_shapes gives a TensorList's element shapes but not their dtypes, so element slots may have no
dtype: they take the first dtype the row does record (another input slot, else an output slot), else
float32; the call's description says so, and output verification still checks shapes.

Cache state: every member is warm (just written), except the cache of an append. When one member is at least
8x as long along the concatenated dimension as all the others together (the decode KV-cache
`cat([past, new], dim=-2)`: 512 past positions plus 1), it was written one forward step earlier and a whole
forward's weights have streamed through L2 since: it is cold. On an H100 (Mistral-7B class, decode at batch 16)
that cat took 11.2 µs in the workload; replayed with the past keys resident in L2, 8.9 µs; cold, 11.0 µs
(benchmarks/results/cuda_replay_transformers/cat_append/).
"""

from __future__ import annotations

from opperf import contract
from opperf.input_values import INPUT_VALUES, PROFILER_LIST_LIMIT
from opperf.replay.inputs import BuildContext, ReplayCase, describe_call, resolve_callable, torch_dtype


def build_case(row, ctx: BuildContext) -> ReplayCase:
    shapes = ctx.slots.input_shapes
    count = 0
    while count < len(shapes) and shapes[count] is not None:
        count += 1
    if count == 0:
        raise ctx.error("a tensor-list op needs at least one tensor slot before its scalar slots (torch.profiler "
                        f"records the member shapes of a list of at most {PROFILER_LIST_LIMIT} tensors; a longer "
                        f"list's come from {INPUT_VALUES} beside the trace, as scripts/profile_workload.py records "
                        "it)")
    known = [d for d in (*ctx.slots.input_dtypes, *ctx.slots.output_dtypes) if d and contract.is_known_dtype(d)]
    fallback = known[0] if known else "DT_FLOAT"
    tensors, guessed = [], False
    for index in range(count):
        recorded = ctx.slots.input_dtypes[index] if index < len(ctx.slots.input_dtypes) else ""
        if recorded:
            dtype = ctx.input_dtype(index)
        else:
            dtype, guessed = torch_dtype(fallback), True
        tensors.append(ctx.tensor(ctx.input_shape(index), dtype, strides=ctx.input_strides(index)))
    rest = []
    for index in range(count, len(shapes)):
        value = ctx.scalar(index)
        if value is None:
            break
        rest.append(value)
    if any(shapes[i] is not None for i in range(count, len(shapes))):
        raise ctx.error("tensor slots after the list's scalar slots are not supported", contract.INPUT_SHAPES)
    api = ctx.definition.api
    fn = resolve_callable(api, ctx.definition.import_modules)
    note = f" [element dtype not recorded: built as {fallback}]" if guessed else ""
    cold = appended_cache(tensors, rest[0] if rest and isinstance(rest[0], int) else 0)
    warm = tuple(t for i, t in enumerate(tensors) if i != cold)
    if cold is not None:
        note += f" [member {cold} cold: the cache being appended to]"
    return ReplayCase(fn=fn, args=(tensors, *rest), description=describe_call(api, [tensors, *rest], {}) + note,
                      warm=warm)


APPEND_RATIO = 8


def appended_cache(tensors, dim: int) -> int | None:
    """The index of the member a cat appends to (a cache, cold in the workload), or None (see the docstring)."""
    if len(tensors) < 2 or any(t.dim() == 0 for t in tensors):
        return None
    rank = tensors[0].dim()
    if not -rank <= dim < rank:
        return None
    dim %= rank
    lengths = [t.shape[dim] for t in tensors]          # the other dimensions agree: bytes go as these lengths
    big = max(range(len(tensors)), key=lengths.__getitem__)
    return big if lengths[big] >= APPEND_RATIO * max(sum(lengths) - lengths[big], 1) else None
