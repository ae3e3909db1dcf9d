"""The database as the peer runtime reads it: its spellings, its lookup key, and what it can find.

The consumer of a database is msmodeling's TensorCast runtime (`ProfilingDataSource.lookup`, wrapped by
`InterpolatingDataSource`). Facts about it that this module encodes (read from its code, msmodeling
84fec85, `tensor_cast/performance_model/profiling_database/profiling_data_source.py`):

- it reads `{KernelType}.csv` with pandas' defaults, so an empty cell is NaN; its shape parser turns
  `str(NaN)` into `int('nan')` and raises, stopping the model run. Shape cells are therefore written the
  way the Ascend profiler writes them, wrapped in literal quotes (`"1,16,1"`; an empty one is `""`), which
  the runtime strips;
- a query's dtypes are spelled by its `DTYPE_MAP`: bfloat16 `DT_BF16`, float32 `FLOAT`, int64 `INT64`,
  int32 `INT32`, int8 `INT8`, bool `BOOL` (float16 is queried as `DT_BF16`; float64 has no spelling and
  is never found);
- a query carries only tensor arguments of rank >= 1 (0-d tensors and Python scalars are dropped), in the
  order the op's schema lists them (lists of tensors flattened), and it compares them with the row's
  non-empty shape slots and non-empty dtype slots position by position: a dtype token written for a slot
  that has no shape shifts every later comparison;
- the compute path takes, among rows of equal rule distance, the first matching row; a leading size-1 dim
  is ignored on either side (`batch_strip`); `query_mode: elementwise` matches on the first output's shape
  and dtype only; rows without a finite positive latency (`Average Duration(us)`, else `Profiling Average
  Duration(us)`, else `Duration(us)`) are skipped.

So rows the runtime cannot tell apart must not both be written: `runtime_view` keeps one row per runtime
key (the layout that carried most of the workload's calls; an elementwise key's rows of other interpolation
regimes too, `elementwise_regime`) and the database keeps every row in `layouts/{KernelType}.csv`.
"""

from __future__ import annotations

import functools

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

from opperf import contract
from opperf.errors import OpperfError
from opperf.io import read_database_csv

# opperf's canonical dtype name -> the runtime's spelling, for databases written from torch traces (cpu, cuda).
# The six the runtime can query are its own strings; the rest follow CANN's bare spelling (FLOAT16, DOUBLE).
RUNTIME_DTYPE_SPELLING = {
    "DT_FLOAT": "FLOAT", "DT_BF16": "DT_BF16", "DT_FLOAT16": "FLOAT16", "DT_DOUBLE": "DOUBLE",
    "DT_INT8": "INT8", "DT_UINT8": "UINT8", "DT_INT16": "INT16", "DT_INT32": "INT32", "DT_INT64": "INT64",
    "DT_BOOL": "BOOL", "DT_INT4": "INT4", "DT_FLOAT8_E4M3FN": "FLOAT8_E4M3FN", "DT_FLOAT8_E5M2": "FLOAT8_E5M2",
    "DT_COMPLEX64": "COMPLEX64",
}
# The runtime's query spellings (its DTYPE_MAP values) by opperf canonical name: a dtype outside this table
# can never be queried, so a row with a tensor of that dtype is not findable.
RUNTIME_QUERY_DTYPE = {"DT_BF16": "DT_BF16", "DT_FLOAT16": "DT_BF16", "DT_FLOAT": "FLOAT", "DT_INT64": "INT64",
                       "DT_INT32": "INT32", "DT_INT8": "INT8", "DT_BOOL": "BOOL"}
# The latency columns the runtime reads, in its order of preference.
RUNTIME_LATENCY_COLUMNS = (contract.REPLAY_AVERAGE, contract.PROFILING_AVERAGE, "Duration(us)")
# Our column: how many rows of layouts/{KernelType}.csv share this row's runtime key.
RUNTIME_KEY_ROWS = "Runtime Key Rows"
TORCH_TRACE_BACKENDS = frozenset({"cpu", "cuda"})
# Matmul kernel types for which the runtime also accepts a transposed weight slot (its _MATMUL_KERNELS).
RUNTIME_MATMUL_KERNELS = frozenset({
    "MatMulV2", "MatMulV3", "MatMulCommon", "MatMul", "QuantBatchMatmulV3", "BatchMatMulV2",
    "TransposeBatchMatMul", "GroupedMatmul", "GroupedMatmulSwigluQuant",
})


def load_op_mapping(database: str | Path) -> dict:
    """A database directory's op_mapping.yaml, parsed (errors name the file)."""
    database = Path(database)
    mapping_path = database / "op_mapping.yaml"
    if not mapping_path.is_file():
        raise OpperfError("not a database directory: no op_mapping.yaml", path=database)
    try:
        document = yaml.safe_load(mapping_path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise OpperfError(f"cannot parse YAML: {exc}", path=mapping_path) from exc
    return document


def load_database(database: str | Path) -> tuple[dict, dict]:
    """(operator_mappings, {kernel type: its CSV as strings}) of a database directory."""
    database = Path(database)
    document = load_op_mapping(database)
    tables = {path.stem: read_database_csv(path) for path in sorted(database.glob("*.csv"))}
    if not tables:
        raise OpperfError("no {KernelType}.csv in the database directory", path=database)
    return document.get("operator_mappings") or {}, tables


def layouts_path(kernel_csv: str | Path) -> Path:
    """Where a database keeps every row of a kernel type: `layouts/{KernelType}.csv` beside the runtime's CSV."""
    kernel_csv = Path(kernel_csv)
    return kernel_csv.parent / "layouts" / kernel_csv.name


def quoted_shape_cell(value: object) -> str:
    """A shape field as the profiler writes it, literal quotes included: `1,16,1` -> `"1,16,1"`, `` -> `""`."""
    return '"' + contract.strip_profiler_quotes(value) + '"'


def runtime_dtype(name: str) -> str:
    """A dtype token in the runtime's spelling (torch-trace databases); unknown or empty tokens unchanged."""
    name = name.strip()
    if not name or not contract.is_known_dtype(name):
        return name
    return RUNTIME_DTYPE_SPELLING.get(contract.canonical_dtype(name), name)


def _slots(value: object) -> list[str]:
    return contract.split_slots(contract.strip_profiler_quotes(value))


def runtime_row(row: Mapping[str, str], backend: str, out_slots: Mapping[int, Sequence[int]] | None = None,
                aligned: bool = True) -> dict[str, str]:
    """One row in the runtime's text.

    Every back end: shape cells quoted. Torch-trace back ends (cpu, cuda), whose text opperf authors: dtypes
    in the runtime's spelling and, when `aligned` (the runtime's CSV; the layouts file keeps every slot as
    recorded), the dtype and format of a slot that is no rank >= 1 tensor for the runtime (a scalar, a 0-d
    tensor, an `out=` argument the functional call does not have) left empty, so that its shape and dtype
    lists stay aligned. The slot's shape is emptied too for `out=` slots; slot positions (and so Input
    Scalars / Input Strides) are unchanged. NPU rows keep the profiler's text. `out_slots`: a row's `out=` slots
    by its input slot count (each of an op's overloads lays its arguments out in its own count).
    """
    result = dict(row)
    if backend in TORCH_TRACE_BACKENDS:
        hidden_inputs = set((out_slots or {}).get(contract.input_slot_count(row), ()))
        for shapes_col, dtypes_col, formats_col, hidden in (
                (contract.INPUT_SHAPES, contract.INPUT_DTYPES, contract.INPUT_FORMATS, hidden_inputs),
                (contract.OUTPUT_SHAPES, contract.OUTPUT_DTYPES, contract.OUTPUT_FORMATS, set())):
            shapes = _slots(row.get(shapes_col, ""))
            dtypes = _slots(row.get(dtypes_col, ""))
            formats = _slots(row.get(formats_col, ""))
            width = max(len(shapes), len(dtypes), len(formats))
            shapes += [""] * (width - len(shapes))
            dtypes += [""] * (width - len(dtypes))
            formats += [""] * (width - len(formats))
            for index in range(width):
                dtypes[index] = runtime_dtype(dtypes[index])
                if not aligned:
                    continue
                if index in hidden:
                    shapes[index] = ""
                if not shapes[index].strip():
                    dtypes[index] = formats[index] = ""
            result[shapes_col] = ";".join(shapes)
            result[dtypes_col] = ";".join(dtypes)
            result[formats_col] = ";".join(formats)
    for column in (contract.INPUT_SHAPES, contract.OUTPUT_SHAPES):
        result[column] = quoted_shape_cell(result.get(column, ""))
    return result


# --- the runtime's key -----------------------------------------------------------------------------


def strip_batch(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The runtime ignores a leading size-1 dim of a rank >= 2 shape on either side of a comparison."""
    return shape[1:] if len(shape) > 1 and shape[0] == 1 else shape


def _shapes(value: object) -> list[tuple[int, ...]]:
    return [s for s in contract.parse_shapes(value) if s is not None]


def _names(value: object) -> list[str]:
    return [n for n in contract.parse_names(value) if n]


def runtime_nz_to_nd(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The runtime's FRACTAL_NZ restoration, (..., H, W, bh, bw) → (..., H*bw, W*bh); rank < 4 unchanged.

    Not `contract.fractal_nz_to_nd`, which gives (..., W*bh, H*bw): what the runtime matches on follows it."""
    if len(shape) < 4:
        return tuple(shape)
    *batch, h, w, block_h, block_w = shape
    return (*batch, h * block_w, w * block_h)


def _logical(shape: tuple[int, ...], fmt: str) -> tuple[int, ...]:
    return runtime_nz_to_nd(shape) if fmt == "FRACTAL_NZ" else tuple(shape)


@dataclass(frozen=True)
class RuntimeQuery:
    """What the runtime receives for one call: tensor inputs of rank >= 1 and the first output."""

    inputs: tuple[tuple[tuple[int, ...], str], ...]     # (shape, runtime query dtype)
    output: tuple[tuple[int, ...], str] | None


# `query_mode: attention_special` also reads a row's mean context: rows of one shape at two contexts answer
# different queries (decode at 512 and 519 share every shape; docs/msmodeling.md).
ATTENTION_KEY_COLUMNS = ("Runtime avg_seq_len",)


def runtime_key(row: Mapping[str, str], elementwise: bool = False, attention: bool = False) -> tuple:
    """What the runtime matches a row on: rows with equal keys answer the same queries.

    Compute path: the tensor slots' shapes (leading 1 dropped, FRACTAL_NZ restored) and dtypes, and for
    `attention` (query_mode attention_special) the mean context; elementwise query mode: the first output's shape
    (leading 1 dropped) and dtype.
    """
    if elementwise:
        shapes, dtypes = _shapes(row.get(contract.OUTPUT_SHAPES, "")), _names(row.get(contract.OUTPUT_DTYPES, ""))
        return ("elementwise", strip_batch(shapes[0]) if shapes else None, dtypes[0] if dtypes else None)
    shapes = _shapes(row.get(contract.INPUT_SHAPES, ""))
    dtypes = _names(row.get(contract.INPUT_DTYPES, ""))
    formats = _names(row.get(contract.INPUT_FORMATS, ""))
    logical = tuple(strip_batch(_logical(s, formats[i] if i < len(formats) else "ND")) for i, s in enumerate(shapes))
    context = tuple(contract.strip_profiler_quotes(row.get(c, "")) for c in ATTENTION_KEY_COLUMNS) if attention else ()
    return ("compute", logical, tuple(dtypes[:len(shapes)]), *context)


def broadcast_pattern(output: Sequence[int], inputs: Sequence[Sequence[int]]) -> tuple:
    """msmodeling's `_elementwise_broadcast_pattern`: per input, its rank and each of its dims against the output's,
    right-aligned (`missing`, `same`, `broadcast` for a 1 against more, else `other`)."""
    output = tuple(output)
    if not output or not inputs:
        return ()
    patterns = []
    for shape in map(tuple, inputs):
        padded = (None,) * max(0, len(output) - len(shape)) + shape[-len(output):]
        patterns.append((len(shape), tuple("missing" if dim is None else "same" if int(dim) == int(out) else
                                           "broadcast" if int(dim) == 1 and int(out) != 1 else "other"
                                           for dim, out in zip(padded, output))))
    return tuple(patterns)


def elementwise_regime(row: Mapping[str, str]) -> tuple:
    """How msmodeling's elementwise interpolation groups a row: the number of inputs and their broadcast_pattern
    (leading 1 dropped on every shape). Rows of one output shape but another regime (a cat of one block, a cat of
    128 expert blocks) are one exact key to it and distinct interpolation points."""
    output = _shapes(row.get(contract.OUTPUT_SHAPES, ""))
    if not output:
        return ()
    inputs = [strip_batch(s) for s in _shapes(row.get(contract.INPUT_SHAPES, ""))]
    return len(inputs), broadcast_pattern(strip_batch(output[0]), inputs)


def row_latency(row: Mapping[str, str]) -> float | None:
    """The latency the runtime takes from a row (its column order), or None where it would skip the row."""
    for column in RUNTIME_LATENCY_COLUMNS:
        try:
            value = float(contract.strip_profiler_quotes(row.get(column, "")))
        except ValueError:
            continue
        if math.isfinite(value) and value > 0:
            return value
    return None


def _elements(row: Mapping[str, str]) -> int:
    """Elements of a row's input tensors (then of its outputs): the size the runtime's padding rule orders by."""
    inputs = sum(math.prod(s) for s in _shapes(row.get(contract.INPUT_SHAPES, "")))
    return inputs or sum(math.prod(s) for s in _shapes(row.get(contract.OUTPUT_SHAPES, "")))


def _rank(row: Mapping[str, str]) -> int:
    return sum(len(s) for s in _shapes(row.get(contract.INPUT_SHAPES, "")))


def _calls(row: Mapping[str, str]) -> int:
    try:
        return int(float(row.get(contract.PROFILING_SAMPLE_COUNT, "") or 0))
    except ValueError:
        return 0


def runtime_view(frame: pd.DataFrame, backend: str, out_slots: Mapping[int, Sequence[int]] | None = None,
                 elementwise: bool = False, attention: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the runtime's CSV, every row): one row per runtime key, and all rows in the runtime's text.

    Of rows sharing a key, the runtime gets the one it can use (a finite positive latency) that carried
    most of the profiled calls (the workload's dominant layout); among rows without calls, a row of the
    consumer's own query (its model's layout at these shapes) before a grid pattern's; then the first. Rows are
    written largest call first (see below); `Runtime Key Rows` says how many rows of the layouts file one stands
    for. Elementwise rows of one key but different `elementwise_regime`s are all written: the runtime's exact
    match takes the first, its interpolation needs each as a point of its own regime.
    """
    rows = frame.to_dict(orient="records")
    records = [runtime_row(r, backend, out_slots) for r in rows]
    groups: dict[tuple, list[int]] = {}
    for index, record in enumerate(records):
        groups.setdefault(_view_key(record, elementwise, attention), []).append(index)
    chosen = []
    for members in groups.values():
        best = max(members, key=lambda i: (row_latency(records[i]) is not None, _calls(records[i]),
                                           bool(records[i].get(contract.CONSUMER_QUERY)), -i))
        chosen.append((members[0], best, len(members)))
    # Larger calls first: the runtime matches a query to a row whose dims it may pad up to (a query dim of
    # 64 "pads" a row dim of 1), and a later rule can relabel such a match as exact, so a smaller row written
    # earlier would answer a larger row's own query. No row can pad a larger one, so this order leaves every
    # row's own query to itself. Among equal sizes, higher rank first (a query of (1, 1, 256, 128) has its
    # leading 1 dropped and then equals a (1, 256, 128) row), then the input order.
    view = []
    for _, best, count in sorted(chosen, key=lambda c: (-_elements(records[c[1]]), -_rank(records[c[1]]), c[0])):
        view.append({**records[best], RUNTIME_KEY_ROWS: str(count)})
    columns = list(frame.columns)
    every_row = pd.DataFrame([runtime_row(r, backend, aligned=False) for r in rows], columns=columns)
    return pd.DataFrame(view, columns=[*columns, RUNTIME_KEY_ROWS]), every_row


_SLOT_COLUMNS = (contract.INPUT_SHAPES, contract.INPUT_DTYPES, contract.INPUT_FORMATS,
                 contract.OUTPUT_SHAPES, contract.OUTPUT_DTYPES, contract.OUTPUT_FORMATS)


def runtime_lines(view: pd.DataFrame, every_row: pd.DataFrame) -> list[int | None]:
    """Per row of the layouts file (`every_row`), the line (2-based) of the runtime's CSV (`view`) written from
    it, or None where the runtime's CSV holds another row of its runtime key instead.

    Read back from the two files, so no definition is needed: a runtime row is its layouts row with the other
    columns equal and, in the six slot columns, the same slots with some emptied (`runtime_row`'s alignment).
    Rows alike in every column are told apart by order (runtime_view keeps the first of equals).
    """
    others = [c for c in every_row.columns if c not in _SLOT_COLUMNS]
    by_other_columns: dict[tuple, list[int]] = {}
    layouts = every_row.to_dict(orient="records")
    for index, row in enumerate(layouts):
        by_other_columns.setdefault(tuple(str(row.get(c, "")) for c in others), []).append(index)
    lines: list[int | None] = [None] * len(layouts)
    for line, row in enumerate(view.to_dict(orient="records"), start=2):
        candidates = by_other_columns.get(tuple(str(row.get(c, "")) for c in others), [])
        for index in candidates:
            if lines[index] is None and all(_emptied_from(row.get(c, ""), layouts[index].get(c, ""))
                                            for c in _SLOT_COLUMNS):
                lines[index] = line
                break
    return lines


def _emptied_from(runtime_cell: object, layouts_cell: object) -> bool:
    """Whether a slot column of the runtime's CSV is the layouts file's with some slots emptied."""
    written, every = _slots(runtime_cell), _slots(layouts_cell)
    written = written or [""] * len(every)        # one slot emptied reads back as no slot
    return len(written) == len(every) and all(w in ("", e) for w, e in zip(written, every))


def _view_key(record: Mapping[str, str], elementwise: bool, attention: bool = False) -> tuple:
    key = runtime_key(record, elementwise, attention)
    return (*key, elementwise_regime(record)) if elementwise else key


def duplicate_keys(frame: pd.DataFrame, elementwise: bool = False) -> list[list[int]]:
    """Groups of CSV lines (2-based) that share a runtime key: the runtime answers all with the first (elementwise
    rows of other regimes are points of their own: runtime_view)."""
    groups: dict[tuple, list[int]] = {}
    for index, record in enumerate(frame.to_dict(orient="records")):
        groups.setdefault(_view_key(record, elementwise), []).append(index + 2)
    return [lines for lines in groups.values() if len(lines) > 1]


# --- what the runtime finds ------------------------------------------------------------------------

# The runtime's tile sizes for "padding" matches (a query dim rounded up to a multiple of one of them
# matches the unpadded row dim); 8 only for row dims of at least 64.
_BLOCK_SIZES = (16, 32, 64)
_BLOCK_SIZE_MIN_DIM = {8: 64}


def is_block_padded(query_dim: int, row_dim: int) -> bool:
    """Whether `query_dim` is `row_dim` rounded up to a tile the runtime tolerates (16/32/64; 8 from 64 up)."""
    if query_dim <= row_dim:
        return False
    if any(query_dim == -(-row_dim // size) * size for size in _BLOCK_SIZES):
        return True
    return any(row_dim >= least and query_dim == -(-row_dim // size) * size
               for size, least in _BLOCK_SIZE_MIN_DIM.items())


def _padded(query: tuple[int, ...], row: tuple[int, ...]) -> bool:
    if len(query) != len(row) or query == row:
        return False
    return all(q == r or is_block_padded(q, r) for q, r in zip(query, row))


def _input_rule(kernel_type: str, index: int, query: tuple[int, ...], row: tuple[int, ...]) -> str | None:
    """The runtime's rule matching one query input to one row slot (None: no rule), ignoring NPU-only ones."""
    if query == row:
        return "identity"
    query_stripped, row_stripped = strip_batch(query), strip_batch(row)
    if query_stripped in (row_stripped, row):
        return "batch_strip"
    if kernel_type in RUNTIME_MATMUL_KERNELS and index >= 1:
        if len(query_stripped) == 2 and len(row) == 2 and query_stripped == (row[1], row[0]):
            return "transpose"
        if (len(query_stripped) == 3 and len(row) == 3 and query_stripped[0] == row[0]
                and query_stripped[1:] == (row[2], row[1])):
            return "batched_transpose"
    if _padded(query_stripped, row):
        return "padding"
    if _padded(query_stripped, row_stripped):
        return "batch_strip+padding"
    return None


@dataclass(frozen=True)
class _ParsedRow:
    """A row as the runtime compares it, parsed once per table."""

    latency: float | None
    inputs: tuple[tuple[int, ...], ...]          # logical shapes (FRACTAL_NZ restored) of non-empty slots
    dtypes: tuple[str, ...]
    output: tuple[int, ...] | None
    output_dtype: str | None


_PARSED: dict[int, tuple[pd.DataFrame, list[_ParsedRow]]] = {}


def _parsed(table: pd.DataFrame) -> list[_ParsedRow]:
    """The table's rows parsed (cached while the table lives: the check asks once per row)."""
    cached = _PARSED.get(id(table))
    if cached is not None and cached[0] is table:
        return cached[1]
    rows = []
    for record in table.to_dict(orient="records"):
        shapes = _shapes(record.get(contract.INPUT_SHAPES, ""))
        formats = _names(record.get(contract.INPUT_FORMATS, ""))
        outputs = _shapes(record.get(contract.OUTPUT_SHAPES, ""))
        out_dtypes = _names(record.get(contract.OUTPUT_DTYPES, ""))
        rows.append(_ParsedRow(
            row_latency(record),
            tuple(_logical(s, formats[i] if i < len(formats) else "ND") for i, s in enumerate(shapes)),
            tuple(_names(record.get(contract.INPUT_DTYPES, ""))),
            outputs[0] if outputs else None, out_dtypes[0] if out_dtypes else None))
    if len(_PARSED) > 256:
        _PARSED.clear()
    _PARSED[id(table)] = (table, rows)
    return rows


def answered_by_output(mapping: Mapping, table: pd.DataFrame, kernel_type: str, index: int,
                       answer: tuple[str, int] | None) -> bool:
    """Whether the runtime's `answer` (find's hit) to row `index`'s own query is the first row of that row's output
    shape under the elementwise path (scaled by the output dtypes' bytes where they differ): the row, of another
    dtype or input regime (elementwise_regime), stays an interpolation point of its own. One output shape as the
    path compares them: the asking row's leading 1 dropped, the answering row's with or without its own
    ([1, 1, 6, 2560] is asked as [1, 6, 2560]); a row answered by a padded or flattened match is shadowed."""
    if mapping.get("query_mode") != "elementwise" or answer is None or answer[0] != kernel_type:
        return False
    rows = _parsed(table)
    found, asked = rows[answer[1]].output, rows[index].output
    return found is not None and asked is not None and strip_batch(asked) in (found, strip_batch(found))


def _compute_match(kernel_type: str, query: RuntimeQuery, row: _ParsedRow, input_count: int | None) -> str | None:
    shapes, dtypes, inputs = row.inputs, row.dtypes, query.inputs
    if input_count is not None:
        shapes, dtypes, inputs = shapes[:input_count], dtypes[:input_count], inputs[:input_count]
    if len(inputs) != len(shapes):
        return None
    matched = "identity"
    for index, (shape, dtype) in enumerate(inputs):
        if index >= len(dtypes) or dtypes[index] != dtype:
            return None
        rule = _input_rule(kernel_type, index, shape, shapes[index])
        if rule is None:
            return None
        # The runtime names the match after the last non-identity rule, except that a padding rule does not
        # overwrite an earlier rewrite (its distance, 1 for names with "padding", ranks the candidates).
        if rule == "padding":
            matched = "padding" if matched == "identity" else matched
        elif rule == "batch_strip+padding":
            matched = rule if matched in ("identity", "batch_strip") else matched
        elif rule != "identity":
            matched = rule
    return matched


# The runtime's byte sizes of its dtype spellings (its _DTYPE_BYTE_SIZES): an elementwise row whose output dtype
# differs from the query's answers scaled by their ratio; a dtype outside this table (BOOL) matches no other dtype.
RUNTIME_DTYPE_BYTES = {"DT_BF16": 2, "DT_FLOAT16": 2, "FLOAT": 4, "DT_FLOAT": 4, "INT8": 1, "DT_INT8": 1,
                       "INT16": 2, "INT32": 4, "DT_INT32": 4, "INT64": 8, "DT_INT64": 8}


def elementwise_dtype_scale(query_dtype: str | None, row_dtype: str | None) -> float | None:
    """What the runtime's elementwise exact path multiplies a row's latency by: 1 for the query's own output dtype,
    the ratio of byte sizes for another (a bf16 row answers a float32 query at twice its time), None (no match)
    where either size is unknown."""
    if query_dtype and row_dtype and query_dtype == row_dtype:
        return 1.0
    query_bytes, row_bytes = RUNTIME_DTYPE_BYTES.get(query_dtype or "", 0), RUNTIME_DTYPE_BYTES.get(row_dtype or "", 0)
    return query_bytes / row_bytes if query_bytes and row_bytes else None


def _elementwise_match(query: RuntimeQuery, row: _ParsedRow) -> str | None:
    if query.output is None or row.output is None:
        return None
    shape, dtype = query.output
    stripped, target, target_stripped = strip_batch(shape), row.output, strip_batch(row.output)
    matched = (stripped in (target, target_stripped) or _padded(stripped, target)
               or _padded(stripped, target_stripped))
    if not matched and len(stripped) == 3 and len(target) == 2:
        flat = (stripped[0] * stripped[1], stripped[2])
        matched = flat in (target, target_stripped) or _padded(flat, target) or _padded(flat, target_stripped)
    if not matched or elementwise_dtype_scale(dtype, row.output_dtype) is None:
        return None
    return "elementwise" if row.output_dtype == dtype else "elementwise_dtype_scaled"


def _elementwise_query(mapping: Mapping, query: RuntimeQuery) -> bool:
    """Whether the runtime answers `query` by its elementwise path: the mode, and a rank >= 1 output (without one
    it falls back to the compute path)."""
    return mapping.get("query_mode") == "elementwise" and query.output is not None and len(query.output[0]) >= 1


def answered_latency(tables: Mapping[str, pd.DataFrame | None], mapping: Mapping, query: RuntimeQuery,
                     hit: tuple[str, int]) -> float | None:
    """The latency the runtime answers with for `find`'s hit: the row's, scaled by the output dtypes' byte sizes
    where the elementwise mode matched a row of another output dtype."""
    kernel_type, index = hit
    row = _parsed(tables[kernel_type])[index]
    if _elementwise_query(mapping, query):
        scale = elementwise_dtype_scale(query.output[1], row.output_dtype)
        return None if row.latency is None or scale is None else row.latency * scale
    return row.latency


def find(tables: Mapping[str, pd.DataFrame | None], mapping: Mapping, query: RuntimeQuery) -> tuple[str, int] | None:
    """(kernel type, 0-based row) the runtime's exact lookup answers `query` with under `mapping`, or None.

    Models the compute path (rules identity, batch_strip, matmul transposes, padding; nearest rule first,
    then the first kernel type and row) and the elementwise query mode (first match). Query modes built
    on kernel-specific code (attention_special, moe_fused, composites) are not modelled: None.
    """
    kernel_types = [mapping.get("kernel_type"), *mapping.get("alternate_kernel_types", [])]
    kernel_types = [k for k in dict.fromkeys(kernel_types) if k]
    if mapping.get("composite") or mapping.get("query_mode") in ("attention_special", "moe_fused", "mtp_projection"):
        return None
    elementwise = _elementwise_query(mapping, query)
    best: tuple[float, int, int] | None = None
    for kernel_index, kernel_type in enumerate(kernel_types):
        table = tables.get(kernel_type)
        if table is None:
            continue
        for row_index, row in enumerate(_parsed(table)):
            if row.latency is None:
                continue
            if elementwise:
                if _elementwise_match(query, row):
                    return kernel_type, row_index
                continue
            rule = _compute_match(kernel_type, query, row, mapping.get("tc_input_count"))
            if rule is None:
                continue
            score = (1.0 if "padding" in rule else 0.0, kernel_index, row_index)
            if best is None or score < best:
                best = score
    if best is None:
        return None
    return kernel_types[best[1]], best[2]


def unspelled_input_dtypes(record: Mapping[str, str]) -> list[str]:
    """The known input dtypes of a row that the runtime's DTYPE_MAP cannot spell (COMPLEX64, DOUBLE): it never
    asks for such a row, whatever the database does with it."""
    shapes, dtypes = _shapes(record.get(contract.INPUT_SHAPES, "")), _names(record.get(contract.INPUT_DTYPES, ""))
    return sorted({name for name in dtypes[:len(shapes)]
                   if contract.is_known_dtype(name) and contract.canonical_dtype(name) not in RUNTIME_QUERY_DTYPE})


def row_query(record: Mapping[str, str]) -> tuple[RuntimeQuery | None, str]:
    """The query the runtime receives for a call with this row's tensors, or (None, why it cannot be asked)."""
    shapes = _shapes(record.get(contract.INPUT_SHAPES, ""))
    dtypes = _names(record.get(contract.INPUT_DTYPES, ""))
    formats = _names(record.get(contract.INPUT_FORMATS, ""))
    inputs = []
    for index, shape in enumerate(shapes):
        name = dtypes[index] if index < len(dtypes) else ""
        if not contract.is_known_dtype(name) or contract.canonical_dtype(name) not in RUNTIME_QUERY_DTYPE:
            return None, f"input dtype {name or '(none)'} has no spelling in the runtime's DTYPE_MAP"
        inputs.append((_logical(shape, formats[index] if index < len(formats) else "ND"),
                       RUNTIME_QUERY_DTYPE[contract.canonical_dtype(name)]))
    out_shapes, out_dtypes = _shapes(record.get(contract.OUTPUT_SHAPES, "")), _names(record.get(contract.OUTPUT_DTYPES, ""))
    output = None
    if out_shapes and out_dtypes and contract.is_known_dtype(out_dtypes[0]):
        output = (out_shapes[0], RUNTIME_QUERY_DTYPE.get(contract.canonical_dtype(out_dtypes[0]), out_dtypes[0]))
    return RuntimeQuery(tuple(inputs), output), ""


# --- which ops the runtime receives ------------------------------------------------------------------

# Namespaces of the ops TensorCast's dispatch records: aten (and prims) ops that reach dispatch, and its own
# tensor_cast ops (attention, fused norms, MoE, collectives). torch_npu, vLLM and ATB ops are what a
# serving engine calls on the device; the performance model never issues them.
RECEIVED_NAMESPACES = ("aten", "prims", "tensor_cast")


def runtime_receives(framework_op: str) -> tuple[bool, str]:
    """(True, '') if the runtime can be asked for `framework_op`, else (False, why not).

    An aten op with a CompositeImplicitAutograd kernel (aten.linear, aten.matmul, aten.layer_norm ...)
    decomposes before any dispatch mode sees it: its parts are what the runtime receives.
    """
    namespace, _, rest = framework_op.partition(".")
    if namespace not in RECEIVED_NAMESPACES:
        return False, f"TensorCast issues {', '.join(RECEIVED_NAMESPACES)} ops, never {namespace} ops"
    if namespace == "tensor_cast":
        return True, ""
    import torch

    name, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, namespace), name, None)
    if packet is None or (overload or "default") not in packet.overloads():
        return False, f"torch {torch.__version__} has no op {framework_op}"
    op = getattr(packet, overload or "default")
    try:
        composite = op.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd)
    except RuntimeError:        # an overload torch registers by name only (aten::index_put_.hacked_twin)
        return False, f"torch {torch.__version__} has no dispatchable op {framework_op}"
    if composite:
        return False, "decomposes (CompositeImplicitAutograd) before dispatch: its parts reach the runtime"
    return True, ""


# Not aliasing by schema, but a view in effect: torch issues it for a contiguous input (F.linear on 3-D).
VIEW_IN_EFFECT = ("aten._unsafe_view.default",)
# Views no model forward issues (autograd internals, tests, sparse and nested accessors): left out of op_mapping.
_NOT_A_MODEL_VIEW = ("_test_", "nested", "sparse", "indices", "values", "_fw_primal", "_make_dual")


@functools.lru_cache(maxsize=1)
def view_framework_ops() -> tuple[str, ...]:
    """The aten ops that reach dispatch and only make a view (the schema's first return aliases an input and
    nothing is written): no kernel runs, so op_mapping answers them `zero_cost`, as the peer's does for
    view/t/transpose/expand/split/slice."""
    import torch

    found = set(VIEW_IN_EFFECT)
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::") or not schema.returns:
            continue
        if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
            continue
        alias = schema.returns[0].alias_info
        if alias is None or alias.is_write:
            continue
        framework_op = f"aten.{schema.name[len('aten::'):]}.{schema.overload_name or 'default'}"
        if any(part in framework_op for part in _NOT_A_MODEL_VIEW):
            continue
        if runtime_receives(framework_op)[0]:
            found.add(framework_op)
    return tuple(sorted(found))


def schema_framework_ops(kernel_type: str) -> list[str]:
    """The functional overloads of a torch-trace kernel type's own op that reach dispatch (no `out=`).

    A torch trace names a kernel type after its aten op (`argmax`, `index_put_`, `vllm.rms_norm`); when no
    definition lists its framework ops, the op itself is what the performance model issues.
    """
    import torch

    namespace, dot, name = kernel_type.partition(".")
    if not dot:
        namespace, name = "aten", kernel_type
    packet = getattr(getattr(torch.ops, namespace, None), name, None)
    if packet is None:
        return []
    found = []
    for overload in packet.overloads():
        schema = getattr(packet, overload)._schema
        if any(argument.name == "out" or argument.is_out for argument in schema.arguments):
            continue
        framework_op = f"{namespace}.{name}.{overload}"
        if runtime_receives(framework_op)[0]:
            found.append(framework_op)
    return found


def is_pointwise(framework_op: str) -> bool:
    """Whether torch tags `framework_op` pointwise (an in-place overload by its functional twin's tag:
    `masked_fill_.Scalar` by `masked_fill.Scalar`).

    The runtime's generic compute path interpolates along a query's first dim and groups rows by every other
    input dim, so an op whose second operand follows the first's rows (a `[tokens, 1]` mask) never finds a
    neighbour; its `elementwise` mode interpolates along the inputs' and output's elements, which is what a
    pointwise kernel's time follows.
    """
    import torch

    namespace, _, rest = framework_op.partition(".")
    name, _, overload = rest.partition(".")
    candidates = [name] + ([name[:-1]] if name.endswith("_") and not name.endswith("__") else [])
    for candidate in candidates:
        packet = getattr(getattr(torch.ops, namespace, None), candidate, None)
        if packet is not None and (overload or "default") in packet.overloads():
            if torch.Tag.pointwise in getattr(packet, overload or "default").tags:
                return True
    return False
