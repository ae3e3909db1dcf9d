"""Reading Ascend profiler tables (torch_npu `kernel_details*.csv`, msprof `op_summary_*.csv`) into row form.

Row form is one polars DataFrame per file with the canonical column names the aggregator expects:
`Type` and the eight base columns as Categorical (profiler quotes still on), `Duration(us)` (Float64, or
text when some value is not a number, so that row can be reported by line instead of failing the whole
file) and one Float64 column per counter. Row i of the frame is line i + 2 of the file (the header is
line 1). polars' multi-threaded CSV reader does the heavy lifting, a block of lines at a time; the csv
module only reads the header, checks the last line and locates the line of a broken row.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from opperf.contract import (ACCELERATOR_CORE, BASE_COLUMNS, INPUT_DTYPES, INPUT_FORMATS, INPUT_SCALARS,
                             INPUT_STRIDES, PROFILING_INPUT_VALUES,
                             INPUT_SHAPES, OUTPUT_DTYPES, OUTPUT_FORMATS, OUTPUT_SHAPES,
                             PROFILER_BOOKKEEPING_COLUMNS)
from opperf.errors import OpperfError
from opperf.io import not_utf8_error
from opperf.parse.attribution import Attribution

TYPE = "Type"
DURATION = "Duration(us)"
TRACE_EVENT = "trace event"        # ProfileTable.row_unit of a torch.profiler trace's rows

# Header drift across CANN / torch_npu versions and the msprof op_summary spelling → our canonical names.
COLUMN_ALIASES = {
    "OP Type": TYPE,
    "Op Type": TYPE,
    "Task Duration(us)": DURATION,
}
# op_summary has no `Accelerator Core`; its `Task Type` (AI_CORE, AI_VECTOR_CORE, MIX_AIC, ...) is the same thing.
ACCELERATOR_CORE_FALLBACK = "Task Type"

REQUIRED_COLUMNS = (TYPE, DURATION, INPUT_SHAPES, INPUT_DTYPES, INPUT_FORMATS, OUTPUT_SHAPES, OUTPUT_DTYPES,
                    OUTPUT_FORMATS)
# Columns that describe a launch rather than measure it: never averaged into `Profiling Average <counter>`.
BOOKKEEPING_COLUMNS = PROFILER_BOOKKEEPING_COLUMNS


@dataclass
class ProfileTable:
    """One raw profiler table in row form, plus what the log and traces need to say about it."""

    path: Path
    frame: pl.DataFrame
    counters: list[str]           # counter columns present in this file, in file order
    ignored_columns: list[str]    # non-bookkeeping columns that held text, so are no counters
    row_numbers: list[int] | None = None   # where each row came from, when not "row i is line i + 2"
    row_unit: str = "line"
    attribution: Attribution | None = None   # torch traces with device activity: their device-time account

    def locate(self, row: int) -> int:
        """Where row `row` of the frame came from (a line number, or a trace event index)."""
        return self.row_numbers[row] if self.row_numbers is not None else row + 2


def read_header(path: Path) -> list[str]:
    """The header row, BOM stripped; an empty file or a bad encoding is an error naming the file."""
    if path.stat().st_size == 0:
        raise OpperfError("file is empty (no header row)", path=path, row=1)
    with open(path, "rb") as handle:
        first_line = handle.readline()
    try:
        header = next(csv.reader([first_line.decode("utf-8-sig")]), [])
    except UnicodeDecodeError:
        raise not_utf8_error(path) from None
    except csv.Error as exc:
        raise OpperfError(f"unreadable header: {exc}", path=path, row=1) from exc
    header = [name.strip() for name in header]
    if not any(header):
        raise OpperfError("file is empty (no header row)", path=path, row=1)
    return header


def _canonical_header(header: list[str], path: Path) -> dict[str, str]:
    """Raw header name → canonical name, for the columns we read; required columns checked here."""
    mapping: dict[str, str] = {}
    for name in header:
        canonical = COLUMN_ALIASES.get(name, name)
        if canonical in mapping.values():
            continue     # e.g. both `Type` and `OP Type`: the first one wins
        mapping[name] = canonical
    present = set(mapping.values())
    if ACCELERATOR_CORE not in present and ACCELERATOR_CORE_FALLBACK in mapping:
        mapping[ACCELERATOR_CORE_FALLBACK] = ACCELERATOR_CORE
        present.add(ACCELERATOR_CORE)
    missing = [c for c in REQUIRED_COLUMNS + (ACCELERATOR_CORE,) if c not in present]
    if missing:
        raise OpperfError(f"missing required column(s) {missing} (header has {header})", path=path, row=1,
                          field=missing[0])
    return mapping


def _check_last_line(path: Path, header_width: int) -> None:
    """A file cut off mid-row (no final newline, too few fields, open quote) is an error naming that line."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        handle.seek(max(0, size - 1))
        if handle.read(1) in (b"\n", b"\r"):
            return
        tail_start = max(0, size - (1 << 16))
        handle.seek(tail_start)
        tail = handle.read()
        handle.seek(0)
        line_count = sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 24), b""))
    last = tail.rsplit(b"\n", 1)[-1].decode("utf-8", errors="replace")
    try:
        fields = next(csv.reader(io.StringIO(last), strict=True), [])
    except csv.Error as exc:
        raise OpperfError(f"truncated last line ({exc})", path=path, row=line_count + 1) from exc
    if last.count('"') % 2:
        raise OpperfError("truncated last line (unterminated quoted field)", path=path, row=line_count + 1)
    if len(fields) < header_width:
        raise OpperfError(f"truncated last line: {len(fields)} of {header_width} fields", path=path,
                          row=line_count + 1)


def _locate_broken_row(path: Path, header_width: int, cause: Exception) -> OpperfError:
    """polars said no; find the line with the csv module so the message names it."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.reader(handle, strict=True)
            next(reader, None)
            for fields in reader:
                if len(fields) > header_width:
                    return OpperfError(f"row has {len(fields)} fields, the header {header_width}", path=path,
                                       row=reader.line_num)
    except UnicodeDecodeError:
        return not_utf8_error(path) or OpperfError("not UTF-8 text", path=path)
    except csv.Error as exc:
        return OpperfError(f"malformed CSV: {exc}", path=path, row=reader.line_num)
    return OpperfError(f"cannot parse CSV: {str(cause).splitlines()[0]}", path=path)


def read_profile_table(path: str | Path) -> ProfileTable:
    """Read a kernel_details / op_summary CSV into row form (see module docstring); bad files raise OpperfError."""
    path = Path(path)
    header = read_header(path)
    mapping = _canonical_header(header, path)
    _check_last_line(path, len(header))
    text_columns = [raw for raw, canonical in mapping.items()
                    if canonical in BASE_COLUMNS
                    or canonical in (TYPE, DURATION, INPUT_SCALARS, INPUT_STRIDES, PROFILING_INPUT_VALUES)]
    candidates = [raw for raw, canonical in mapping.items() if canonical not in BOOKKEEPING_COLUMNS
                  and raw not in BOOKKEEPING_COLUMNS]
    frame, counters, ignored = _read_columns(path, header, text_columns, candidates)
    frame = frame.rename({raw: mapping[raw] for raw in frame.columns if raw in mapping})
    for column in BASE_COLUMNS:
        if column not in frame.columns:      # OP State is absent in older headers
            frame = frame.with_columns(pl.lit("", dtype=pl.Categorical).alias(column))
    return ProfileTable(path=path, frame=frame, counters=[mapping[c] for c in counters], ignored_columns=ignored)


BLOCK_BYTES = 8 << 20


def _read_in_blocks(path: Path, read_options: dict) -> pl.DataFrame:
    """Read a large CSV a block of whole lines at a time (header repeated), so the raw text of the whole file
    is never in memory at once (a 218 MB file: 0.42 → 0.24 GB peak); row order is kept. Profiler tables have
    no line breaks inside fields. One reused buffer and one copy per block keep page faults down."""
    frames = []
    with open(path, "rb") as handle:
        header = handle.readline()
        buffer = bytearray(len(header) + 2 * BLOCK_BYTES)
        buffer[:len(header)] = header
        view = memoryview(buffer)
        data_start = filled = len(header)
        while True:
            count = handle.readinto(view[filled:filled + BLOCK_BYTES])
            filled += count
            cut = buffer.rfind(b"\n", data_start, filled) + 1 if count else filled
            if count and cut == 0:
                view.release()
                return pl.read_csv(path, **read_options)      # a line longer than a block: read it whole
            if cut > data_start or (not frames and not count):
                frames.append(pl.read_csv(bytes(view[:cut]), **read_options))
            rest = filled - cut
            buffer[data_start:data_start + rest] = buffer[cut:filled]
            filled = data_start + rest
            if not count:
                break
        view.release()
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical", rechunk=False)


def _read_columns(path: Path, header: list[str], text_columns: list[str],
                  candidates: list[str]) -> tuple[pl.DataFrame, list[str], list[str]]:
    """Fast path: duration and counters straight to Float64 (`N/A` → null), text as Categorical (a 500k-row
    file has a few thousand distinct shapes: one small integer per row instead of a string). If a number
    column holds text, fall back to reading it as text: a non-numeric duration is then skipped by line, and
    a candidate whose values are all text is no counter."""
    options = dict(has_header=True, infer_schema=False, encoding="utf8", empty_string_is_null=False,
                   quote_char='"', truncate_ragged_lines=False)
    duration = next(raw for raw in text_columns if COLUMN_ALIASES.get(raw, raw) == DURATION)
    text = [c for c in text_columns if c != duration]
    numbers = [duration] + candidates
    try:
        frame = _read_in_blocks(path, dict(columns=text + numbers, schema_overrides={
            **{c: pl.Categorical for c in text}, **{c: pl.Float64 for c in numbers}},
            null_values={c: "N/A" for c in numbers}, **options))
        return frame, candidates, []
    except pl.exceptions.PolarsError:
        pass     # a number column holds text (or the file is broken: the text read below says where)
    try:
        frame = pl.read_csv(path, columns=text + numbers,
                            schema_overrides={**{c: pl.Categorical for c in text}, **{c: pl.String for c in numbers}},
                            **options)
    except pl.exceptions.PolarsError as exc:
        raise _locate_broken_row(path, len(header), exc) from exc
    counters, ignored, casts = [], [], []
    for column in candidates:
        stripped = pl.col(column).str.strip_chars()
        as_number = stripped.cast(pl.Float64, strict=False)
        text_values = frame.select((as_number.is_null() & ~stripped.is_in(["", "N/A"])).sum()).item()
        if text_values and frame.select(as_number.is_not_null().sum()).item() == 0:
            ignored.append(column)           # a text column (a label), not a counter
            continue
        counters.append(column)
        casts.append(as_number.alias(column))
    frame = frame.with_columns(casts).drop(ignored)   # duration stays text: the aggregator reports bad values
    return frame, counters, ignored
