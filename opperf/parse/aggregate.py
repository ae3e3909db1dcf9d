"""Row form → one table per kernel type: skip what cannot be a database row, group, take statistics, format.

Groups are (normalised Type, Input Shapes, Output Shapes, Input Data Types, Output Data Types) — plus Input
Scalars for rows from torch.profiler traces, where the same shapes with a different `dim` or `alpha` are a
different computation — in the order they are first seen. The dtypes are part of the key because the same
shapes in other dtypes are another kernel (an H100 trace's bf16→fp32 upcast copy_ takes 414 µs where the
fp32→bf16 downcast of the same shapes takes 262 µs: merged, the row's mean described neither). Every other base
field is taken from the group's first row. Durations give the mean, median and population standard
deviation; each counter gives its mean over the rows where it is a number (all N/A → empty).

Numbers are written as the value rounded to 6 decimals with trailing zeros removed (`187.64875`,
`5295467`, `0`): `format_number`. Tests assert these exact strings.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from opperf.contract import (BASE_COLUMNS, CALL_KEY_COLUMNS, INPUT_DTYPES, INPUT_SHAPES, OUTPUT_DTYPES,
                             OUTPUT_SHAPES, PROFILING_INPUT_REUSE, PROFILING_INPUT_VALUES,
                             PROFILING_AVERAGE, PROFILING_MEDIAN, PROFILING_SAMPLE_COUNT, PROFILING_STD, SOURCE,
                             SOURCE_PROFILED,
                             kernel_type_problem, normalise_kernel_type, order_columns,
                             parse_shapes, profiling_counter_column, strip_profiler_quotes)
from opperf.errors import OpperfError
from opperf.input_values import merge_calls
from opperf.parse.attribution import is_collective_type
from opperf.stats import format_number
from opperf.parse.kernel_details import BOOKKEEPING_COLUMNS, DURATION, TYPE, ProfileTable

__all__ = ["BOOKKEEPING_COLUMNS", "ParsedDatabase", "SkippedRow", "aggregate"]

# Skip reasons (the keys of the per-reason counts in the log).
SKIP_EMPTY_TYPE = "empty kernel type"
SKIP_UNSAFE_TYPE = "kernel type is not a safe file name"
SKIP_COMMUNICATION = ("communication row (hcom_*, NCCL, c10d, record_param_comms): collectives belong to the comm "
                      "stage, not to compute CSVs")
SKIP_NA_SHAPE = "shape is N/A (unknown)"
SKIP_BAD_SHAPE = "malformed shape"
SKIP_BAD_DURATION = "duration is not a number"
SKIP_NEGATIVE_DURATION = "duration is negative or not finite"
# Reasons tied to the kernel type itself: such rows have no kernel type CSV (or trace) to be listed under.
TYPE_REASONS = (SKIP_EMPTY_TYPE, SKIP_UNSAFE_TYPE, SKIP_COMMUNICATION)
REASONS = (*TYPE_REASONS, SKIP_NA_SHAPE, SKIP_BAD_SHAPE, SKIP_BAD_DURATION, SKIP_NEGATIVE_DURATION)

EXAMPLES_PER_REASON = 20


@dataclass
class SkippedRow:
    """One row left out of the database, and where to find it (file, line or trace event, field)."""

    path: str
    line: int
    field: str
    reason: str
    value: str
    kernel_type: str
    unit: str = "line"

    def describe(self) -> str:
        return f"{self.path}, {self.unit} {self.line}, field {self.field!r}: {self.reason} (value {self.value!r})"


@dataclass
class ParsedDatabase:
    """Per kernel type: the rows to write (column → text) and the column order, plus what was skipped."""

    rows: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    columns: dict[str, list[str]] = field(default_factory=dict)
    source_rows: dict[str, dict[str, int]] = field(default_factory=dict)   # type → file → rows used
    skip_counts: Counter = field(default_factory=Counter)
    skipped_examples: list[SkippedRow] = field(default_factory=list)       # first EXAMPLES_PER_REASON per reason
    skipped_by_type: dict[str, list[SkippedRow]] = field(default_factory=dict)
    rows_read: int = 0
    attribution: dict[str, dict] = field(default_factory=dict)   # profile path → its time accounting (Attribution)
    profile_us: dict[str, float] = field(default_factory=dict)   # profile path → its rows' valid durations, summed
    skipped_us: dict[str, dict[str, list]] = field(default_factory=dict)   # path → skip reason → [µs, rows]

    @property
    def kernel_types(self) -> list[str]:
        return sorted(self.rows)


def _shape_problem(text: str) -> str | None:
    try:
        parse_shapes(text)
    except OpperfError as exc:
        return exc.reason
    return None


def _kernel_type_skip(kernel_type: str) -> str | None:
    if kernel_type == "":
        return SKIP_EMPTY_TYPE
    if kernel_type_problem(kernel_type):
        return SKIP_UNSAFE_TYPE
    if is_collective_type(kernel_type):
        return SKIP_COMMUNICATION
    return None


def _shape_skip(shape: str) -> str | None:
    if shape.upper() == "N/A":
        return SKIP_NA_SHAPE
    return SKIP_BAD_SHAPE if _shape_problem(shape) else None


@dataclass
class _Column:
    """A categorical column as per-row integer codes into its distinct values (canonicalised)."""

    codes: np.ndarray          # per row: index into `values`
    values: list[str]          # canonical text per code (distinct raw spellings may share one)

    @classmethod
    def of(cls, series: pl.Series, canonical) -> "_Column":
        series = series.cast(pl.Categorical) if series.dtype != pl.Categorical else series
        distinct = series.drop_nulls().unique()
        distinct_codes = distinct.to_physical().cast(pl.Int64).to_numpy()
        null_code = int(distinct_codes.max(initial=-1)) + 1
        physical = series.to_physical().cast(pl.Int64).fill_null(null_code).to_numpy()
        canonical_values = [canonical(v) for v in distinct.cast(pl.String).to_list()] + [canonical(None)]
        values = list(dict.fromkeys(canonical_values))
        index = {v: i for i, v in enumerate(values)}
        lookup = np.zeros(null_code + 1, dtype=np.int64)
        lookup[np.append(distinct_codes, null_code)] = [index[v] for v in canonical_values]
        return cls(codes=lookup[physical], values=values)

    def per_row(self, function, dtype=object) -> np.ndarray:
        """`function` of each distinct value, spread over the rows (computed once per value)."""
        return np.array([function(v) for v in self.values], dtype=dtype)[self.codes]


def _strip_or_empty(value: str | None) -> str:
    return strip_profiler_quotes(value) if value is not None else ""


def _kernel_or_empty(value: str | None) -> str:
    return normalise_kernel_type(value) if value is not None else ""


# Columns of torch traces that tell calls of equal shapes apart (kernel_details rows have neither): CALL_KEY_COLUMNS.
# Per-slot measurements of each call (`;`-aligned with Input Shapes): a row gets each slot's median over its calls.
SLOT_MEDIAN_COLUMNS = (PROFILING_INPUT_REUSE,)
# Per-slot values of each call that replay cycles through (opperf.input_values): a row keeps its distinct calls.
SLOT_VALUES_COLUMNS = (PROFILING_INPUT_VALUES,)


def _slot_medians(texts: list[str], group_ids: np.ndarray, groups: int) -> list[str]:
    """Per group, the slot-wise median of the calls' `;` fields (empty slots and calls without the field left out;
    `inf` is a value). A slot no call measured stays empty."""
    values: list[list[list[float]]] = [[] for _ in range(groups)]
    for text, group in zip(texts, group_ids):
        if not text:
            continue
        slots = values[group]
        parts = text.split(";")
        slots.extend([] for _ in range(len(parts) - len(slots)))
        for index, part in enumerate(parts):
            if part:
                slots[index].append(float(part))
    return [";".join(format_number(float(np.median(v))) if v else "" for v in slots) for slots in values]


def _text_or_none(value: str | None) -> str | None:
    """Input Scalars / Input Strides text; None (no column) where a row has none, e.g. all kernel_details rows."""
    return value or None


def _group_ids(columns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per row its group id (groups numbered in first-seen order) and each group's first row."""
    sizes = [int(codes.max(initial=0)) + 1 for codes in columns]
    if math.prod(sizes) < 2 ** 62:      # always, in practice: one int64 key per row, one sort
        key = np.zeros(len(columns[0]), dtype=np.int64)
        for codes, size in zip(columns, sizes):
            key = key * size + codes
        _, first_rows, ids = np.unique(key, return_index=True, return_inverse=True)
    else:
        keys = pl.DataFrame({f"k{i}": codes for i, codes in enumerate(columns)})
        _, first_rows, ids = np.unique(keys.select(pl.struct(keys.columns).rank("dense")).to_series().to_numpy(),
                                       return_index=True, return_inverse=True)
    order = np.argsort(first_rows, kind="stable")      # np.unique numbers groups by key: renumber by first row
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return rank[ids.ravel()], first_rows[order]


class _GroupSums:
    """Per-group sums in extended precision (x86-64 long double: 64-bit mantissa), so a group's mean and
    population std round to the same float64 as exact arithmetic (`statistics.mean`/`pstdev`) gives, and
    the printed 6 decimals do not depend on the order the rows were added in."""

    def __init__(self, group_ids: np.ndarray, group_count: int):
        self.order = np.argsort(group_ids, kind="stable")
        self.sorted_ids = group_ids[self.order]
        self.counts = np.bincount(group_ids, minlength=group_count)
        self.starts = np.concatenate(([0], np.cumsum(self.counts)[:-1]))

    def mean(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mean as long double, numbers) per group over the non-NaN values; NaN where a group has none."""
        ordered = values[self.order].astype(np.longdouble)
        missing = np.isnan(ordered)
        numbers = self.counts
        if missing.any():
            numbers = self.counts - np.add.reduceat(missing.astype(np.int64), self.starts)
            ordered[missing] = 0
        sums = np.add.reduceat(ordered, self.starts)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(numbers > 0, sums / np.maximum(numbers, 1), np.nan), numbers

    def pstdev(self, values: np.ndarray, means: np.ndarray) -> np.ndarray:
        """Population standard deviation per group (values without NaN)."""
        deviations = values[self.order].astype(np.longdouble) - means[self.sorted_ids]
        return np.sqrt(np.add.reduceat(deviations * deviations, self.starts) / self.counts)


def _duration_medians(group_ids: np.ndarray, durations: np.ndarray) -> np.ndarray:
    """Median per group (in group id order): the middle value, or the mean of the two middle ones."""
    return (pl.DataFrame({"group": group_ids, "duration": durations}).group_by("group")
            .agg(pl.col("duration").median()).sort("group").get_column("duration").to_numpy())


def _durations(frame: pl.DataFrame) -> tuple[np.ndarray, np.ndarray | None]:
    """Durations as float (NaN where not a number) and, when the column was text, the raw text."""
    column = frame.get_column(DURATION)
    if column.dtype == pl.Float64:
        return column.fill_null(np.nan).to_numpy(), None
    text = column.str.strip_chars()
    return text.cast(pl.Float64, strict=False).fill_null(np.nan).to_numpy(), text.to_numpy()


def aggregate(tables: list[ProfileTable]) -> ParsedDatabase:
    """Skip, group and summarise the rows of every table (see module docstring)."""
    result = ParsedDatabase()
    if not tables:
        return result
    frames = [t.frame for t in tables]
    frame = frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed", rechunk=False)
    file_of_row = np.repeat(np.arange(len(tables)), [t.frame.height for t in tables])
    row_in_file = np.concatenate([np.arange(t.frame.height) for t in tables])
    result.rows_read = frame.height
    kernel = _Column.of(frame.get_column(TYPE), _kernel_or_empty)
    in_shapes = _Column.of(frame.get_column(INPUT_SHAPES), _strip_or_empty)
    out_shapes = _Column.of(frame.get_column(OUTPUT_SHAPES), _strip_or_empty)
    dtypes = [_Column.of(frame.get_column(column), _strip_or_empty) for column in (INPUT_DTYPES, OUTPUT_DTYPES)
              if column in frame.columns]
    call_keys = {column: (_Column.of(frame.get_column(column), _text_or_none) if column in frame.columns
                          else _Column(codes=np.zeros(frame.height, dtype=np.int64), values=[None]))
                 for column in CALL_KEY_COLUMNS}
    durations, duration_text = _durations(frame)

    # The first matching check names the row's skip reason and field (0 = keep the row).
    reason_names = [None, *REASONS]
    code_of = {name: i for i, name in enumerate(reason_names)}
    field_names = [None, TYPE, INPUT_SHAPES, OUTPUT_SHAPES, DURATION]
    reasons = np.zeros(frame.height, dtype=np.int8)
    fields = np.zeros(frame.height, dtype=np.int8)
    with np.errstate(invalid="ignore"):
        checks = [
            (TYPE, kernel.per_row(lambda v: code_of[_kernel_type_skip(v)], np.int8)),
            (INPUT_SHAPES, in_shapes.per_row(lambda v: code_of[_shape_skip(v)], np.int8)),
            (OUTPUT_SHAPES, out_shapes.per_row(lambda v: code_of[_shape_skip(v)], np.int8)),
            (DURATION, np.where(np.isnan(durations), code_of[SKIP_BAD_DURATION], 0).astype(np.int8)),
            (DURATION, np.where(np.isinf(durations) | (durations < 0), code_of[SKIP_NEGATIVE_DURATION], 0)
             .astype(np.int8)),
        ]
    for column, reason in checks:
        unset = (reasons == 0) & (reason != 0)
        reasons[unset] = reason[unset]
        fields[unset] = field_names.index(column)
    skipped = np.flatnonzero(reasons)
    valid = np.where(np.isfinite(durations) & (durations >= 0), durations, 0.0)
    for index, total in enumerate(np.bincount(file_of_row, weights=valid, minlength=len(tables))):
        result.profile_us[str(tables[index].path)] = float(total)
    for row in skipped:
        entry = result.skipped_us.setdefault(str(tables[file_of_row[row]].path), {}).setdefault(
            reason_names[reasons[row]], [0.0, 0])
        entry[0] += float(valid[row])
        entry[1] += 1
    _collect_skips(skipped, tables, file_of_row, row_in_file, [reason_names[r] for r in reasons[skipped]],
                   [field_names[f] for f in fields[skipped]], kernel, frame, duration_text, result)

    kept = np.flatnonzero(reasons == 0)
    if len(kept) == 0:
        return result
    group_ids, first_rows = _group_ids([kernel.codes[kept], in_shapes.codes[kept], out_shapes.codes[kept],
                                        *(column.codes[kept] for column in dtypes),
                                        *(key.codes[kept] for key in call_keys.values())])
    groups = _GroupSums(group_ids, len(first_rows))
    kept_durations = durations[kept]
    counts = groups.counts
    means_long, _ = groups.mean(kept_durations)
    means = means_long.astype(np.float64)
    stds = groups.pstdev(kept_durations, means_long).astype(np.float64)
    medians = _duration_medians(group_ids, kept_durations)
    counters = list(dict.fromkeys(c for t in tables for c in t.counters))
    everything_kept = len(kept) == frame.height
    counter_means = {}
    for counter in counters:
        if counter in frame.columns:
            values = frame.get_column(counter).cast(pl.Float64).to_numpy()      # nulls → NaN
            counter_means[counter] = groups.mean(values if everything_kept else values[kept])[0].astype(np.float64)
    def kept_texts(column: str) -> list[str]:
        texts = frame.get_column(column).to_list()
        return texts if everything_kept else [texts[i] for i in kept]

    slot_medians = {column: _slot_medians(kept_texts(column), group_ids, len(first_rows))
                    for column in SLOT_MEDIAN_COLUMNS if column in frame.columns}
    for column in SLOT_VALUES_COLUMNS:
        if column in frame.columns:
            per_group: list[list[str]] = [[] for _ in range(len(first_rows))]
            for text, group in zip(kept_texts(column), group_ids):
                if text:
                    per_group[group].append(text)
            slot_medians[column] = [merge_calls(cells) for cells in per_group]
    first_in_frame = kept[first_rows]
    firsts = [c for c in BASE_COLUMNS if c not in (INPUT_SHAPES, OUTPUT_SHAPES)]
    first_values = frame.select(firsts)[first_in_frame.tolist()].to_dict(as_series=False)

    files_of: dict[str, set[int]] = {}
    per_file = np.bincount(kernel.codes[kept] * len(tables) + file_of_row[kept],
                           minlength=len(kernel.values) * len(tables)).reshape(len(kernel.values), len(tables))
    for code, file_index in zip(*np.nonzero(per_file)):
        name = kernel.values[code]
        files_of.setdefault(name, set()).add(int(file_index))
        result.source_rows.setdefault(name, {})[str(tables[file_index].path)] = int(per_file[code, file_index])
    type_counters = {name: [c for c in counters if any(c in tables[i].counters for i in sorted(files))]
                     for name, files in files_of.items()}
    has_call_key: dict[str, set[str]] = {column: set() for column in (*CALL_KEY_COLUMNS, *SLOT_MEDIAN_COLUMNS,
                                                                          *SLOT_VALUES_COLUMNS)}
    for group, row_index in enumerate(first_in_frame):
        name = kernel.values[kernel.codes[row_index]]
        # Dtype, format and Type strings stay as the profiler spelled them (`FLOAT` beside `DT_BF16`): the peer
        # runtime matches them byte for byte. Canonical spellings are for signatures only (contract.row_signature).
        row = {c: _strip_or_empty(first_values[c][group]) for c in firsts}
        row[INPUT_SHAPES] = in_shapes.values[in_shapes.codes[row_index]]
        row[OUTPUT_SHAPES] = out_shapes.values[out_shapes.codes[row_index]]
        row[PROFILING_AVERAGE] = format_number(float(means[group]))
        row[PROFILING_MEDIAN] = format_number(float(medians[group]))
        row[PROFILING_STD] = format_number(float(stds[group]))
        for counter in type_counters[name]:
            value = counter_means[counter][group] if counter in counter_means else np.nan
            row[profiling_counter_column(counter)] = format_number(float(value))
        row[SOURCE] = SOURCE_PROFILED
        row[PROFILING_SAMPLE_COUNT] = str(int(counts[group]))
        for column, medians_of in slot_medians.items():
            if medians_of[group]:
                row[column] = medians_of[group]
                has_call_key[column].add(name)
        for column, key in call_keys.items():
            text = key.values[key.codes[row_index]]
            if text is not None:
                row[column] = text
                has_call_key[column].add(name)
        result.rows.setdefault(name, []).append(row)
    for name in result.rows:
        extra = [column for column in (*CALL_KEY_COLUMNS, *SLOT_MEDIAN_COLUMNS, *SLOT_VALUES_COLUMNS)
                 if name in has_call_key[column]]
        result.columns[name] = order_columns([*BASE_COLUMNS, PROFILING_AVERAGE, PROFILING_MEDIAN, PROFILING_STD,
                                              *map(profiling_counter_column, type_counters[name]), SOURCE, *extra,
                                              PROFILING_SAMPLE_COUNT])
    return result


def _collect_skips(skipped: np.ndarray, tables: list[ProfileTable], file_of_row: np.ndarray,
                   row_in_file: np.ndarray, reasons: list[str], fields: list[str], kernel: _Column,
                   frame: pl.DataFrame, duration_text: np.ndarray | None, result: ParsedDatabase) -> None:
    if len(skipped) == 0:
        return
    shown: Counter = Counter()
    raw = frame.select(TYPE, INPUT_SHAPES, OUTPUT_SHAPES)[skipped.tolist()].to_dict(as_series=False)
    for position, row in enumerate(skipped):
        reason, column = reasons[position], fields[position]
        result.skip_counts[reason] += 1
        table = tables[file_of_row[row]]
        if column == DURATION:
            value = str(duration_text[row]) if duration_text is not None else "N/A"
        else:
            value = str(raw[column][position] or "")
        name = kernel.values[kernel.codes[row]]
        item = SkippedRow(path=str(table.path), line=table.locate(int(row_in_file[row])), field=column,
                          reason=reason, value=value, kernel_type=name, unit=table.row_unit)
        if shown[reason] < EXAMPLES_PER_REASON:
            result.skipped_examples.append(item)
            shown[reason] += 1
        if reason not in TYPE_REASONS:
            result.skipped_by_type.setdefault(name, []).append(item)


def add_columns(database: ParsedDatabase, kernel_type: str, columns: list[str]) -> None:
    """Extend one type's column list (e.g. FIA `Runtime …` columns) keeping contract order."""
    database.columns[kernel_type] = order_columns([*database.columns[kernel_type], *columns])
