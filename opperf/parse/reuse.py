"""Input reuse distances from an execution trace: how much other data the device touched between each input
tensor's previous use and the call.

torch.profiler's Chrome trace records shapes, not tensor identities. Its ExecutionTraceObserver output
(`execution_trace.json`, written beside the trace by opperf.workload.profile; any user can record one the same
way) gives each op's tensors as (tensor id, storage id, offset, numel, itemsize, device), joined to the Chrome
trace's op events by the record function id. Walking the ops that launched device work in trace order, the last use
of every byte range is known, and so is the data touched since: the sum of the distinct bytes used after it (an LRU
stack distance, kept in a Fenwick tree over use times). A decode step's residual add reads one activation written
just before (distance ~0) and one written before the attention block streamed its weights (distance ≫ L2): replay
can hold in L2 exactly what an LRU cache of the device's size would.

The ranges are 1 MiB blocks of each storage, not whole storages: views of one storage are other data. A MoE layer's
experts are slices of one stacked weight; at storage granularity each expert's 24 MiB weight looked last used by
the expert before (12 MiB ago: resident), and the whole loop counted as one 24 MiB storage. The `moe` development
workload's expert GEMMs then replayed with their weight in L2 at 0.68-0.77x their profiled time (10.4 µs against
13.6 µs), and read cold they take 13.4 µs (benchmarks/results/weight_rotation/). A slot's distance is the median of
its blocks' distances, weighted by the bytes it uses in each (a block it shares with a neighbour's slice counts for
the shared bytes only).

A grouped GEMM (a MoE layer's expert GEMMs in one kernel) writes each group's rows while it streams that group's
weights, so its output's first bytes lie behind the rest of its inputs: the byte at fraction x of the output behind
(1 - x) of the op's input bytes (each block at its midpoint). Qwen2-MoE's expert GEMM streams 692 MB of weights while
it writes 0.25-44 MiB; the memcpy that clones that output (masked_fill's) ran in the workload at the time of a cold
source, and replayed with the source resident at 0.63-0.83x (1.18-1.24x for the 16-44 MiB ones, the rewrite
thrashing L2); read cold, 0.91-1.04 (benchmarks/results/small_kernels/copy_state/). Other producers are not charged:
a single-wave GEMM writes its output last, and an elementwise op's output tail is resident when its consumer runs;
charging every op that way made Phi-3-mini's prefill `mean` input cold where the workload read its tail from L2.

A gather (`index_select`, `embedding`, `gather`, `index`) reads only the rows its output holds, not its table: the
rows read count as that much new data, and the table's blocks keep their last use. Counted whole, the 4 MiB
embedding table a decode step reads 4 rows of put the opperf-tiny decode GEMVs' weights 13-14 MiB behind their
previous use instead of 9-10; on the H200 the rule moves no development workload row's resident bytes
(benchmarks/results/dev_gates_reuse/gather_rule/).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from opperf.errors import OpperfError
from opperf.workload.execution_trace import same_call, tensor_shapes  # noqa: F401  (the parse's join)

MIB = 2**20
BLOCK_BYTES = MIB         # the unit of the LRU stack: views of one storage that do not share a block are other data
GROUPED_PRODUCERS = frozenset({"aten::_grouped_mm", "aten::_scaled_grouped_mm"})   # write while streaming weights
GATHERS = frozenset({"aten::index_select", "aten::embedding", "aten::gather", "aten::index"})   # input 0: the table


def _storage(value, device_prefix: str) -> tuple[int, int, int] | None:
    """(storage id, byte offset, bytes) of one ET tensor value [tensor id, storage id, offset (elements), numel,
    itemsize, device]."""
    if not (isinstance(value, list) and len(value) >= 6 and all(isinstance(v, int) for v in value[:5])):
        return None
    if device_prefix and not str(value[5]).startswith(device_prefix):
        return None         # a host tensor in a device workload (a wrapped scalar): never in the device cache
    return value[1], value[2] * value[4], value[3] * value[4]


def _blocks(storage: tuple[int, int, int]) -> list[tuple[tuple[int, int], int]]:
    """((storage id, block index), bytes of the block the range uses) for every block the byte range covers."""
    sid, start, nbytes = storage
    end = start + max(nbytes, 1)
    return [((sid, block), min(end, (block + 1) * BLOCK_BYTES) - max(start, block * BLOCK_BYTES))
            for block in range(start // BLOCK_BYTES, (end - 1) // BLOCK_BYTES + 1)]


def _weighted_median(distances: list[tuple[float, int]]) -> float:
    ordered = sorted(distances)
    half, seen = sum(weight for _, weight in ordered) / 2, 0
    for distance, weight in ordered:
        seen += weight
        if seen >= half:
            return distance
    return ordered[-1][0]


def slot_storages(values: list, types: list, device_prefix: str = "") -> list[tuple[int, int, int] | None]:
    """Per row slot (a tensor list is one slot per member, as the parse lays out Input Shapes), its storage and
    byte range."""
    slots: list[tuple[int, int, int] | None] = []
    for value, type_name in zip(values, types):
        if str(type_name).startswith("Tensor"):
            slots.append(_storage(value, device_prefix))
        elif "Tensor" in str(type_name) and isinstance(value, list):
            slots += [_storage(member, device_prefix) for member in value]
        else:
            slots.append(None)
    return slots


class _Fenwick:
    def __init__(self, size: int):
        self.tree = [0] * (size + 1)

    def add(self, index: int, delta: int) -> None:
        index += 1
        while index < len(self.tree):
            self.tree[index] += delta
            index += index & -index

    def prefix(self, index: int) -> int:
        """Sum of positions [0, index)."""
        total = 0
        while index > 0:
            total += self.tree[index]
            index -= index & -index
        return total


def load_nodes(path: Path) -> dict[int, dict]:
    """Execution-trace nodes by record function id (the Chrome trace's `Record function id`)."""
    try:
        nodes = json.loads(path.read_text(encoding="utf-8"))["nodes"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise OpperfError(f"not a readable execution trace: {exc}", path=path) from exc
    by_rf = {}
    for node in nodes:
        for attr in node.get("attrs", ()):
            if attr.get("name") == "rf_id":
                by_rf[attr["value"]] = node
                break
    return by_rf


def _streamed_bytes(node: dict, inputs: list) -> float:
    """The input bytes a grouped GEMM streams while it writes its output (0 for any other op): its rows and the
    weights of the groups that got rows, at most one group per row (a decode step's 4 routed rows read 4 of 60
    experts)."""
    if node.get("name") not in GROUPED_PRODUCERS:
        return 0.0
    total = sum(dict(block for blocks in inputs if blocks is not None for block in blocks).values())
    shapes = tensor_shapes(node)
    if len(shapes) >= 2 and len(shapes[0]) == 2 and len(shapes[1]) == 3 and inputs[1] is not None:
        rows, groups = shapes[0][0], shapes[1][0]
        weights = sum(used for _, used in inputs[1])
        total -= weights * (1 - min(1.0, rows / max(groups, 1)))
    return total


def _gathered_bytes(node: dict, inputs: list, outputs: list) -> int | None:
    """The bytes a gather reads of its table (input 0): what its output holds, at most the table; None for any other
    op or a gather whose table is not device data."""
    if node.get("name") not in GATHERS or not inputs or inputs[0] is None:
        return None
    table = sum(used for _, used in inputs[0])
    return min(table, sum(used for blocks in outputs for _, used in blocks))


def _charge_producer(behind: dict, inputs: list, outputs: list, streamed: float) -> None:
    """Record, for each block this op writes, the input bytes it streamed after writing it (only a grouped GEMM
    streams any); any use of a block ends what an earlier producer left behind it."""
    for blocks in [b for b in inputs if b is not None] + outputs:
        for block, _ in blocks:
            behind.pop(block, None)
    written = [block for blocks in outputs for block, _ in blocks]
    for position, block in enumerate(written if streamed else ()):
        behind[block] = streamed * (1 - (position + 0.5) / len(written))


def reuse_distances(nodes: dict[int, dict], calls: list[int | None], device_prefix: str = "") -> list[str | None]:
    """For each call (its record function id, in device order), the Input Reuse Distance field: per slot the MiB
    touched since the slot's bytes were last used, `inf` if it was not used before, empty for non-tensor slots;
    None for a call the execution trace does not have."""
    plans = []
    for rf_id in calls:
        node = nodes.get(rf_id) if rf_id is not None else None
        if node is None:
            plans.append(None)
            continue
        inputs = [None if s is None else _blocks(s) for s in
                  slot_storages(node["inputs"].get("values", []), node["inputs"].get("types", []), device_prefix)]
        outputs = [_blocks(s) for s in slot_storages(node["outputs"].get("values", []),
                                                     node["outputs"].get("types", []), device_prefix) if s is not None]
        plans.append((inputs, outputs, _streamed_bytes(node, inputs), _gathered_bytes(node, inputs, outputs)))
    uses = sum(1 for p in plans if p is not None for s in p[0] + p[1] if s is not None)
    tree, last, size, now = _Fenwick(uses), {}, {}, 0
    behind: dict[tuple[int, int], float] = {}       # input bytes a grouped GEMM streamed after writing the block
    fields: list[str | None] = []
    for plan in plans:
        if plan is None:
            fields.append(None)
            continue
        inputs, outputs, streamed, gathered = plan
        total = tree.prefix(now)
        texts = []
        for blocks in inputs:
            if blocks is None:
                texts.append("")
                continue
            distance = _weighted_median([(total - tree.prefix(last[block] + 1) + behind.get(block, 0.0)
                                          if block in last else math.inf, used) for block, used in blocks])
            texts.append("inf" if distance == math.inf else f"{distance / MIB:.6g}")
        fields.append(";".join(texts))
        _charge_producer(behind, inputs, outputs, streamed)
        for slot, blocks in enumerate([b for b in inputs if b is not None] + outputs):
            if slot == 0 and gathered is not None:  # a gather's table: the rows read are new data, the rest stays
                tree.add(now, gathered)
                now += 1
                continue
            for block, used in blocks:            # one use time per tensor: its own blocks are not "since"
                if block in last:
                    tree.add(last[block], -size[block])
                size[block] = max(size.get(block, 0), used)
                last[block] = now
                tree.add(now, size[block])
            now += 1
    return fields
