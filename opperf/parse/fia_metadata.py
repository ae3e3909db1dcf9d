"""FusedInferAttentionScore (FIA) runtime metadata: the `Runtime …` columns of FusedInferAttentionScore.csv.

An FIA kernel's cost depends on the actual sequence lengths of the batch, which the profiler's shapes do not
carry (only the *shape* of the `actual_seq_lengths` tensors). Two sources fill the columns:

1. At parse time, from the profile itself: the shapes of the `actual_seq_lengths` (input slot 5),
   `actual_seq_lengths_kv` (slot 6) and `block_table` (slot 14) tensors, taken from the bundle's
   `operator_details.csv` row paired (in launch order) with the kernel row where the bundle has one, else
   from the kernel row. `Runtime metadata_completeness` = `profile_shapes_only`.
2. Afterwards, `scripts/fill_fia_runtime_metadata.py` backfills the values from a JSONL log written by the
   serving process (one object per FIA call), matched by input signature (see `runtime_key`).

Column names are the peer's (its runtime reads them), plus our `Runtime payload_count`.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from opperf.contract import INPUT_SHAPES, OUTPUT_SHAPES, order_columns, parse_shapes, strip_profiler_quotes
from opperf.errors import OpperfError
from opperf.io import atomic_output
from opperf.log import get_logger

log = get_logger("parse.fia")

FIA_KERNEL_TYPE = "FusedInferAttentionScore"

RUNTIME_SOURCE_PROFILE = "Runtime source_profile"
RUNTIME_SEQ_LENGTHS_SHAPE = "Runtime actual_seq_lengths_shape"
RUNTIME_SEQ_LENGTHS_VALUES = "Runtime actual_seq_lengths_values"
RUNTIME_SEQ_LENGTHS_KV_SHAPE = "Runtime actual_seq_lengths_kv_shape"
RUNTIME_SEQ_LENGTHS_KV_VALUES = "Runtime actual_seq_lengths_kv_values"
RUNTIME_AVG_SEQ_LEN = "Runtime avg_seq_len"
RUNTIME_BLOCK_TABLE_SHAPE = "Runtime block_table_shape"
RUNTIME_BLOCK_TABLE_VALID_BLOCKS = "Runtime block_table_valid_blocks"
RUNTIME_NUM_HEADS = "Runtime num_heads"
RUNTIME_NUM_KEY_VALUE_HEADS = "Runtime num_key_value_heads"
RUNTIME_SPARSE_MODE = "Runtime sparse_mode"
RUNTIME_INPUT_LAYOUT = "Runtime input_layout"
RUNTIME_BLOCK_SIZE = "Runtime block_size"
RUNTIME_ATTN_STATE = "Runtime attn_state"
RUNTIME_KV_CACHE_MODE = "Runtime kv_cache_mode"
RUNTIME_METADATA_COMPLETENESS = "Runtime metadata_completeness"
RUNTIME_PAYLOAD_COUNT = "Runtime payload_count"    # ours: distinct runtime payloads seen for the row's signature

RUNTIME_COLUMNS = [
    RUNTIME_SOURCE_PROFILE, RUNTIME_SEQ_LENGTHS_SHAPE, RUNTIME_SEQ_LENGTHS_VALUES, RUNTIME_SEQ_LENGTHS_KV_SHAPE,
    RUNTIME_SEQ_LENGTHS_KV_VALUES, RUNTIME_AVG_SEQ_LEN, RUNTIME_BLOCK_TABLE_SHAPE, RUNTIME_BLOCK_TABLE_VALID_BLOCKS,
    RUNTIME_NUM_HEADS, RUNTIME_NUM_KEY_VALUE_HEADS, RUNTIME_SPARSE_MODE, RUNTIME_INPUT_LAYOUT, RUNTIME_BLOCK_SIZE,
    RUNTIME_ATTN_STATE, RUNTIME_KV_CACHE_MODE, RUNTIME_METADATA_COMPLETENESS, RUNTIME_PAYLOAD_COUNT,
]
COMPLETENESS_SHAPES_ONLY = "profile_shapes_only"
COMPLETENESS_RUNTIME = "runtime_values_dumped"

# Input slots of aclnnFusedInferAttentionScore (its parameter order).
SLOT_QUERY, SLOT_KEY, SLOT_VALUE, SLOT_ATTEN_MASK = 0, 1, 2, 4
SLOT_SEQ_LENGTHS, SLOT_SEQ_LENGTHS_KV, SLOT_BLOCK_TABLE = 5, 6, 14
# JSONL keys copied verbatim into a Runtime column.
_PLAIN_FIELDS = {
    "num_heads": RUNTIME_NUM_HEADS, "num_key_value_heads": RUNTIME_NUM_KEY_VALUE_HEADS,
    "sparse_mode": RUNTIME_SPARSE_MODE, "input_layout": RUNTIME_INPUT_LAYOUT, "block_size": RUNTIME_BLOCK_SIZE,
    "attn_state": RUNTIME_ATTN_STATE, "kv_cache_mode": RUNTIME_KV_CACHE_MODE,
}


def _slot(shapes_text: str, index: int) -> str:
    slots = strip_profiler_quotes(shapes_text).split(";")
    return slots[index].strip() if index < len(slots) else ""


def profile_metadata(input_shapes: str, source_profile: str) -> dict[str, str]:
    """The Runtime columns a profile alone can fill (tensor shapes, no values)."""
    row = dict.fromkeys(RUNTIME_COLUMNS, "")
    row.update({RUNTIME_SOURCE_PROFILE: source_profile,
                RUNTIME_SEQ_LENGTHS_SHAPE: _slot(input_shapes, SLOT_SEQ_LENGTHS),
                RUNTIME_SEQ_LENGTHS_KV_SHAPE: _slot(input_shapes, SLOT_SEQ_LENGTHS_KV),
                RUNTIME_BLOCK_TABLE_SHAPE: _slot(input_shapes, SLOT_BLOCK_TABLE),
                RUNTIME_METADATA_COMPLETENESS: COMPLETENESS_SHAPES_ONLY})
    return row


def _operator_fia_shapes(path: Path) -> list[str]:
    """Input Shapes of the FIA rows of an operator_details.csv, in file order."""
    with open(path, newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        if not reader.fieldnames or INPUT_SHAPES not in reader.fieldnames:
            log.info("%s has no %r column: not used for FIA metadata", path, INPUT_SHAPES)
            return []
        shapes = []
        for row in reader:
            names = " ".join(str(row.get(k) or "") for k in ("Type", "Name", "Op Type", "Op Name", "Operator Type",
                                                            "Operator Name"))
            if "fusedinferattentionscore" in names.lower().replace("_", ""):
                shapes.append(strip_profiler_quotes(row.get(INPUT_SHAPES, "")))
        return shapes


def add_fia_profile_metadata(database, inputs, tables) -> None:
    """Give every FusedInferAttentionScore row the profile-derived Runtime columns (module docstring, 1)."""
    import polars as pl     # here, not at the top: the grid imports this module for its column names only

    from opperf.parse.aggregate import add_columns
    from opperf.parse.kernel_details import TYPE

    rows = database.rows.get(FIA_KERNEL_TYPE)
    if not rows:
        return
    by_signature: dict[tuple[str, str], dict[str, str]] = {}
    for table in tables:
        if TYPE not in table.frame.columns:
            continue
        fia = table.frame.filter(pl.col(TYPE).cast(pl.String).str.strip_chars() == FIA_KERNEL_TYPE)
        if fia.is_empty():
            continue
        bundle = inputs.bundles.get(table.path)
        source = (bundle.root if bundle else table.path.parent).name
        operator_shapes = [s for p in (bundle.operator_details if bundle else []) for s in _operator_fia_shapes(p)]
        if operator_shapes and len(operator_shapes) != fia.height:
            log.warning("%s: %d FIA kernel rows but %d FIA operator_details rows: pairing the first %d in order",
                        table.path, fia.height, len(operator_shapes), min(fia.height, len(operator_shapes)))
        for trace_view in (bundle.trace_views if bundle else []):
            log.debug("%s: found (timeline only; carries no FIA runtime values)", trace_view)
        kernel_shapes = fia.get_column(INPUT_SHAPES).cast(pl.String).to_list()
        output_shapes = fia.get_column(OUTPUT_SHAPES).cast(pl.String).to_list()
        for index, (in_shapes, out_shapes) in enumerate(zip(kernel_shapes, output_shapes)):
            key = (strip_profiler_quotes(in_shapes), strip_profiler_quotes(out_shapes))
            if key not in by_signature:
                shapes = operator_shapes[index] if index < len(operator_shapes) and operator_shapes[index] \
                    else key[0]
                by_signature[key] = profile_metadata(shapes, source)
    for row in rows:
        row.update(by_signature.get((row[INPUT_SHAPES], row[OUTPUT_SHAPES]), profile_metadata(row[INPUT_SHAPES], "")))
    add_columns(database, FIA_KERNEL_TYPE, RUNTIME_COLUMNS)


# --- backfill from a JSONL runtime log -------------------------------------------------------------------


def _shape_text(value, *, path=None, line=None, field=None) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return ",".join(d.strip() for d in value.split(","))
    try:
        return ",".join(str(int(d)) for d in value)
    except (TypeError, ValueError):
        raise OpperfError(f"must be a shape string or a list of integers, got {value!r}", path=path, row=line,
                          field=field) from None


def _canonical_shapes(text: str) -> str:
    return ";".join(_shape_text(slot) if slot.strip() else "" for slot in strip_profiler_quotes(text).split(";"))


def runtime_key(record: dict, *, path=None, line=None) -> tuple:
    """A JSONL record's signature: its full `input_shapes` (a shape string or a list of per-slot dim lists /
    nulls), or, in the peer's record form, (query, key, value, atten_mask, block_table shapes, number of
    sequences)."""
    if "input_shapes" in record:
        shapes = record["input_shapes"]
        if isinstance(shapes, list):
            shapes = ";".join(_shape_text(s, path=path, line=line, field="input_shapes") for s in shapes)
        if not isinstance(shapes, str):
            raise OpperfError("input_shapes must be a string or a list", path=path, row=line, field="input_shapes")
        return ("input_shapes", _canonical_shapes(shapes))
    seq_kv = _int_list(record.get("actual_seq_lengths_kv"), path=path, line=line, field="actual_seq_lengths_kv")
    slot_shapes = (_shape_text(record.get(key), path=path, line=line, field=key)
                   for key in ("query_shape", "key_shape", "value_shape", "atten_mask_shape", "block_table_shape"))
    return ("slots", *slot_shapes, len(seq_kv) if seq_kv is not None else None)


def row_keys(input_shapes: str) -> list[tuple]:
    """The signatures a database row can be matched by (both record forms)."""
    text = _canonical_shapes(input_shapes)
    slots = text.split(";")
    seq_kv_shape = slots[SLOT_SEQ_LENGTHS_KV] if SLOT_SEQ_LENGTHS_KV < len(slots) else ""
    count = int(seq_kv_shape.split(",")[0]) if seq_kv_shape and seq_kv_shape.split(",")[0].isdigit() else None
    pick = [slots[i] if i < len(slots) else "" for i in (SLOT_QUERY, SLOT_KEY, SLOT_VALUE, SLOT_ATTEN_MASK,
                                                          SLOT_BLOCK_TABLE)]
    return [("input_shapes", text), ("slots", *pick, count)]


def _int_list(value, *, path, line, field) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise OpperfError("must be a list of integers", path=path, row=line, field=field)
    return value


def runtime_payload(record: dict, *, path=None, line=None) -> dict[str, str]:
    seq = _int_list(record.get("actual_seq_lengths"), path=path, line=line, field="actual_seq_lengths")
    seq_kv = _int_list(record.get("actual_seq_lengths_kv"), path=path, line=line, field="actual_seq_lengths_kv")
    valid_blocks = _int_list(record.get("block_table_valid_blocks"), path=path, line=line,
                             field="block_table_valid_blocks")
    payload = {
        RUNTIME_SEQ_LENGTHS_SHAPE: str(len(seq)) if seq else "",
        RUNTIME_SEQ_LENGTHS_VALUES: ",".join(map(str, seq or [])),
        RUNTIME_SEQ_LENGTHS_KV_SHAPE: str(len(seq_kv)) if seq_kv else "",
        RUNTIME_SEQ_LENGTHS_KV_VALUES: ",".join(map(str, seq_kv or [])),
        RUNTIME_AVG_SEQ_LEN: f"{statistics.mean(seq_kv):.6f}" if seq_kv else "",
        RUNTIME_BLOCK_TABLE_VALID_BLOCKS: ",".join(map(str, valid_blocks or [])),
    }
    payload.update({column: str(record[key]) for key, column in _PLAIN_FIELDS.items() if record.get(key) is not None})
    return payload


def load_runtime_log(path: str | Path) -> dict[tuple, Counter]:
    """JSONL → signature → Counter of distinct payloads (as sorted item tuples)."""
    path = Path(path)
    if not path.is_file():
        raise OpperfError("JSONL runtime log not found", path=path)
    index: dict[tuple, Counter] = {}
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise OpperfError(f"not a JSON object: {exc.msg}", path=path, row=line_number) from exc
            if not isinstance(record, dict):
                raise OpperfError("each line must be a JSON object (one FIA call)", path=path, row=line_number)
            key = runtime_key(record, path=path, line=line_number)
            payload = runtime_payload(record, path=path, line=line_number)
            index.setdefault(key, Counter())[tuple(sorted(payload.items()))] += 1
    return index


@dataclass
class BackfillResult:
    rows: int
    matched: int
    unmatched: int
    output_path: Path


def fill_fia_runtime_metadata(csv_path: str | Path, jsonl_path: str | Path, output_path: str | Path | None = None,
                              metadata_tag: str = COMPLETENESS_RUNTIME) -> BackfillResult:
    """Backfill the Runtime columns of a FusedInferAttentionScore.csv from a JSONL runtime log.

    A row takes the most frequent payload among the calls with its signature (the first seen on a tie);
    `Runtime payload_count` says how many distinct payloads there were. Unmatched rows keep their Runtime
    columns as they were and are counted. The output is written atomically (default: over `csv_path`).
    """
    csv_path, output_path = Path(csv_path), Path(output_path or csv_path)
    if not csv_path.is_file():
        raise OpperfError("CSV not found", path=csv_path)
    with open(csv_path, newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        if not reader.fieldnames:
            raise OpperfError("file is empty (no header row)", path=csv_path, row=1)
        if INPUT_SHAPES not in reader.fieldnames:
            raise OpperfError("missing required column", path=csv_path, row=1, field=INPUT_SHAPES)
        fieldnames = list(reader.fieldnames)
        rows = list(reader)
    for line, row in enumerate(rows, start=2):
        if None in row or any(v is None for v in row.values()):
            raise OpperfError("row does not have as many fields as the header", path=csv_path, row=line)
        if strip_profiler_quotes(row[INPUT_SHAPES]).upper() != "N/A":
            parse_shapes(row[INPUT_SHAPES], path=csv_path, row=line, field=INPUT_SHAPES)
    index = load_runtime_log(jsonl_path)
    matched = 0
    for row in rows:
        payloads = next((index[k] for k in row_keys(row[INPUT_SHAPES]) if k in index), None)
        if payloads is None:
            for column in RUNTIME_COLUMNS:
                row.setdefault(column, "")
            continue
        matched += 1
        best = max(payloads.items(), key=lambda item: item[1])[0]   # max keeps the first on a tie
        row.update(dict(best))
        row[RUNTIME_METADATA_COMPLETENESS] = metadata_tag
        row[RUNTIME_PAYLOAD_COUNT] = str(len(payloads))
    columns = order_columns([*fieldnames, *RUNTIME_COLUMNS])
    with atomic_output(output_path) as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows({c: row.get(c, "") for c in columns} for row in rows)
    log.info("backfilled %d of %d rows from %s into %s (%d rows unmatched, runtime columns left as they were)",
             matched, len(rows), jsonl_path, output_path, len(rows) - matched)
    return BackfillResult(rows=len(rows), matched=matched, unmatched=len(rows) - matched, output_path=output_path)
