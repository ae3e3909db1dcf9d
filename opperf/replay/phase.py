"""A profile's calls in trace order, each mapped to its row of the parsed database, and replayed in that order.

Row by row, replay reproduces a call's inputs, layout and cache state and approximates the GPU's power state with a
policy (docs/replay.md, "Power state"). Inside the workload each call ran in the state the calls before it left: a
long power-capped prefill (hundreds of milliseconds under NVML's `sw_power_cap`) and throttled decode steps leave a
state no policy reproduced for every row. The workload's own sequence, replayed with each call's warm inputs
rewritten into L2 before it, does: on an H200 the whole trace in order took the dense decoder from 4.3 / 12.8 / 6.0 %
(median / p90 / time-weighted gap, one at a time) to 2.3 / 7.3 / 1.6 % and Mixtral from 4.5 / 12.6 / 2.7 % to
1.9 / 9.0 / 0.9 % (benchmarks/results/whole_order/). This module takes the whole trace, keys each call the way the
parse groups calls into rows, and replays the calls from the rows' own recipes in the trace's order (`replay_phases`, cuda or cpu). As the
workflow's stage 4b (scripts/phase_replay.py) it writes a table of the in-order means (`phase_table`), which the
database stage folds into the rows (opperf.replay.phase_table): a row's `Average Duration(us)` becomes the
call-weighted blend of its in-order mean and its one-at-a-time replay.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from opperf import contract
from opperf.errors import OpperfError
from opperf.io import read_database_csv
from opperf.log import Progress, get_logger
from opperf.parse.kernel_details import DURATION
from opperf.replay.phase_table import (KEY_COLUMNS, PHASE_APPLIED, PHASE_CALLS, PHASE_METHOD, PHASE_PROFILED,
                                       PHASE_REPLAYED, PHASE_TABLE_COLUMNS, TYPE, row_key)
from opperf.stats import format_number, split_interrupted

log = get_logger("replay.phase")

START = "Start Time(us)"
# Times stage 4b replays them: a row's in-order mean is over a few calls a pass, and one pass left two replays of the
# dense decoder 1.5 % apart at the median (H200, benchmarks/results/whole_order/).
PHASE_ITERATIONS = 3
# Share of the device's free memory the rows of one window may take (opperf.replay.phase.memory_windows): above it
# the order is replayed in windows. The rows' count includes their outputs, which the order does not hold.
PHASE_MEMORY_FRACTION = 0.8
# Idle before each pass over the order (s).
PHASE_REST_S = 0.2
def trace_calls(trace: str | Path) -> list[dict]:
    """Every call of a torch.profiler trace that became part of a row, in the order the host launched them (their
    signatures, durations and power state; not their reuse distances, which the order does not need)."""
    from opperf.parse.torch_trace import convert_trace

    return sorted(convert_trace(Path(trace), input_reuse=False).rows, key=lambda call: float(call[START]))


def database_rows(paths: str | Path | Sequence[str | Path]) -> dict[tuple[str, ...], dict]:
    """Every row of parsed (or replayed) kernel CSVs, given as files or as database directories (one CSV per kernel
    type), by its key, with the file and line it came from (`_path`, `_line`). Of rows sharing a key a profiled
    one is kept (a grid row never has a trace's calls)."""
    rows: dict[tuple[str, ...], dict] = {}
    given = [paths] if isinstance(paths, (str, Path)) else list(paths)
    files = [f for p in map(Path, given) for f in (sorted(p.glob("*.csv")) if p.is_dir() else [p])]
    for path in files:
        for line, record in enumerate(read_database_csv(path).to_dict("records"), start=2):
            record = {key: "" if value is None else str(value) for key, value in record.items()}
            key = row_key(path.stem, record)
            if key in rows and record.get(contract.SOURCE) == contract.SOURCE_GENERATED:
                continue
            rows[key] = {**record, "_path": str(path), "_line": line}
    return rows


def call_keys(calls: Sequence[dict], rows: Mapping[tuple[str, ...], dict], where: str | Path) -> list[tuple]:
    """Each call's row key; an OpperfError names how many calls, of which types, have no row in `where`."""
    keys = [row_key(str(call[TYPE]), call) for call in calls]
    missing = [key for key in keys if key not in rows]
    if missing:
        raise OpperfError(f"{len(missing)} of the phase's {len(keys)} calls have no row here (types "
                          f"{sorted({key[0] for key in missing})}): parse the same trace into it", path=where)
    return keys


class _Device:
    """What prepare_row needs of a timer: waiting for the device (nothing to wait for on the CPU)."""

    def __init__(self, backend: str):
        self.backend = backend

    def synchronize(self) -> None:
        if self.backend == "cuda":
            import torch

            torch.cuda.synchronize()


def _not_replayable(row: Mapping[str, str]) -> str:
    """Why a row is left out of the order ('' if it is not): its one-at-a-time replay did not succeed (a row that
    crashed or ran out of memory alone would take the whole phase with it)."""
    status = (row.get(contract.REPLAY_STATUS) or "").strip()
    return f"its one-at-a-time replay was {status}" if status and status != "ok" else ""


def _out_of_memory(key: tuple[str, ...], row: Mapping[str, str], held: int, where: str,
                   exc: BaseException) -> OpperfError:
    return OpperfError(f"{key[0]} ran out of device memory {where}, with the inputs of {held} rows held at once: "
                       f"turn stage 4b off (replay.phase.enabled: false) ({str(exc).splitlines()[0]})",
                       path=row.get("_path"), row=row.get("_line"))


@dataclass
class PhaseTimes:
    """What a phase replay measured: each row's per-call samples (µs), how, and when (monotonic µs)."""

    samples: dict[tuple[str, ...], list[float]]
    method: str
    started_us: float
    ended_us: float
    left_out: dict[tuple[str, ...], str] = field(default_factory=dict)   # rows not replayed in order, and why

    @property
    def measured(self) -> bool:
        """Whether any call took time: on cuda a run on another GPU than the profile's, or one whose timer saw no
        kernel, measured nothing."""
        return any(sample > 0 for samples in self.samples.values() for sample in samples)


def _row_bytes(row: Mapping[str, str]) -> int:
    """What a row's tensors take on the device (inputs and outputs; 0 when its slots do not parse: its build fails
    and names why)."""
    from opperf.replay.inputs import parse_row_slots, row_tensor_bytes

    try:
        return row_tensor_bytes(parse_row_slots(row))
    except OpperfError:
        return 0


def memory_windows(phase_keys: Sequence[Sequence[tuple[str, ...]]], sizes: Mapping[tuple[str, ...], int],
                   budget: int | None) -> list[list[list[tuple[str, ...]]]]:
    """The order in windows, each a list of call sequences replayed together: every phase in one window when their
    rows' tensors fit `budget` bytes together (or there is no budget), else runs of consecutive calls whose
    distinct rows fit it (a row larger than the budget alone: a window of its own)."""
    distinct = dict.fromkeys(key for keys in phase_keys for key in keys)
    if budget is None or sum(sizes[key] for key in distinct) <= budget:
        return [[list(keys) for keys in phase_keys]]
    windows: list[list[list[tuple[str, ...]]]] = []
    for keys in phase_keys:
        start, held, total = 0, set(), 0
        for index, key in enumerate(keys):
            if key in held:
                continue
            if held and total + sizes[key] > budget:
                windows.append([list(keys[start:index])])
                start, held, total = index, set(), 0
            held.add(key)
            total += sizes[key]
        if start < len(keys):
            windows.append([list(keys[start:])])
    return windows


def close_rows(phase_keys: Sequence[Sequence[tuple[str, ...]]], sizes: Mapping[tuple[str, ...], int],
               capacity: int) -> set[tuple[str, ...]]:
    """The rows two of whose calls follow each other within a phase with less than `capacity` bytes of other rows'
    tensors between them: in replay their cold inputs would still be in the cache from the row's previous call.
    Qwen2-MoE's q, k and v projections are one row run three times back to back; the workload ran them on three
    weights, replay on one (0.88-0.93x in order). A fused QKV projection's row comes back a layer later, after every
    other weight of the layer, and is not close."""
    close: set[tuple[str, ...]] = set()
    for keys in phase_keys:
        touched, after = 0, {}                      # bytes of the phase so far; each row's count after its call
        for key in keys:
            if key in after and touched - after[key] < capacity:
                close.add(key)
            touched += sizes.get(key, 0)
            after[key] = touched
    return close


def replay_phases(phase_keys: Sequence[Sequence[tuple[str, ...]]], rows: Mapping[tuple[str, ...], dict], *,
                  device: str = "cuda", iterations: int = 1, warmup: int = 0, rest_s: float = PHASE_REST_S,
                  definitions_dir: str | Path | None = None, cold_copies: bool = False,
                  cold_copy_budget_bytes: int = 8 << 30, memory_budget_bytes: int | None = None) -> PhaseTimes:
    """Run each phase's calls in order, back to back, `iterations` times after `warmup` untimed runs, with
    `rest_s` of idle before each phase; each call is its row's own recipe (as scripts/replay.py builds it, checked
    by its first call) and is timed in a profiler range of its row: CUPTI kernel time on cuda, the op's CPU event
    time on cpu, as replay's timers take them. No flush and no heater run between the calls: the phase's own calls
    are the neighbourhood. A row's recorded input values (MoE splits, masks) are cycled from call to call, as
    one-at-a-time replay cycles them.

    A call's inputs are its row's own tensors, not the previous call's outputs, so an input the workload had just
    written would be cold here. So on cuda, before each call the inputs the insitu cache state keeps warm (by the
    workload's reuse distances, else the definition) are rewritten into L2 from a twin, outside the call's range: the
    rest of the cache is what the phase's calls left. Without that the dense decoder's rows under 10 us replayed at
    1.14-1.25x (H200, benchmarks/results/whole_order/).

    With `cold_copies` (cuda), the calls of a row that comes back before the cache has turned over (`close_rows`)
    take turns over copies of its cold inputs (`opperf.replay.timing.cold_input_copies`, within
    `cold_copy_budget_bytes` in all), so that calls the workload ran on different weights of one shape do not find
    one weight in L2. Off by default: copies for every row made the small rows 1-2 % slower and dense's median gap
    1.8 -> 3.0 % in order on the H200 (benchmarks/results/whole_order/h200_sparse_views/); copies for the rows that
    come back took Qwen2-MoE's addmm from 7.2 to 0.8 % (qwen2_close_copies/) and have not run on dense or Mixtral.

    Every row's tensors stay allocated while its calls run. When the rows' tensors together exceed
    `memory_budget_bytes` (on cuda by default PHASE_MEMORY_FRACTION of the device's free memory; the reference MoE
    decoder's 4,024 rows take 99 GiB), the order is replayed in windows of consecutive calls that fit, each
    `iterations` times, the rows of one window released before the next is built (memory_windows).

    A row that cannot be built, or whose one-at-a-time replay failed, is left out with its calls (`left_out` says
    why); an OpperfError names the first such row when none is left to replay."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, record_function

    from opperf.replay.definitions import DEFAULT_DEFINITIONS_DIR
    from opperf.replay.engine import PreparedRow, prepare_row
    from opperf.replay.job import find_definition, recipe_for
    from opperf.replay.timing import RangeSession, cuda_device, range_cpu_op_times, range_device_times

    backend = "cuda" if str(device).startswith("cuda") else "cpu"
    waiter = _Device(backend)
    target = cuda_device(device) if backend == "cuda" else torch.device(device)
    left_out: dict[tuple[str, ...], str] = {}
    distinct = list(dict.fromkeys(k for keys in phase_keys for k in keys))
    for key in distinct:
        reason = _not_replayable(rows[key])
        if reason:
            left_out[key] = reason
    phase_keys = [[key for key in keys if key not in left_out] for keys in phase_keys]
    counts = Counter(key for keys in phase_keys for key in keys)       # each row's calls in one pass
    if memory_budget_bytes is None and backend == "cuda":
        memory_budget_bytes = int(PHASE_MEMORY_FRACTION * torch.cuda.mem_get_info(target)[0])
    use_caches = backend == "cuda"
    copying = use_caches and cold_copies
    # Only a budget needs the rows' sizes (parsing 4,024 rows' slots is not free); the copies' selection reuses them
    # (copies need cuda, where the budget is always set).
    sizes = {key: _row_bytes(rows[key]) for key in counts} if memory_budget_bytes is not None else {}
    windows = memory_windows(phase_keys, sizes, memory_budget_bytes)
    if len(windows) > 1:
        log.info("the rows' tensors (%.1f GiB) exceed the stage's memory budget (%.1f GiB): the order is replayed in "
                 "%d windows of consecutive calls, each %d time(s)", sum(sizes.values()) / 2**30,
                 memory_budget_bytes / 2**30, len(windows), iterations)

    recipes: dict[str, object] = {}     # one lookup per kernel type: reading the definitions takes 30-70 ms
    prepared: dict[tuple[str, ...], PreparedRow] = {}
    caches: dict[tuple[str, ...], tuple] = {}
    turns: dict[tuple[str, ...], list] = {}     # the cases a row's calls take in turn
    charged: dict[tuple[str, ...], int] = {}    # bytes of cold copies each row holds
    value_turns: dict[tuple[str, ...], int] = {}    # a released row's recorded-values turn, to go on from
    copy_budget = cold_copy_budget_bytes
    if use_caches:
        from opperf.replay.timing import CacheState, cold_input_copies, device_l2_bytes, storage_bytes

        l2_bytes = device_l2_bytes(target)
        copied = close_rows(phase_keys, sizes, l2_bytes) if copying else set()
        if copying:
            log.info("cold copies: %d of %d rows come back within the cache's %d MiB of other rows' tensors",
                     len(copied), len(counts), l2_bytes >> 20)

    def release(keep: set) -> None:
        nonlocal copy_budget
        for key in [key for key in prepared if key not in keep]:
            value_turns[key] = prepared.pop(key).case.value_turn
            caches.pop(key, None)
            turns.pop(key, None)
            copy_budget += charged.pop(key, 0)

    def build(keys: list, label: str) -> None:
        nonlocal copy_budget
        release(set(keys))
        todo = [key for key in keys if key not in prepared and key not in left_out]
        building = Progress(log, label, len(todo))
        for built, key in enumerate(todo, start=1):
            building.update(built)
            row = rows[key]
            if key[0] not in recipes:
                recipes[key[0]] = recipe_for(key[0], backend, find_definition(
                    key[0], backend, definitions_dir or DEFAULT_DEFINITIONS_DIR))
            definition = recipes[key[0]]
            outcome = (prepare_row(definition, row, backend=backend, device=device, timer=waiter,
                                   path=row.get("_path"), line=row.get("_line")) if definition else None)
            if not isinstance(outcome, PreparedRow):
                left_out[key] = (f"{getattr(outcome, 'status', 'no definition')} "
                                 f"{getattr(outcome, 'error', '')}").strip()
                continue
            prepared[key] = outcome
            turns[key] = [outcome.case]
            if key in value_turns:                  # rebuilt for a later window: its values go on where they were
                outcome.case.value_turn = value_turns[key] - 1
                outcome.case.next_values()
            if use_caches:
                cache = CacheState(target, l2_bytes)
                try:
                    caches[key] = (cache, cache.plan(outcome.case)[1])
                    if key in copied and copy_budget > 0:
                        turns[key] = cold_input_copies(outcome.case, cache.cold, l2_bytes, counts[key])
                        shared = {id(t) for t in outcome.case.tensors()}
                        charged[key] = storage_bytes(t for copy in turns[key][1:] for t in copy.tensors()
                                                     if id(t) not in shared)
                        copy_budget -= charged[key]
                except torch.OutOfMemoryError as exc:
                    raise _out_of_memory(key, row, len(prepared), "making its warm inputs' twins", exc) from exc
        building.finish(len(todo))

    if backend == "cuda":
        session = RangeSession([ProfilerActivity.CPU, ProfilerActivity.CUDA], strict=True)
        attribute, method = range_device_times, "cuda profiler (CUPTI) device-kernel time per call"
    else:
        session = RangeSession([ProfilerActivity.CPU], record_shapes=True, strict=True)
        attribute, method = range_cpu_op_times, "cpu profiler op time per call"
    method += f", in the workload's call order ({len(phase_keys)} phase(s), {iterations} time(s))"
    if len(windows) > 1:
        method += f", in {len(windows)} windows of consecutive calls (the rows' tensors over the memory budget)"
    if use_caches:
        method += ", each call's warm inputs rewritten into L2 before it (insitu, no flush)"
        if cold_copies:
            method += ", cold-input copies in turns for the rows that come back before the cache turns over"
    names: dict[tuple, str] = {}

    made: Counter = Counter()       # each row's calls so far, every pass and window

    def run(window: list, number: int, timed: bool, label: str) -> None:
        done = 0
        progress = Progress(log, f"phase replay, {label}", sum(map(len, window)), unit="calls")
        for keys in window:
            waiter.synchronize()
            time.sleep(rest_s)
            for key in keys:
                # Each call after a row's first takes the row's next recorded input values (MoE splits, masks), as
                # the workload's calls had their own, across passes and windows; the copy runs outside the range.
                if made[key]:
                    prepared[key].case.next_values()
                case = turns[key][made[key] % len(turns[key])]
                made[key] += 1
                done += 1
                progress.update(done)
                if key in caches:
                    cache, views = caches[key]
                    cache.rewrite(views)
                try:
                    if timed:
                        with record_function(names[key, number]):
                            case.run()
                    else:
                        case.run()
                except torch.OutOfMemoryError as exc:
                    # A window's rows' inputs stay allocated while it runs; one call's outputs did not fit beside
                    # them (stage 4b then fails, and each row keeps nothing of it).
                    raise _out_of_memory(key, rows[key], len(prepared), "in order", exc) from exc
        waiter.synchronize()
        progress.finish(done)

    started = None
    try:
        for number, window in enumerate(windows):
            where = f" (window {number + 1} of {len(windows)})" if len(windows) > 1 else ""
            build(list(dict.fromkeys(key for keys in window for key in keys)), f"phase replay, rows built{where}")
            window = [[key for key in keys if key in prepared] for keys in window]
            calls = Counter(key for keys in window for key in keys)
            for turn in range(warmup):
                run(window, number, False, f"warm-up pass {turn + 1} of {warmup}{where}")
            names.update({(key, number): session.range_name((key, number), calls[key] * iterations, "phase")
                          for key in calls})
            started = time.monotonic_ns() / 1000.0 if started is None else started
            for turn in range(iterations):
                run(window, number, True, f"pass {turn + 1} of {iterations}{where}")
    except BaseException:
        session.close()
        raise
    if not prepared and not value_turns:        # no row was ever built
        key, reason = next(iter(left_out.items()), (("",), "no calls"))
        raise OpperfError(f"{key[0]} cannot be replayed in its phase: {reason}"
                          + (f" (and {len(left_out) - 1} other row(s))" if len(left_out) > 1 else ""),
                          path=rows[key].get("_path") if key in rows else None,
                          row=rows[key].get("_line") if key in rows else None)
    ended = time.monotonic_ns() / 1000.0
    results = session.collect(attribute, method)
    samples: dict[tuple[str, ...], list[float]] = {}
    for (key, _), result in sorted(results.items(), key=lambda item: item[0][1]):
        if key not in left_out:
            samples.setdefault(key, []).extend(result.samples_us)
    return PhaseTimes(samples, method, started or ended, ended, left_out)


def select_phases(trace: str | Path) -> list[list[dict]]:
    """A trace's phases to replay: the whole trace as one phase ([] for a trace with no call)."""
    calls = trace_calls(trace)
    return [calls] if calls else []


def profiled_call_times(phases: Sequence[Sequence[dict]],
                        phase_keys: Sequence[Sequence[tuple[str, ...]]]) -> dict[tuple[str, ...], list[float]]:
    """Per row, the profiled device times (µs) of exactly its calls in the phases (the row's own mean covers every
    call of the trace), in phase order."""
    profiled: dict[tuple[str, ...], list[float]] = {}
    for phase, keys in zip(phases, phase_keys):
        for call, key in zip(phase, keys):
            profiled.setdefault(key, []).append(float(call[DURATION]))
    return profiled


# A call in order over this many times both its row's median call and the row's longest profiled call was not
# running alone (opperf.stats.split_interrupted; one-at-a-time replay sets apart calls over 20x the median). On the
# H200 the 1.6 us sigmoid row of Qwen2-MoE's router averaged 35 ms a call in one of two replays, 0.93x its profile in
# the other.
PHASE_INTERRUPTED_FACTOR = 10


def phase_table(phases: Sequence[Sequence[dict]], phase_keys: Sequence[Sequence[tuple[str, ...]]],
                times: PhaseTimes | None) -> pd.DataFrame:
    """One line per row replayed in a phase: its calls there, their profiled mean, the replayed mean, how it was
    timed, and whether the database stage applies it (`yes`, or why not: a row left out of the order, a row the
    timer measured nothing for). Every other row applies, whatever its length: with the warm inputs rewritten
    before each call every row length came closer in order than alone (benchmarks/results/whole_order/)."""
    profiled = profiled_call_times(phases, phase_keys)
    left_out = times.left_out if times else {}
    lines = []
    for key, durations in profiled.items():
        samples, dropped, _ = split_interrupted([s for s in (times.samples.get(key, ()) if times else ()) if s > 0],
                                                PHASE_INTERRUPTED_FACTOR, max(durations))
        if dropped:
            log.warning("phase replay: %s (%s): %d of %d call(s) took over %gx both the row's median call and its "
                        "longest profiled call (%s us); left out of its mean as interrupted", key[0], key[1],
                        len(dropped), len(samples) + len(dropped), PHASE_INTERRUPTED_FACTOR,
                        ", ".join(format_number(s) for s in dropped[:3]))
        profiled_mean = sum(durations) / len(durations)
        replayed = sum(samples) / len(samples) if samples else None
        if key in left_out:
            applied = f"no: not replayed in order, {left_out[key]}"
        elif replayed is None:
            applied = "no: nothing measured"
        else:
            applied = "yes"
        lines.append({TYPE: key[0], **dict(zip(KEY_COLUMNS, key[1:])), PHASE_CALLS: len(durations),
                      PHASE_PROFILED: format_number(profiled_mean), PHASE_REPLAYED: format_number(replayed),
                      PHASE_METHOD: times.method + (f", {len(dropped)} interrupted call(s) left out" if dropped
                                                    else ""), PHASE_APPLIED: applied})
    return pd.DataFrame(lines, columns=list(PHASE_TABLE_COLUMNS)).fillna("")
