"""Input values a trace cannot record: a MoE router's split, masks and indices, as the workload ran them.

torch.profiler records an input's shape, dtype and strides, never its values. For most ops the values do not
change the kernel's time; for the ops below they do: `_grouped_mm`'s offsets are the tokens each expert got (a
skewed split launches other tiles than a balanced one: up to 1.4× on a few hundred tokens), a histogram's
time follows how its ids pile up (bincount over the workload's skewed ids 7–12 % slower than over balanced ones),
a select's time how many of its mask's elements are True (`masked_fill_` skips loading `self` where the mask
is True: over transformers' MoE sentinel mask, all False, 7 % slower than over a random one; an H100,
benchmarks/results/mask_values/), and a gather's how many distinct rows its index reads (a MoE layer restores its
token order with a permutation, every row read once; indices drawn with replacement read fewer, some twice, from
L2).

So the workload records them in an un-profiled pass of the same sequence (its first warm-up, or a pass after the
profile), with a TorchDispatchMode that sees every aten call (opperf.workload.values), into `input_values.json`
beside the trace. The parse joins them to the trace's calls by op and input shapes (the k-th call of a key gets the
key's k-th recorded call, cyclically: a profile of N passes repeats one pass's sequence) and gives each row the
`Profiling Input Values` column; replay builds the slot from them and cycles through the row's calls, so its mean
is over the workload's own splits. Rows without the column (grid rows, NPU profiles) keep the balanced draw.

Here, not beside the recorder: the parse and replay stages import this without the workload's model.

Per call, a slot's text is a list of non-negative integers separated by spaces, of one `kind`:
- `offsets`: the argument's own values (cumulative group ends, e.g. `_grouped_mm`'s `offs`);
- `counts`: how many of the input's values fall in each bin (bincount: per value 0..max; histc: per bin of its
  range, the values outside it being the tensor's other elements);
- `mask`: one integer, how many elements of a bool mask are True (replay places them at random; all or none exactly);
- `distinct`: one integer, how many distinct values an index holds (`index_select`'s and `index_add(_)`'s `index`, the
  first member of `index`'s and `index_put(_)`'s index list).
A row's cell is `;`-aligned with Input Shapes; a slot holds the row's distinct calls as `values*calls`, joined
by `|` (`3 8*5|2 8*5`: two splits, five calls each).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from opperf.errors import OpperfError

INPUT_VALUES = "input_values.json"
FORMAT_VERSION = 1
# torch.profiler records the member shapes of a TensorList of at most this many tensors (TENSOR_LIST_DISPLAY_LENGTH_
# LIMIT in torch/csrc/profiler/util.h); a longer list's Input Dims is empty. A MoE layer that concatenates its
# experts' outputs (128 experts: the reference decoder's `moe`, 1.8 % of its device time) passes such a list, so the
# recorder keeps the members' shapes, strides and dtype of every longer list too (a call entry's `lists`).
PROFILER_LIST_LIMIT = 30
OFFSETS, COUNTS, MASK, DISTINCT = "offsets", "counts", "mask", "distinct"
# Per op (its join name, `join_name`: an in-place op and its out-of-place form are one entry), the arguments whose
# values are recorded and how: schema argument name → kind.
RECORDED_ARGUMENTS: dict[str, dict[str, str]] = {
    "_grouped_mm": {"offs": OFFSETS},
    "_scaled_grouped_mm": {"offs": OFFSETS},
    "bincount": {"self": COUNTS},
    "histc": {"self": COUNTS},
    "masked_fill": {"mask": MASK},
    "masked_scatter": {"mask": MASK},
    "masked_select": {"mask": MASK},
    "where": {"condition": MASK},
    "index": {"indices": DISTINCT},
    "index_select": {"index": DISTINCT},
    "index_add": {"index": DISTINCT},
    "_index_put_impl": {"indices": DISTINCT},      # index_put(_) too (JOINED_OPS)
}
# At most this many distinct calls per slot are cycled through in replay (spread evenly over the recorded ones).
MAX_VARIANTS = 64


def format_values(values: Sequence[int]) -> str:
    return " ".join(str(int(v)) for v in values)


def parse_values(text: str, *, where: str = "") -> list[int]:
    try:
        values = [int(part) for part in text.split()]
    except ValueError as exc:
        raise OpperfError(f"{where}: {text[:60]!r} is not a list of integers") from exc
    if any(v < 0 for v in values):
        raise OpperfError(f"{where}: {text[:60]!r} holds a negative value")
    return values


# The recorder sees the op a program calls; a trace gives the kernel to the op that launched it, inside that one.
# Both take the same tensors. An in-place op also joins its out-of-place form (`masked_fill` runs `masked_fill_`).
JOINED_OPS = {"index_put": "_index_put_impl"}


def join_name(op: str) -> str:
    """The name a recorded call and a trace call of aten op `op` meet under: in-place and out-of-place alike,
    `JOINED_OPS` followed."""
    name = op[:-1] if op.endswith("_") and not op.endswith("__") else op
    return JOINED_OPS.get(name, name)


def recorded_arguments(op: str) -> dict[str, str]:
    """Argument name → kind of what is recorded of aten op `op`'s calls (empty: nothing)."""
    return RECORDED_ARGUMENTS.get(join_name(op), {})


def shapes_key(op: str, shapes: Sequence) -> tuple:
    """The join key of a call: its join name and the shapes of its tensor inputs, in order (empty slots skipped,
    as a trace's Input Dims and a dispatched call's arguments list them differently)."""
    dims = tuple(tuple(int(d) for d in shape) for shape in shapes
                 if isinstance(shape, (list, tuple)) and shape and all(isinstance(d, int) for d in shape))
    return join_name(op), dims


class RecordedValues:
    """`input_values.json` read back: per join key, its calls' slot texts in the order the pass ran them."""

    def __init__(self, calls: Mapping[tuple, list[dict[int, str]]],
                 lists: Mapping[tuple, list[dict[int, dict]]] | None = None):
        self.calls = dict(calls)
        self.lists = dict(lists or {})      # per join key, its calls' long TensorLists: position → members
        self._seen: Counter = Counter()
        self._lists_seen: Counter = Counter()

    @classmethod
    def beside(cls, trace_path: str | Path) -> "RecordedValues | None":
        path = Path(trace_path).parent / INPUT_VALUES
        if not path.is_file():
            return None
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise OpperfError(f"cannot read recorded input values: {exc}", path=path) from exc
        if document.get("version") != FORMAT_VERSION or not isinstance(document.get("calls"), list):
            raise OpperfError(f"not an input-values file of version {FORMAT_VERSION}", path=path, field="version")
        calls: dict[tuple, list[dict[int, str]]] = {}
        lists: dict[tuple, list[dict[int, dict]]] = {}
        for number, call in enumerate(document["calls"]):
            try:
                key = shapes_key(call["op"], call["shapes"])
                slots = {int(slot): str(text) for slot, text in call["slots"].items()}
                members = {int(position): _list_members(entry) for position, entry in call.get("lists", {}).items()}
            except (KeyError, TypeError, ValueError) as exc:
                raise OpperfError(f"call {number} lacks op, shapes or slots, or has a malformed list ({exc})",
                                  path=path, field=f"calls[{number}]") from exc
            if slots:
                calls.setdefault(key, []).append(slots)
            if members:
                lists.setdefault(key, []).append(members)
        return cls(calls, lists)

    @staticmethod
    def _next(table: Mapping[tuple, list], seen: Counter, op: str, input_dims: Sequence):
        """The next recorded entry of this call's key in `table`, cyclic over the recorded ones (`seen` counts the
        key's trace calls so far), or None."""
        key = shapes_key(op, input_dims)
        recorded = table.get(key)
        if not recorded:
            return None
        seen[key] += 1
        return recorded[(seen[key] - 1) % len(recorded)]

    def next_lists(self, op: str, input_dims: Sequence) -> dict[int, dict] | None:
        """The long TensorLists (position → shapes, strides, dtype) of the next trace call of this key, cyclic over
        the recorded ones, or None."""
        return self._next(self.lists, self._lists_seen, op, input_dims)

    def next_call(self, op: str, input_dims: Sequence, slot_count: int) -> str | None:
        """The `;`-aligned cell of the next trace call of this key (cyclic over the recorded ones), or None."""
        slots = self._next(self.calls, self._seen, op, input_dims)
        if not slots or max(slots) >= slot_count:
            return None
        return ";".join(slots.get(index, "") for index in range(slot_count))


def _list_members(entry: Mapping) -> dict:
    """A recorded list's members, checked: as many strides as shapes, non-negative integers, a dtype name."""
    shapes = [[int(d) for d in shape] for shape in entry["shapes"]]
    strides = [[int(s) for s in stride] for stride in entry["strides"]]
    if len(strides) != len(shapes) or any(len(a) != len(b) for a, b in zip(shapes, strides)):
        raise ValueError("shapes and strides do not match")
    if any(d < 0 for shape in shapes for d in shape) or not isinstance(entry["dtype"], str):
        raise ValueError("a negative size or no dtype name")
    return {"shapes": shapes, "strides": strides, "dtype": entry["dtype"]}


def merge_calls(cells: Sequence[str]) -> str:
    """A row's cell from its calls' cells: per slot, the distinct values with their call counts, first seen first."""
    per_slot: list[Counter] = []
    for cell in cells:
        if not cell:
            continue
        parts = cell.split(";")
        per_slot.extend(Counter() for _ in range(len(parts) - len(per_slot)))
        for index, part in enumerate(parts):
            if part:
                per_slot[index][part] += 1
    return ";".join("|".join(f"{values}*{count}" for values, count in slot.items()) for slot in per_slot)


def slot_calls(cell: str, slot: int, *, where: str = "") -> list[tuple[list[int], int]]:
    """One slot of a row's cell as (values, calls) pairs; [] where the slot holds nothing."""
    parts = cell.split(";") if cell else []
    if slot >= len(parts) or not parts[slot]:
        return []
    pairs = []
    for entry in parts[slot].split("|"):
        values, star, count = entry.rpartition("*")
        if not star or not count.isdigit() or int(count) < 1:
            raise OpperfError(f"{where}: slot {slot} entry {entry[:60]!r} is not `values*calls`")
        pairs.append((parse_values(values, where=where), int(count)))
    return pairs


def variant_cycle(pairs: Sequence[tuple[list[int], int]], limit: int = MAX_VARIANTS) -> list[list[int]]:
    """The values to cycle through so that each recorded call's share of the timed calls is its share of the
    row's calls (counts reduced by their common divisor; at most `limit`, spread evenly)."""
    if not pairs:
        return []
    divisor = math.gcd(*(count for _, count in pairs))
    cycle = [values for values, count in pairs for _ in range(count // divisor)]
    limit = max(1, min(limit, MAX_VARIANTS))
    if len(cycle) > limit:
        step = len(cycle) / limit
        cycle = [cycle[int(i * step)] for i in range(limit)]
    return cycle
