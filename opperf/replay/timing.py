"""Timers: how one replay case's calls are measured on each back end (names in `opperf.replay.methods`).

- cpu: the op's own wall time as torch.profiler records it: the way the parse stage timed the op inside the
  workload, in one profiler session over a batch of rows (the wall clock around the Python call, Python binding
  and dispatch included, replayed the demo at a 40.0 % median gap against 27.5 %: benchmarks/results/cpu_replay/).
- cuda: per call, the device-kernel time CUPTI records for the kernels the call launched. The timer keeps one
  torch.profiler session open over a batch of rows and reads the raw Kineto events once at the end: each call
  runs in a `record_function` range of its own row, each kernel is attributed to the range around the op that
  launched it.
- npu: the calls run here, the timing comes from the msprof session around the whole process
  (`opperf.replay.npu`), so this timer only executes them.

The cache state before each timed call (`CacheState`, shared by the cuda and npu timers) is insitu
(`methods.CACHE_POLICY`); its description is recorded per row in `Replay L2 Policy`.
"""

from __future__ import annotations

import bisect
import math
import time
from pathlib import Path
from collections.abc import Hashable
from typing import Any

import torch

from opperf.errors import DeviceUnavailableError, OpperfError
from opperf.replay.inputs import ReplayCase, storage_extent
from opperf.replay.residency import MIB, resident_bytes
from opperf.replay.methods import (CACHE_POLICY, DEFAULT_HEATER_MIN_POWER_W, METHOD_CPU_PROFILER, METHOD_CUDA_KERNEL,
                                   METHOD_SESSION, POWER_POLICY, RepeatBudget, TimingResult)

NPU_DEFAULT_L2_BYTES = 192 * 2**20      # Ascend 910B/910C L2, where torch_npu's properties do not say


def _set_cpu_threads(threads: int | None) -> int:
    if threads is not None:
        if threads < 1:
            raise OpperfError(f"must be >= 1, got {threads}", field="--cpu-threads")
        torch.set_num_threads(threads)
    return torch.get_num_threads()


class RangeSession:
    """One torch.profiler session over a batch of rows; each row's timed calls run in ranges of their own.

    `range_name(key, repeat_count, policy)` opens the session if needed and names the row's range;
    `ran(name, calls, repetitions)` says how many calls a row whose count a budget chose did run, and why;
    `collect(attribute, method)` stops it and turns `attribute(events, prefix)` (per range token, one sample
    per call) into each row's TimingResult. A row whose calls did not all get a sample fails alone
    (`strict=False`) or fails the batch (`strict=True`).
    """

    PREFIX = "opperf_replay#"

    def __init__(self, activities: list, *, record_shapes: bool = False, strict: bool = False):
        self.activities, self.record_shapes, self.strict = activities, record_shapes, strict
        self._profiler = None
        # range token -> (key, repeat count, policy, repetitions note)
        self._pending: dict[int, tuple[Hashable, int, str, str]] = {}

    def range_name(self, key: Hashable, repeat_count: int, policy: str, repetitions: str = "") -> str:
        if self._profiler is None:
            from torch.profiler import profile

            self._profiler = profile(activities=self.activities, record_shapes=self.record_shapes)
            self._profiler.__enter__()
        token = len(self._pending)
        self._pending[token] = (key, repeat_count, policy, repetitions)
        return f"{self.PREFIX}{token}"

    def ran(self, name: str, calls: int, repetitions: str) -> None:
        """The row of range `name` ran `calls` timed calls (a budget stopped it): its samples must number as many."""
        token = int(name[len(self.PREFIX):])
        key, _, policy, _ = self._pending[token]
        self._pending[token] = (key, calls, policy, repetitions)

    def close(self) -> None:
        """Stop the session without reading it (its calls failed)."""
        profiler, self._profiler, self._pending = self._profiler, None, {}
        if profiler is not None:
            profiler.__exit__(None, None, None)

    def collect(self, attribute, method: str) -> dict[Hashable, TimingResult]:
        results: dict[Hashable, TimingResult] = {}
        if self._profiler is None:
            return results
        profiler, pending = self._profiler, self._pending
        self._profiler, self._pending = None, {}
        profiler.__exit__(None, None, None)
        per_token = attribute(profiler.profiler.kineto_results.events(), self.PREFIX)
        for token, (key, repeat_count, policy, repetitions) in pending.items():
            samples = per_token.get(token, [])
            if len(samples) == repeat_count:
                results[key] = TimingResult(samples, method, policy, repetitions=repetitions)
            elif self.strict:
                raise OpperfError(f"the profiler reported {len(samples)} call ranges for {repeat_count} calls")
        return results


CPU_MAX_COLD_COPIES = 64


def cpu_last_level_cache_bytes() -> int:
    """The largest cache sysfs lists for cpu0 (the last level); 32 MiB where it lists none."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    largest = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
            largest = max(largest, int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
        except (OSError, ValueError):
            continue
    return largest or 32 * 2**20


def cpu_cold_turns(case: ReplayCase, cache_bytes: int) -> tuple[list[ReplayCase], str]:
    """The cases a CPU row's calls take in turn, and the cache state they stand for.

    Where the profile measured the inputs' reuse distances (`case.reuse`: the MiB the workload touched since each
    input was last used), the calls take turns over as many copies of the reused inputs as put that distance
    between two calls of one copy: an LRU cache of any size then holds of each input what it held in the workload.
    Real CPU caches are not LRU and learn a cycle of copies over tens of calls (benchmarks/results/cpu_replay/
    copies_in_turn/). On the idle 16-core Xeon (300 MiB L3) the demo's GEMMs replay this way at a median 1.06-1.16
    of their profile over two runs and its lm_head bmm at 1.03-1.35, against 1.18 and 0.69 with the weight always
    cold (copies spanning twice the last-level cache: the weights' 10-16 MiB distance fits that cache); warm (one
    copy) the GEMMs ran at 0.66 on the 2-core EPYC VM. An input first
    used in the step (distance inf), or one past twice the cache, is cold. Without distances (a profile with no
    execution trace) the inputs the definition marks `cache: cold` (F.linear's weight) take turns over copies
    spanning twice the last-level cache. Inputs with no distance to cover (under half their size) stay shared: the
    previous call left them in cache, as the op that wrote them did in the workload."""
    tensors = [t for t in case.tensors() if t.numel()]
    warm = {id(t) for t in case.warm_tensors()}
    if case.reuse:
        gap = {id(t): case.reuse.get(id(t), 0.0 if id(t) in warm else math.inf) * MIB for t in tensors}
        nbytes = {id(t): storage_bytes([t]) for t in tensors}
        reused = [t for t in tensors if gap[id(t)] >= nbytes[id(t)] / 2]
        size = storage_bytes(reused)
        if not reused or not size:
            return [case], "reuse distances: none to cover"
        if any(math.isinf(gap[id(t)]) for t in reused):
            span, what = 2 * cache_bytes, "first use in the step"
        else:
            span = min(sum(gap[id(t)] * nbytes[id(t)] for t in reused) / size, 2 * cache_bytes)
            what = f"reuse distance {span / MIB:.1f} MiB"
        turns = cold_input_copies(case, reused, cache_bytes, CPU_MAX_COLD_COPIES, CPU_MAX_COLD_COPIES,
                                  copies=max(2, 1 + math.floor(span / size + 0.5)))
        if len(turns) == 1:         # each reused input has recorded values or shares its storage: left as it is
            return turns, f"reused inputs ({what}): not copied (recorded values or a shared storage)"
        return turns, (f"reused inputs ({what}): {len(turns)} copies in turn, "
                       f"{storage_bytes(reused) * len(turns) / MIB:.1f} MiB (last-level cache {cache_bytes // MIB} MiB)")
    cold = [t for t in tensors if id(t) not in warm]
    turns = cold_input_copies(case, cold, cache_bytes, CPU_MAX_COLD_COPIES, CPU_MAX_COLD_COPIES) if cold else [case]
    if len(turns) == 1:
        return turns, "none"
    return turns, (f"cold inputs: {len(turns)} copies in turn, {storage_bytes(cold) * len(turns) / MIB:.1f} MiB "
                   f"(last-level cache {cache_bytes // MIB} MiB)")


class CpuProfilerTimer:
    """Each call's time as torch.profiler records the op's CPU event: how the profile timed the op.

    The parse stage gives a CPU-trace row the wall time of the innermost compute op's event, recorded
    with `record_shapes=True`; this timer takes the same number for the replayed call. One profiler
    session (CPU activity, record_shapes) spans every call measured until `collect()`; each timed
    call runs in a `record_function` range of its own row, and its sample is the summed duration of the
    ops at the top of that range (the op the row stands for; ops nested inside it have rows of their
    own in the parse). Warm-up calls run outside the session. Inputs the definition marks cold take turns over
    copies (`cpu_cold_turns`); the rest are left warm.
    """

    backend = "cpu"

    def __init__(self, threads: int | None = None, record_shapes: bool = True):
        from torch.profiler import ProfilerActivity

        self.cache_bytes = cpu_last_level_cache_bytes()
        shapes = "record_shapes" if record_shapes else "no record_shapes"
        self.method = (f"{METHOD_CPU_PROFILER.replace('record_shapes', shapes)}, "
                       f"{_set_cpu_threads(threads)} threads")
        # A call that ran no op the profiler records: its row alone gets no samples (failed_run).
        self.session = RangeSession([ProfilerActivity.CPU], record_shapes=record_shapes)

    def synchronize(self) -> None:
        return None

    def close(self) -> None:
        return None

    def measure(self, case: ReplayCase, warmup_count: int, repeat_count: int, key: Hashable, *,
                budget: RepeatBudget | None = None) -> None:
        """`budget`: after each timed call, stop once the calls' wall time (the samples come only at collect) has
        spent it; the spread does not stop a row here."""
        from torch.profiler import record_function

        turns, policy = cpu_cold_turns(case, self.cache_bytes)
        for call in range(warmup_count):
            turns[call % len(turns)].run()
        name = self.session.range_name(key, repeat_count, policy)
        if budget is None:
            for call in range(repeat_count):
                case = turns[(warmup_count + call) % len(turns)]
                case.next_values()
                with record_function(name):
                    case.run()
            return
        clock, spent_ns, calls, reason = time.perf_counter_ns, 0, 0, None
        while reason is None:
            case = turns[(warmup_count + calls) % len(turns)]
            case.next_values()
            start = clock()
            with record_function(name):
                case.run()
            spent_ns += clock() - start
            calls += 1
            reason = budget.stop_reason(calls, repeat_count, spent_ns / 1000.0)
        self.session.ran(name, calls, budget.note(calls, reason, repeat_count, spent_us=spent_ns / 1000.0))

    def collect(self) -> dict[Hashable, TimingResult]:
        """Stop the session and return every key's samples (each call's top-level op time)."""
        return self.session.collect(range_cpu_op_times, self.method)


def range_cpu_op_times(events, prefix: str) -> dict[int, list[float]]:
    """Per range token (`<prefix><token>`), each range instance's summed top-level CPU op time in µs.

    `events`: Kineto events (`_KinetoEvent`). A range with no op inside gives no sample (the caller checks
    the count).
    """
    ranges, ops = _ranges_and_ops(events, prefix)
    totals, found = [0] * len(ranges), [False] * len(ranges)
    for (start, end, _, _), position in _top_level_ops(ranges, ops):
        totals[position] += end - start
        found[position] = True
    per_token: dict[int, list[float]] = {}
    for (_, _, _, token), total, seen in zip(ranges, totals, found):
        if seen:
            per_token.setdefault(token, []).append(total / 1000.0)
    return per_token


def _ranges_and_ops(events, prefix: str) -> tuple[list[tuple[int, int, int, int]], list[tuple[int, int, int, int]]]:
    """The replay's call ranges (start, end, thread, token), sorted, and the launching CPU ops (start, end,
    thread, correlation id) of a Kineto event list; runtime API calls (cudaLaunchKernel, ...) are neither."""
    cpu_type = torch.autograd.DeviceType.CPU
    ranges, ops = [], []
    for event in events:
        if event.device_type() != cpu_type or event.linked_correlation_id() != 0:
            continue
        name = event.name()
        if name.startswith(prefix):
            ranges.append((event.start_ns(), event.end_ns(), event.start_thread_id(), int(name[len(prefix):])))
        else:
            ops.append((event.start_ns(), event.end_ns(), event.start_thread_id(), event.correlation_id()))
    ranges.sort()
    return ranges, ops


def _top_level_ops(ranges, ops):
    """(op, range position) for each op at the top of a call range: it starts inside the range, on its
    thread, ends inside it, and lies in no earlier op of that range (the op the call made; the ops nested
    in it have rows of their own in the parse stage)."""
    starts = [r[0] for r in ranges]
    covered_until: dict[int, int] = {}
    for op in sorted(ops, key=lambda o: (o[0], -o[1])):
        start, end, thread, _ = op
        position = bisect.bisect_right(starts, start) - 1
        if position < 0 or start > ranges[position][1] or end > ranges[position][1] or thread != ranges[position][2]:
            continue
        if start >= covered_until.get(position, -1):
            covered_until[position] = end
            yield op, position


def _ops_in_ranges(ranges, ops):
    """(op, range position) for every op inside a call range, on its thread, nested or not."""
    starts = [r[0] for r in ranges]
    for op in ops:
        start, end, thread, _ = op
        position = bisect.bisect_right(starts, start) - 1
        if position >= 0 and end <= ranges[position][1] and thread == ranges[position][2]:
            yield op, position


def _clone_case(case: ReplayCase, only: set[int]) -> ReplayCase:
    """A copy of the case with fresh copies of only the inputs whose id is in `only` (the others shared); an input
    with recorded values keeps cycling through them in the copy. Each copy keeps its input's layout (clone_layout): a contiguous copy of a strided view (rotate_half's
    `x[..., 64:]`, a KV-cache slice) runs a different, faster kernel, as the first GPU run of cold copies showed
    (benchmarks/results/whole_order/: neg and copy_ rows at 0.55-0.68x)."""
    copies: dict[int, torch.Tensor] = {}
    storages: dict[int, torch.UntypedStorage] = {}

    def clone(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if id(value) not in only:
                return value
            copies[id(value)] = clone_layout(value, storages)
            return copies[id(value)]
        if isinstance(value, (list, tuple)):
            return type(value)(clone(v) for v in value)
        return value
    copy = ReplayCase(fn=case.fn, args=tuple(clone(a) for a in case.args),
                      kwargs={k: clone(v) for k, v in case.kwargs.items()}, description=case.description)
    copy.value_variants = [(copies.get(id(target), target), variants) for target, variants in case.value_variants]
    return copy


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages under `tensors`: what copying them by clone_layout allocates."""
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def clone_layout(tensor: torch.Tensor, storages: dict[int, torch.UntypedStorage] | None = None) -> torch.Tensor:
    """A copy of `tensor` over a fresh storage of its storage's size, at the same offset and strides (its kernel
    sees the same layout and alignment; `Tensor.clone` makes a non-dense view contiguous). Inputs cloned with one
    `storages` map that shared a storage share the new one."""
    storages = {} if storages is None else storages
    source = tensor.untyped_storage()
    key = source.data_ptr()
    if key not in storages:
        storages[key] = source.clone()
    return torch.empty(0, dtype=tensor.dtype, device=tensor.device).set_(
        storages[key], tensor.storage_offset(), tensor.shape, tensor.stride())


def cold_input_copies(case: ReplayCase, cold: list[torch.Tensor], l2_bytes: int, calls: int,
                      max_copies: int = 16, copies: int | None = None) -> list[ReplayCase]:
    """The case, then copies of it whose `cold` inputs are fresh tensors and every other input shared, to run in
    turn: in an in-order replay (opperf.replay.phase) a row's calls on one weight would find it in L2 where the
    workload's calls of that row read different weights (Qwen2-MoE's q, k and v projections: one `addmm` row per
    token count, 0.88-0.93x in order). As many copies as the row has calls, at most `max_copies`, and no more than
    twice the cache holds of those inputs; none for inputs whose values are recorded (the timer writes them) or
    that share storage with another input. `copies`: that many instead (a count the caller chose), within the same
    bounds."""
    targets = {target.untyped_storage().data_ptr() for target, _ in case.value_variants}
    storages = [t.untyped_storage().data_ptr() for t in case.tensors()]
    rotating = [t for t in cold if t.untyped_storage().data_ptr() not in targets
                and storages.count(t.untyped_storage().data_ptr()) == 1]
    size = storage_bytes(rotating)
    if not rotating or not size:
        return [case]
    count = min(max_copies, calls, max(1, -(-2 * l2_bytes // size) if copies is None else copies))
    only = {id(t) for t in rotating}
    return [case] + [_clone_case(case, only) for _ in range(count - 1)]


def storage_bytes_view(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 tensor over exactly the bytes of `tensor`'s storage that its view spans."""
    start = tensor.storage_offset() * tensor.element_size()
    length = storage_extent(tensor.shape, tensor.stride()) * tensor.element_size()
    return torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(tensor.untyped_storage(), start, (length,))


SPARSE_VIEW_SPAN = 8        # a view spanning more than this many times its elements' bytes is warmed element-wise
_SAME_SIZE_INTEGER = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _sparse_view(tensor: torch.Tensor, span: float) -> bool:
    """Whether `tensor` is a strided view with no element twice (no stride 0, no overlap) whose elements fill less
    than 1/span of the bytes it spans: a slice of a fused output, as rotary's q/k halves of a QKV GEMM."""
    dims = sorted((stride, size) for size, stride in zip(tensor.shape, tensor.stride()) if size > 1)
    if not dims or tensor.element_size() not in _SAME_SIZE_INTEGER:
        return False
    reach = 1
    for stride, size in dims:
        if stride < reach:
            return False
        reach = stride * size
    return storage_extent(tensor.shape, tensor.stride()) > span * tensor.numel()


def warm_target(tensor: torch.Tensor, span: float = SPARSE_VIEW_SPAN) -> torch.Tensor:
    """What the insitu cache state makes resident of an input: the bytes its view spans, or for a sparse strided
    view its own elements (as an integer view of the same element size, so that the in-place rewrite keeps every
    bit). Rewriting a sparse view's span would bring lines the kernel never reads into the cache: on the reference
    decoder a rotary half of the 4,096-token QKV output spans 75 MB, more than an H200's L2. Measured on CUDA only:
    an npu keeps the span."""
    if tensor.device.type != "npu" and _sparse_view(tensor, span):
        return tensor.view(_SAME_SIZE_INTEGER[tensor.element_size()])
    return storage_bytes_view(tensor)


def resident_tail(target: torch.Tensor, keep: int) -> torch.Tensor:
    """The last `keep` bytes of `target` (warm_target's): what an LRU cache still holds of it. A strided view keeps
    its last indices along its outermost dimension, the highest addresses."""
    nbytes = target.numel() * target.element_size()
    if keep >= nbytes:
        return target
    if target.dim() == 1 and target.is_contiguous():
        return target[target.numel() - keep // target.element_size():]
    dim = max((d for d in range(target.dim()) if target.shape[d] > 1), key=lambda d: target.stride(d))
    size = target.shape[dim]
    count = max(1, -(-keep * size // nbytes))
    return target.narrow(dim, size - count, count)


class CacheState:
    """Puts the device cache in the insitu state before each timed call; says what it did.

    First a flush: read a buffer of twice the cache. Everything else leaves, dirty lines are
    written back here, and what stays is clean: a flush by writing would leave the cache full of dirty
    lines whose write-back the timed kernel pays (an H100 decode GEMM streaming a cold 105 MB weight
    ran 24 % slower after a zeroing flush than inside the workload).
    Then each warm input's bytes are rewritten by copying them from a twin (values unchanged, lines resident
    and dirty, as the previous kernel's output left them): the kernel that wrote the input inside the workload
    read about as much as it wrote, interleaved with its writes (a gather, an elementwise op), and that traffic
    competes for the cache (benchmarks/results/topk_sum/: a MoE layer's 24 MiB top-k reduction took 12.85 µs
    after its producing gather, 10.56 µs after an in-place rewrite, 12.33 µs after a gather in replay's state).
    Inputs whose recorded values change between calls are rewritten in place. Weights stay cold. What is rewritten
    of an input is the bytes its view spans, or for a view spanning over SPARSE_VIEW_SPAN times its elements (a
    slice of a fused output) the elements themselves (`warm_target`); by the reuse distance, the tail of either.
    """

    def __init__(self, device: torch.device, l2_bytes: int):
        self.device, self.l2_bytes = device, int(l2_bytes)
        self._flush_buffer: torch.Tensor | None = None
        self._twins: dict[int, torch.Tensor] = {}     # insitu: id(view) -> a copy of its bytes
        self.cold: list[torch.Tensor] = []            # the last plan's inputs kept cold (none resident)

    warm_target = staticmethod(warm_target)   # what of an input is made resident (a probe may override it)

    def flush(self) -> None:
        if self._flush_buffer is None:
            self._flush_buffer = torch.ones(2 * self.l2_bytes // 4, dtype=torch.int32, device=self.device)
        self._flush_buffer.sum()

    def plan(self, case: ReplayCase) -> tuple[list[ReplayCase], list[torch.Tensor], str]:
        """The cases to cycle through, the byte views to make resident before each call, and the description."""
        cache = f"L2 {self.l2_bytes // 1024} KiB"
        flush_mib = 2 * self.l2_bytes // 2**20
        views, seen = [], set()
        self._twins = {}
        self.cold = []
        warm = {id(t) for t in case.warm_tensors()}
        by_reuse = warm_inputs = cold_inputs = 0
        for tensor in case.tensors():
            if tensor.device != self.device or tensor.numel() == 0:
                continue
            target = self.warm_target(tensor)
            nbytes = target.numel() * target.element_size()
            if id(tensor) in case.reuse:      # measured in the workload: what an LRU cache still holds of it
                by_reuse += 1
                keep = resident_bytes(nbytes, case.reuse[id(tensor)], self.l2_bytes)
            else:                             # the definition's guess: warm activations, cold weights
                keep = min(nbytes, self.l2_bytes) if id(tensor) in warm else 0
            if keep == 0:
                cold_inputs += 1
                self.cold.append(tensor)
                continue
            warm_inputs += 1                  # one rewrite may serve several inputs (the same tensor twice)
            view = resident_tail(target, keep)
            identity = (view.untyped_storage().data_ptr(), view.storage_offset(), tuple(view.shape),
                        view.stride(), view.dtype)
            if identity not in seen:
                seen.add(identity)
                views.append(view)
        warm_bytes = sum(v.numel() * v.element_size() for v in views)
        source = f", {by_reuse} placed by the workload's reuse distances" if by_reuse else ""
        # Not the inputs whose recorded values change between calls (ReplayCase.next_values): a twin would put the
        # first call's values back; they keep the in-place rewrite.
        varying = {target.untyped_storage().data_ptr() for target, _ in case.value_variants}
        self._twins = {id(view): view.clone() for view in views if view.untyped_storage().data_ptr() not in varying}
        how = (f"rewritten into L2, {len(self._twins)} by a copy from a twin (its producer's reads interleaved), "
               f"{len(views) - len(self._twins)} in place")
        return [case], views, (f"{CACHE_POLICY}: flush (read {flush_mib} MiB), then {warm_inputs} warm input(s) "
                               f"({warm_bytes / 2**20:.2f} MiB) {how}, {cold_inputs} cold input(s){source} "
                               f"before each call ({cache})")

    def prepare(self, views: list[torch.Tensor], neighbour=None) -> None:
        """Flush, run `neighbour` (the heater GEMM the power policy puts before a short call), then make the warm
        inputs resident: the neighbour cannot evict them."""
        self.flush()
        if neighbour is not None:
            neighbour()
        self.rewrite(views)

    def rewrite(self, views: list[torch.Tensor]) -> None:
        """Make the warm inputs resident as their producer left them: a copy from the twin, else in place.
        Without the flush it is what an in-order phase replay runs before a call (opperf.replay.phase)."""
        for view in views:
            twin = self._twins.get(id(view))
            if twin is None:
                view.mul_(1)
            else:
                view.copy_(twin)


def cuda_device(device: str | torch.device) -> torch.device:
    """`device` with its index: plain `cuda` is the current device (the L2 size and the caches are per device)."""
    target = torch.device(device)
    return target if target.index is not None else torch.device("cuda", torch.cuda.current_device())


def device_l2_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).L2_cache_size)
    if device.type == "npu":
        properties = torch.npu.get_device_properties(device)
        return int(getattr(properties, "L2_cache_size", 0) or NPU_DEFAULT_L2_BYTES)
    return 0


class CudaTimer:
    """Device-kernel time per call (CUPTI, through torch.profiler), in the insitu cache state and the after-gemm power
    state.

    One profiler session spans every call measured until `collect()`. A call runs in a `record_function` range
    named after its case; a kernel belongs to the range that contains the CPU op whose correlation id the kernel's
    record links to (the op that launched it). A call's sample is the sum of its kernels' durations. The cache
    preparation and the heater run outside the ranges. Validated against CUDA events on an H200
    (benchmarks/results/cuda_replay_check/).

    Power state (after-gemm, methods.POWER_POLICY): a call of `COOLDOWN_MIN_US` or more is followed by as much idle
    time as it took. Inside a model a long GEMM alternates with lighter kernels; back to back it holds the GPU at its
    power limit and the clock drops (measured on an H100: 8192x5120x51200 bf16 went from 5.40 to 6.42 ms over 30
    calls back to back, 5.52 ms with equal idle gaps, 5.43 ms inside the workload;
    benchmarks/results/cuda_replay/cuda_power_probe.json). The call's length is the row's profiled time where it
    has one, else the warm-up calls' event time. A shorter call gets one heater GEMM before it, unless the workload
    ran it on a nearly idle GPU (`rested_in_workload`).
    """

    backend = "cuda"
    COOLDOWN_MIN_US = 200.0
    heater_min_power_w: float = DEFAULT_HEATER_MIN_POWER_W
    unprofiled_power_w: float | None = None          # the power taken for rows without a profiled one

    def __init__(self, device: str | torch.device = "cuda", heater_min_power_w: float = DEFAULT_HEATER_MIN_POWER_W,
                 unprofiled_power_w: float | None = None):
        if not torch.cuda.is_available():
            raise DeviceUnavailableError("back end cuda asked for, but torch.cuda.is_available() is False "
                                         f"(torch {torch.__version__}, CUDA build {torch.version.cuda})")
        self.device = cuda_device(device)
        self.cache = CacheState(self.device, device_l2_bytes(self.device))
        from torch.profiler import ProfilerActivity

        self.session = RangeSession([ProfilerActivity.CPU, ProfilerActivity.CUDA], strict=True)
        # The SM clock and power the timed calls ran at (NVML, when readable): per row, beside the profiled ones.
        # The sampler's thread runs until close().
        from opperf.workload.power import NvmlSampler

        self.power = NvmlSampler.start_if_available(self.device.index)
        self._windows: dict[Hashable, tuple[float, float]] = {}
        self.heater_min_power_w = heater_min_power_w
        self.unprofiled_power_w = unprofiled_power_w
        self._heaters: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}    # by size n (n^3 GEMM)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def close(self) -> None:
        """Stop the NVML sampler. A persistent server makes a timer per job, and each sampler left running polls
        at 500 Hz and grows its sample list: the likely cause of a replay after another workload's taking 4-7x as
        long (benchmarks/results/unseen_gates/h100_grouped_producer/; not re-measured since the fix)."""
        if self.power is not None:
            self.power.stop()
            self.power = None

    def measure(self, case: ReplayCase, warmup_count: int, repeat_count: int, key: Hashable, *,
                budget: RepeatBudget | None = None) -> None:
        """`budget`: the count is set before the first timed call, from the warm-up's event time per call (the
        kernels run queued ahead of the host, so no sample is in while the calls are being issued)."""
        cases, views, policy = self.cache.plan(case)
        warmup = self._event_samples(cases, views, max(warmup_count, 1))
        # How long one call keeps the GPU busy: the workload's own kernel time where the row has one (event time
        # includes the host's launch gaps, 1 ms and more for some 2 µs ops under the profiler), else the warm-up.
        call_us = case.profiled_us or min(warmup)
        repetitions = ""
        if budget is not None:
            planned, reason = budget.planned_count(min(warmup), repeat_count)
            repetitions = budget.note(planned, reason, repeat_count, call_us=min(warmup))
            repeat_count = planned
        idle_s, neighbour = 0.0, None
        if call_us >= self.COOLDOWN_MIN_US:
            idle_s = call_us / 1e6
            policy += f"; idle {call_us / 1000:.2f} ms after each call (power state)"
        elif self.rested_in_workload(case):
            said = (f"the workload ran this call at {case.profiled_power_w:.0f} W" if case.profiled_power_w is not None
                    else f"no profiled power, taken as {self.unprofiled_power_w:.0f} W (--unprofiled-power)")
            policy += f"; power: no heater, {said} (under --heater-min-power {self.heater_min_power_w:.0f} W)"
        else:
            neighbour = self._heat
            policy += f"; power: {POWER_POLICY}, a {self.HEATER_N}^3 bf16 GEMM before each call"
        from torch.profiler import record_function

        name = self.session.range_name(key, repeat_count, policy, repetitions)
        started = time.monotonic_ns() / 1000.0
        for index in range(repeat_count):
            cases[index % len(cases)].next_values()
            self.cache.prepare(views, neighbour)
            with record_function(name):
                cases[index % len(cases)].run()
            if idle_s:
                self.synchronize()
                time.sleep(idle_s)
        if self.power is not None:
            self.synchronize()
            self._windows[key] = (started, time.monotonic_ns() / 1000.0)

    def rested_in_workload(self, case: ReplayCase) -> bool:
        """Whether the workload ran this short call on a nearly idle GPU (its profiled power under
        --heater-min-power): the heater before it would put replay in a state the workload never had (the
        reference MoE's expert loop at 134-174 W replays 1.09x with it and 0.99x without, while rows run at
        189 W and more want it: benchmarks/results/heater_ab/). A row without a profiled power (generated from a
        grid or a consumer's queries) is taken at --unprofiled-power where given."""
        power = case.profiled_power_w if case.profiled_power_w is not None else self.unprofiled_power_w
        return power is not None and power < self.heater_min_power_w

    HEATER_N = 4096                 # a bf16 GEMM of 4096^3 (~0.2 ms on an H100 at full clock)

    def _heat(self, times: int = 1, n: int = HEATER_N) -> None:
        """Run a bf16 n^3 heater GEMM `times` times (a long, power-limit-bound kernel: what precedes a short call
        inside a model); its operands are made once per size."""
        if n not in self._heaters:
            a = torch.randn(n, n, device=self.device, dtype=torch.bfloat16)
            self._heaters[n] = (a, a.clone(), torch.empty_like(a))
        a, b, out = self._heaters[n]
        for _ in range(times):
            torch.mm(a, b, out=out)

    def _event_samples(self, cases: list[ReplayCase], views: list[torch.Tensor], repeat_count: int) -> list[float]:
        """CUDA-event time of `repeat_count` calls (the warm-up: how long a call takes, where the row has no
        profiled time)."""
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeat_count)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeat_count)]
        self.synchronize()
        for index in range(repeat_count):
            cases[index % len(cases)].next_values()
            self.cache.prepare(views)
            starts[index].record()
            cases[index % len(cases)].run()
            ends[index].record()
        self.synchronize()
        return [start.elapsed_time(end) * 1000.0 for start, end in zip(starts, ends)]

    def collect(self) -> dict[Hashable, TimingResult]:
        """Stop the session, attribute its kernels to the calls, and return every key's samples."""
        self.synchronize()
        results = self.session.collect(range_device_times, METHOD_CUDA_KERNEL)
        windows, self._windows = self._windows, {}
        if self.power is not None:
            for key, window in windows.items():
                if key in results:
                    results[key].power_state = self.power.state_during(*window)
        return results


def range_device_times(events, prefix: str) -> dict[int, list[float]]:
    """Per range token (`<prefix><token>`), each range instance's summed device-activity time in µs.

    `events`: Kineto events (`_KinetoEvent`). Device activities (kernels, memcpy, memset) link to the
    correlation id of the innermost op that launched them. A call's time is what the ops it called
    directly launched (the ops at the top of its range), not what ops nested inside them launched:
    the parse stage gives those nested ops rows of their own (bincount's min/max, a cat that copies
    through copy_), so counting them here would compare two different sums.

    An op that launches nothing itself and does its work through the ops it calls (`clone` → `copy_`,
    `embedding` → `index_select`, `zeros_like` → `fill_`: a framework-level op as a performance model
    queries it, not a kernel a profile files) gets the time of every op inside its range instead.
    """
    ranges, ops = _ranges_and_ops(events, prefix)
    top_level = {op[3]: position for op, position in _top_level_ops(ranges, ops)}
    inside = {op[3]: position for op, position in _ops_in_ranges(ranges, ops)}
    cpu_type = torch.autograd.DeviceType.CPU
    direct, inclusive = [0] * len(ranges), [0] * len(ranges)
    for event in events:
        if event.device_type() != cpu_type:
            correlation = event.linked_correlation_id()
            position = top_level.get(correlation)
            if position is not None:
                direct[position] += event.duration_ns()
            position = inside.get(correlation)
            if position is not None:
                inclusive[position] += event.duration_ns()
    per_token: dict[int, list[float]] = {}
    for (_, _, _, token), own, total in zip(ranges, direct, inclusive):
        per_token.setdefault(token, []).append((own or total) / 1000.0)
    return per_token


class SessionExecutionTimer:
    """Runs the calls for a profiler session that wraps the whole process (msprof); takes no samples here.

    The cache state before each call is insitu, as on cuda (`CacheState`); the preparation kernels are other ops
    with other signatures, which the session's per-signature matching leaves out.
    """

    backend = "npu"

    def __init__(self, device: torch.device | None = None, synchronize=None):
        self._synchronize = synchronize
        self.cache = CacheState(device, device_l2_bytes(device)) if device is not None else None
        self._results: dict[Hashable, TimingResult] = {}

    def synchronize(self) -> None:
        if self._synchronize is not None:
            self._synchronize()

    def close(self) -> None:
        return None

    def measure(self, case: ReplayCase, warmup_count: int, repeat_count: int, key: Hashable, *,
                budget: RepeatBudget | None = None) -> None:
        if budget is not None:     # the session's samples are matched to rows by a count all rows share
            raise OpperfError("a time budget per row is not supported on npu", field="--time-budget-s")
        cases, views, policy = self.cache.plan(case) if self.cache else ([case], [], "none")
        for index in range(warmup_count + repeat_count):
            cases[index % len(cases)].next_values()
            if self.cache:
                self.cache.prepare(views)
            cases[index % len(cases)].run()
        self.synchronize()
        self._results[key] = TimingResult([], METHOD_SESSION, policy)

    def collect(self) -> dict[Hashable, TimingResult]:
        results, self._results = self._results, {}
        return results


def make_timer(backend: str, *, device: str | None = None, cpu_threads: int | None = None,
               heater_min_power_w: float = DEFAULT_HEATER_MIN_POWER_W, unprofiled_power_w: float | None = None):
    """The timer of a back end (npu: execution only; its durations come from the msprof session)."""
    if backend == "cpu":
        return CpuProfilerTimer(cpu_threads)
    if backend == "cuda":
        return CudaTimer(device or "cuda", heater_min_power_w=heater_min_power_w,
                         unprofiled_power_w=unprofiled_power_w)
    if backend == "npu":
        def synchronize():
            torch.npu.synchronize()     # torch_npu registers torch.npu on import
        npu_device = torch.device(device) if device else torch.device("npu", torch.npu.current_device())
        return SessionExecutionTimer(npu_device, synchronize)
    raise OpperfError(f"unknown back end {backend!r} (expected cpu, cuda or npu)", field="--backend")


def device_for(backend: str) -> str:
    """The torch device string replay tensors are built on."""
    return {"cpu": "cpu", "cuda": "cuda", "npu": "npu"}[backend]
