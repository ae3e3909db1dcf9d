"""msprof's `op_summary_*.csv` (and torch_npu's `kernel_details.csv`) as per-signature replay timings.

Both tables carry one line per device task. msprof spells the columns `OP Type`, `Op Name`,
`Task Type`, `Task Start Time(us)`, `Task Duration(us)`; torch_npu's renamed copy spells them
`Type`, `Name`, `Accelerator Core`, `Start Time(us)`, `Duration(us)`. Around them the header drifts
with the CANN version and the `--aic-metrics` set (`Block Dim`/`Block Num`, optional `Mix Block Dim`,
`HF32 Eligible`, `Context ID`, `Model Name`, `Infer ID`, counter columns such as `aicore_time(us)`,
`aic_total_cycles`, `aiv_vec_ratio`, `cube_utilization(%)`). Shape fields arrive wrapped in literal
quotes, start times with a trailing tab, communication tasks with `N/A` everywhere.

Aggregation groups the samples by (reported OP Type, row signature): the replay of one database
row produces warm-up calls followed by `repeat_count` measured calls, all with the row's signature,
so the *last* `repeat_count` samples of a group in start-time order are the measured ones
(`keep_last`). Input building happens before the warm-up, so any kernel it launches with a colliding
signature is also dropped by that rule.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from opperf import contract
from opperf.errors import OpperfError
from opperf.replay.engine import sample_columns
from opperf.stats import DurationStats, duration_stats, format_number

# Logical column -> its spellings: msprof op_summary, torch_npu kernel_details, then older msprof.
_COLUMN_SPELLINGS: dict[str, tuple[str, ...]] = {
    "op_type": ("OP Type", "Op Type", "Type"),
    "op_name": ("Op Name", "Name"),
    "task_type": ("Task Type", "Accelerator Core"),
    "start_us": ("Task Start Time(us)", "Start Time(us)", "Task Start Time"),
    "duration_us": ("Task Duration(us)", "Duration(us)"),
}
# Columns that describe a task rather than measure it. Any other column is a profiler counter.
_DESCRIPTIVE_COLUMNS = contract.PROFILER_BOOKKEEPING_COLUMNS | {
    spelling for pair in _COLUMN_SPELLINGS.values() for spelling in pair}
_SIGNATURE_FIELDS = (contract.OP_STATE, *contract.BASE_COLUMNS[2:])
_MISSING_VALUES = frozenset({"", "N/A", "NA", "n/a"})

TIMING_METHOD_MSPROF = "msprof op_summary Task Duration(us)"
TIMING_METHOD_TORCH_NPU = "torch_npu.profiler kernel_details Duration(us)"
# The device profiler times each task as the replay left the caches; no flush is inserted.
NO_L2_POLICY = "none (device profiler: caches as the replay left them)"


@dataclass(frozen=True)
class KernelSample:
    """One device task of a profiler table: what ran, on which shapes, for how long."""

    kernel_type: str                       # normalised OP Type
    op_name: str
    accelerator_core: str                  # Task Type: AI_CORE, AI_VECTOR_CORE, MIX_AIC, ...
    start_us: float | None
    duration_us: float
    fields: Mapping[str, str]              # OP State + the six shape/dtype/format columns, quotes stripped
    counters: Mapping[str, float]          # counter column -> value (N/A values left out)
    path: str = ""
    line: int = 0
    device_id: str = ""                    # Device_id: each device of a collective reports the call once


@dataclass(frozen=True)
class ProfilerTable:
    """The samples of one op_summary / kernel_details file, and the lines it could not use."""

    path: Path
    timing_method: str
    samples: tuple[KernelSample, ...]
    counter_columns: tuple[str, ...]       # in file order, so MicroBench columns keep the profiler's order
    skipped: tuple[tuple[int, str], ...]   # (line, reason): communication tasks, N/A durations


@dataclass
class SignatureTiming:
    """The measured samples of one (reported OP Type, signature) group, ready to write back."""

    kernel_type: str
    signature: contract.Signature
    fields: dict[str, str]                 # OP State, Accelerator Core and the shape/dtype/format strings
    durations_us: tuple[float, ...]        # the kept samples, in start-time order
    counters: dict[str, float]             # counter -> mean over the kept samples that report it
    counter_columns: tuple[str, ...]
    observed_count: int                    # samples seen before `keep_last` selection
    timing_method: str = TIMING_METHOD_MSPROF
    sources: tuple[str, ...] = field(default=())

    @property
    def stats(self) -> DurationStats:
        return duration_stats(self.durations_us)

    def result_columns(self) -> dict[str, str]:
        """The database columns this group fills: `Average Duration(us)`, our statistics, `MicroBench <counter>`."""
        columns = sample_columns(self.durations_us, self.timing_method, NO_L2_POLICY)
        for counter in self.counter_columns:
            if counter in self.counters:
                columns[contract.microbench_counter_column(counter)] = format_number(self.counters[counter])
        return columns


# --- reading ------------------------------------------------------------------------------------

def _resolve_columns(header: Sequence[str], path: Path) -> tuple[dict[str, str], str]:
    """Which spelling this file uses for each logical column, and the timing method that implies."""
    present = set(header)
    resolved: dict[str, str] = {}
    for logical, spellings in _COLUMN_SPELLINGS.items():
        for spelling in spellings:
            if spelling in present:
                resolved[logical] = spelling
                break
    for required in ("op_type", "duration_us"):
        if required not in resolved:
            raise OpperfError(f"not an op_summary/kernel_details table: no {' or '.join(_COLUMN_SPELLINGS[required])!r}"
                              f" column (header: {', '.join(header[:8])}...)", path=path, row=1,
                              field=_COLUMN_SPELLINGS[required][0])
    missing = [c for c in contract.SIGNATURE_COLUMNS if c not in present]
    if missing:
        raise OpperfError(f"missing column(s) {missing}: shapes are needed to match rows (was msprof run with "
                          "--task-time=l0 or off? use the default task-time level)", path=path, row=1,
                          field=missing[0])
    method = TIMING_METHOD_MSPROF if resolved["duration_us"] == "Task Duration(us)" else TIMING_METHOD_TORCH_NPU
    return resolved, method


def _number(text: str, path: Path, line: int, column: str) -> float | None:
    """A numeric cell: None for N/A/empty; anything else non-numeric is an error naming the cell."""
    text = text.strip().strip('"').strip()
    if text in _MISSING_VALUES:
        return None
    try:
        value = float(text)
    except ValueError:
        raise OpperfError(f"{text!r} is not a number", path=path, row=line, field=column) from None
    if not math.isfinite(value):
        raise OpperfError(f"{text!r} is not a finite number", path=path, row=line, field=column)
    return value


def _is_number(text: str) -> bool:
    try:
        float(text.strip().strip('"'))
    except ValueError:
        return False
    return True


def _counter_columns(header: Sequence[str], rows: Sequence[tuple[int, list[str]]], path: Path) -> tuple[str, ...]:
    """The counter columns: those outside the descriptive set whose cells are numbers (or N/A).

    A column of text only is descriptive (a future msprof column such as a task category); a column
    mixing numbers and text is a corrupt counter, an error naming its first bad cell.
    """
    counters = []
    for position, column in enumerate(header):
        if not column or column in _DESCRIPTIVE_COLUMNS:
            continue
        values = [(line, cells[position].strip()) for line, cells in rows
                  if cells[position].strip().strip('"').strip() not in _MISSING_VALUES]
        numeric = [_is_number(text) for _, text in values]
        if values and not any(numeric):
            continue
        for (line, text), is_number in zip(values, numeric):
            if not is_number:
                raise OpperfError(f"{text!r} is not a number (the column's other cells are)", path=path, row=line,
                                  field=column)
        counters.append(column)
    return tuple(counters)


def read_profiler_table(path: str | Path) -> ProfilerTable:
    """Read one op_summary_*.csv or kernel_details*.csv strictly (BOM, literal quotes, trailing tabs)."""
    path = Path(path)
    try:
        handle = open(path, newline="", encoding="utf-8-sig")
    except OSError as exc:
        raise OpperfError(f"cannot read profiler table: {exc.strerror}", path=path) from exc
    with handle:
        reader = csv.reader(handle)
        header = [h.strip() for h in next(reader, [])]
        if not header:
            raise OpperfError("file is empty (no header)", path=path)
        resolved, method = _resolve_columns(header, path)
        rows: list[tuple[int, list[str]]] = []
        for line, cells in enumerate(reader, start=2):
            if not any(c.strip() for c in cells):
                continue
            if len(cells) != len(header):
                raise OpperfError(f"{len(cells)} cells, the header has {len(header)}", path=path, row=line)
            rows.append((line, cells))
    position = {name: i for i, name in enumerate(header)}
    counters = _counter_columns(header, rows, path)
    samples: list[KernelSample] = []
    skipped: list[tuple[int, str]] = []
    for line, cells in rows:
        def cell(column: str) -> str:
            return cells[position[column]] if column in position else ""

        raw_type = cell(resolved["op_type"]).strip()
        if raw_type in _MISSING_VALUES:
            skipped.append((line, "no OP Type (communication or untyped task)"))
            continue
        kernel_type = contract.normalise_kernel_type(raw_type)
        duration = _number(cell(resolved["duration_us"]), path, line, resolved["duration_us"])
        if duration is None:
            skipped.append((line, f"{kernel_type}: duration is N/A"))
            continue
        start = _number(cell(resolved["start_us"]), path, line, resolved["start_us"]) \
            if "start_us" in resolved else None
        counter_values = {}
        for counter in counters:
            value = _number(cell(counter), path, line, counter)
            if value is not None:
                counter_values[counter] = value
        samples.append(KernelSample(
            kernel_type=kernel_type,
            op_name=cell(resolved["op_name"]).strip() if "op_name" in resolved else "",
            accelerator_core=cell(resolved["task_type"]).strip() if "task_type" in resolved else "",
            start_us=start, duration_us=duration,
            fields={c: contract.strip_profiler_quotes(cell(c)) for c in _SIGNATURE_FIELDS if c in position},
            counters=counter_values, path=str(path), line=line, device_id=cell("Device_id").strip(),
        ))
    return ProfilerTable(path=path, timing_method=method, samples=tuple(samples), counter_columns=counters,
                         skipped=tuple(skipped))


# --- aggregation --------------------------------------------------------------------------------

def _sample_signature(sample: KernelSample, ep_size: int | None) -> contract.Signature:
    fields = dict(sample.fields)
    if sample.kernel_type in contract.EP_SIGNATURE_KERNELS and ep_size is not None:
        fields[contract.EP_SIZE] = str(ep_size)
    try:
        return contract.row_signature(fields, sample.kernel_type)
    except OpperfError as exc:
        raise OpperfError(exc.reason, path=sample.path, row=sample.line, field=exc.field) from exc


def _last_per_device(members: list, keep_last: int) -> list:
    """The last `keep_last` samples of every device (a collective's call is one sample per rank's device)."""
    by_device: dict[str, list] = {}
    for member in members:
        by_device.setdefault(member[0].device_id, []).append(member)
    kept_ids = {id(m) for group in by_device.values() for m in group[-keep_last:]}
    return [m for m in members if id(m) in kept_ids]


def aggregate_tables(tables: Iterable[ProfilerTable], *, keep_last: int | None = None,
                     kernel_types: Iterable[str] | None = None,
                     ep_size: int | None = None) -> dict[tuple[str, contract.Signature], SignatureTiming]:
    """Group samples by (reported OP Type, signature) and summarise each group.

    `keep_last`: keep only the last N samples of each group and device in start-time order (the
    measured calls after the warm-up); None keeps every sample (an existing profile, `--prof-path`).
    `kernel_types`: only these reported Types (None: all). `ep_size`: the EP Size DispatchFFNCombine
    rows were replayed with, which is part of their signature but not of the profiler's table.
    """
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    wanted = set(kernel_types) if kernel_types is not None else None
    groups: dict[tuple[str, contract.Signature], list[tuple[KernelSample, ProfilerTable]]] = {}
    counter_order: dict[str, None] = {}
    for table in tables:
        counter_order.update(dict.fromkeys(table.counter_columns))
        for sample in table.samples:
            if wanted is not None and sample.kernel_type not in wanted:
                continue
            key = (sample.kernel_type, _sample_signature(sample, ep_size))
            groups.setdefault(key, []).append((sample, table))

    timings: dict[tuple[str, contract.Signature], SignatureTiming] = {}
    for key, members in groups.items():
        # Stable sort: samples without a start time keep file order.
        members.sort(key=lambda member: (member[0].start_us is None, member[0].start_us or 0.0))
        kept = _last_per_device(members, keep_last) if keep_last is not None else members
        first = kept[0][0]
        fields = dict(first.fields)
        fields[contract.ACCELERATOR_CORE] = first.accelerator_core
        if first.kernel_type in contract.EP_SIGNATURE_KERNELS and ep_size is not None:
            fields[contract.EP_SIZE] = str(ep_size)
        counter_means = {}
        for counter in counter_order:
            values = [sample.counters[counter] for sample, _ in kept if counter in sample.counters]
            if values:
                counter_means[counter] = statistics.fmean(values)
        methods = {table.timing_method for _, table in kept}
        timings[key] = SignatureTiming(
            kernel_type=key[0], signature=key[1], fields=fields,
            durations_us=tuple(sample.duration_us for sample, _ in kept),
            counters=counter_means,
            counter_columns=tuple(c for c in counter_order if c in counter_means),
            observed_count=len(members),
            timing_method=" + ".join(sorted(methods)),
            sources=tuple(sorted({str(table.path) for _, table in kept})),
        )
    return timings


def timings_by_kernel_type(timings: Mapping[tuple[str, contract.Signature], SignatureTiming]
                           ) -> dict[str, dict[contract.Signature, SignatureTiming]]:
    """Regroup aggregated timings per reported Type: the CSV each group's result lands in."""
    grouped: dict[str, dict[contract.Signature, SignatureTiming]] = {}
    for (kernel_type, signature), timing in timings.items():
        grouped.setdefault(kernel_type, {})[signature] = timing
    return dict(sorted(grouped.items()))
