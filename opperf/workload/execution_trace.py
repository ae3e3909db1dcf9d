"""The execution trace of a workload, recorded in a pass of its own and joined to the timed profile's op events.

What the execution trace is for — each op's tensor identities (the parse's input reuse distances,
opperf.parse.reuse) and its string arguments, which torch.profiler's Chrome trace does not hold — costs time on
the thread that runs the ops: `ExecutionTraceObserver` serialises every op's inputs inside the op's own
RecordFunction scope. Registered in the timed pass, that cost lands inside every op event torch.profiler times:
on the cpu back end the opperf-tiny workload's profiled op times were 1/0.283 = 3.5x (median per row) what the
same pass gives without it (`add` 5.3x, the cpu flash attention 7x, `mm` 1.4x), and on cuda the host side
stretched the trace's span from 309 to 525 ms (the GPU busy 75.6 % -> 44.5 % of it), an idle neighbourhood the
serving run never has around its kernels.

So the timed pass runs under torch.profiler alone, and the observer records a second, untimed pass of the same
workload (same inputs, same op sequence). The Chrome trace has no record function ids without an observer (they
are all 0), so the join is by order: the timed trace's `cpu_op` events in the order they started (their
`External id`, a per-op counter the profiler assigns at entry) against the execution trace's op nodes (scope 0,
aten ops and other RecordFunction-scoped functions) in the order of their record function ids, aligned by op name
(align_by_name: a MoE layer's calls may differ between two GPU passes). Each aligned event gets its node's id as
its `Record function id`, exactly the key the parse joins on when a user records both in one profiler session.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from opperf.errors import OpperfError
from opperf.io import write_text_atomic
from opperf.log import get_logger

log = get_logger("workload")

RECORD_FUNCTION_ID = "Record function id"
_FUNCTION_SCOPE = 0          # at::RecordScope::FUNCTION: an op call (aten or custom), as the Chrome trace's cpu_op


def record_execution_trace(run: Callable[[], object], path: Path) -> object:
    """Run `run()` under an ExecutionTraceObserver alone (no profiler timing anything); its trace goes to `path`."""
    from torch.profiler import ExecutionTraceObserver

    observer = ExecutionTraceObserver().register_callback(str(path))
    observer.start()
    try:
        return run()
    finally:
        observer.stop()
        observer.unregister_callback()


def tensor_shapes(node: dict) -> list:
    """The shapes of a node's tensor arguments (not lists, not scalars), in argument order."""
    inputs = node.get("inputs", {})
    return [shape for shape, type_name in zip(inputs.get("shapes", []), inputs.get("types", []))
            if str(type_name).startswith("Tensor(")]


def same_call(node: dict, name: str, input_dims: list) -> bool:
    """Whether an execution-trace node describes the Chrome trace's op event: same op, same tensor shapes."""
    types = node.get("inputs", {}).get("types", [])
    recorded = [dims for dims, type_name in zip(input_dims, types) if str(type_name).startswith("Tensor(")]
    return node.get("name") == name and tensor_shapes(node) == recorded


def _node_attr(node: dict, name: str):
    for attr in node.get("attrs", ()):
        if attr.get("name") == name:
            return attr.get("value")
    return None


def _op_nodes(nodes: list[dict]) -> list[dict]:
    """The execution trace's op calls (function scope) in the order they started (record function id)."""
    ops = [n for n in nodes if _node_attr(n, "scope") == _FUNCTION_SCOPE and _node_attr(n, "rf_id") is not None]
    return sorted(ops, key=lambda n: _node_attr(n, "rf_id"))


@dataclass(frozen=True)
class Join:
    """How the timed trace's op events met the execution trace's calls."""

    events: int          # cpu_op events of the timed trace
    calls: int           # op calls of the execution trace
    joined: int          # events aligned with a call of the same op (align_by_name)
    reshaped: int = 0    # of those, calls whose tensor shapes differ (a MoE router's split moved between passes)

    @property
    def complete(self) -> bool:
        return self.events == self.calls == self.joined


FULL_BELOW_BYTES = 2**20   # a file system with less free is full for a Chrome trace
RESYNC_WINDOW = 4          # names that must agree for the join to pick up again after calls only one pass ran
RESYNC_LOOKAHEAD = 4096


def align_by_name(events: list[str], calls: list[str]) -> list[tuple[int, int]]:
    """(event index, call index) pairs of two op sequences that are the same but for short runs only one of them
    has (a MoE expert that got tokens in one pass and none in the other): walk both, and where the names part,
    resume at the nearest offset from which RESYNC_WINDOW names agree again."""
    pairs, i, j = [], 0, 0
    while i < len(events) and j < len(calls):
        if events[i] == calls[j]:
            pairs.append((i, j))
            i, j = i + 1, j + 1
            continue
        for offset in range(1, RESYNC_LOOKAHEAD):
            if events[i + offset:i + offset + RESYNC_WINDOW] == calls[j:j + RESYNC_WINDOW]:
                i += offset
                break
            if events[i:i + RESYNC_WINDOW] == calls[j + offset:j + offset + RESYNC_WINDOW]:
                j += offset
                break
            if events[i + offset:i + offset + RESYNC_WINDOW] == calls[j + offset:j + offset + RESYNC_WINDOW]:
                i, j = i + offset, j + offset
                break
        else:
            i, j = i + 1, j + 1
    return pairs


def join_by_order(trace_events: list[dict], nodes: list[dict]) -> Join:
    """Give each `cpu_op` event of the timed trace (in place) the record function id of the execution-trace call it
    aligns with (align_by_name: the same op at the same place of the sequence); an event without one keeps no id
    (the parse then treats it as undescribed rather than joining it to another call's tensors). The same op may
    have other tensor shapes, and a few calls may be in one pass only: on a GPU a MoE router's split can move
    between two passes of the same inputs (atomic float sums reorder, a near-tie in top-k goes the other way), while
    the storages the ops read, which the reuse distances are made of, stay the same."""
    events = sorted((e for e in trace_events if e.get("cat") == "cpu_op"),
                    key=lambda e: (e.get("args", {}).get("External id", 0), e.get("ts", 0)))
    calls = _op_nodes(nodes)
    for event in events:
        event.setdefault("args", {}).pop(RECORD_FUNCTION_ID, None)
    reshaped = 0
    pairs = align_by_name([e.get("name") for e in events], [n.get("name") for n in calls])
    for i, j in pairs:
        args = events[i]["args"]
        args[RECORD_FUNCTION_ID] = _node_attr(calls[j], "rf_id")
        reshaped += not same_call(calls[j], events[i].get("name"), args.get("Input Dims") or [])
    return Join(len(events), len(calls), len(pairs), reshaped)


def _raise_if_full(directory: Path) -> None:
    """torch writes a Chrome trace on a full file system truncated, without an error: say what happened, as every
    other write does (ENOSPC), rather than that the trace is unreadable."""
    try:
        stats = os.statvfs(directory)
    except OSError:
        return
    if stats.f_bavail * stats.f_frsize < FULL_BELOW_BYTES:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory))


def join_to_trace(trace_path: Path, execution_trace_path: Path) -> Join:
    """Stamp the timed Chrome trace at `trace_path` with the record function ids of the execution trace recorded in
    a pass of its own (join_by_order), rewriting the trace atomically. A join that leaves more than a few calls out
    says the two passes ran other ops: that is an error, not a silent loss of the reuse distances."""
    try:
        trace = json.loads(trace_path.read_text(encoding="utf-8"))
        nodes = json.loads(execution_trace_path.read_text(encoding="utf-8"))["nodes"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _raise_if_full(trace_path.parent)
        raise OpperfError(f"cannot read the profile to join its execution trace: {exc}", path=trace_path) from exc
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise OpperfError("not a Chrome trace (no traceEvents list)", path=trace_path, field="traceEvents")
    result = join_by_order(events, nodes)
    if result.joined < 0.99 * result.events:
        raise OpperfError(f"the execution-trace pass ran other op calls than the timed pass: {result.joined} of the "
                          f"trace's {result.events} op events align with one of the execution trace's {result.calls} "
                          f"calls (is the workload deterministic?)",
                          path=execution_trace_path, field="rf_id")
    if not result.complete:
        log.warning("execution trace: %d of %d timed op events joined to the same op (%d calls recorded); the "
                    "others have no input reuse distances or string arguments", result.joined, result.events,
                    result.calls)
    if result.reshaped:
        log.warning("execution trace: %d joined calls ran with other tensor shapes in the untimed pass (a MoE "
                    "router's split moved): their reuse distances come from that pass's storages", result.reshaped)
    write_text_atomic(trace_path, json.dumps(trace))
    return result
