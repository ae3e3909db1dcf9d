"""Write the final database files from the last stage's rows, checking the contract on the way.

The database CSV is what the peer runtime reads, so this is the last gate: every contract column
present and in order, every shape/dtype field parseable, no row dropped, written atomically.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

from opperf import __version__
from opperf import contract
from opperf.consumer.msmodeling_device import PROFILE_FILE as MSMODELING_DEVICE_FILE
from opperf.consumer.runtime import layouts_path
from opperf.devices import load_catalog
from opperf.errors import OpperfError
from opperf.io import atomic_output, read_database_csv, write_csv_atomic
from opperf.log import get_logger, span
from opperf.versions import hccl_version_dir, parse_version_dir

log = get_logger("database")

DEFINITION_FAMILY = {"npu": "npu", "cuda": "torch", "cpu": "torch"}


def validate_rows(frame: pd.DataFrame, path: Path) -> None:
    """Every shape field parses and dtype/format slots align with shape slots: errors name row and field."""
    for index, row in enumerate(frame.itertuples(index=False), start=2):
        record = dict(zip(frame.columns, row))
        for shapes_col, names_cols in ((contract.INPUT_SHAPES, (contract.INPUT_DTYPES, contract.INPUT_FORMATS)),
                                       (contract.OUTPUT_SHAPES, (contract.OUTPUT_DTYPES, contract.OUTPUT_FORMATS))):
            shapes = contract.parse_shapes(record[shapes_col], path=path, row=index, field=shapes_col)
            for names_col in names_cols:
                names = contract.parse_names(record[names_col])
                # Profilers sometimes list dtypes for trailing slots they left out of the shape field
                # (the real FlashAttentionScoreGrad rows do): only fewer names than slots is an error.
                if names and names != ["N/A"] and len(names) < len(shapes):
                    raise OpperfError(f"{len(names)} slot(s) but {shapes_col} has {len(shapes)}",
                                      path=path, row=index, field=names_col)


def finalise_kernel_csv(rows_path: str | Path, kernel_type: str, output: str | Path, backend: str = "npu",
                        definition_path: str | Path | None = None, layouts: str | Path | None = None,
                        phase_table: str | Path | None = None) -> int:
    """Check and write `{KernelType}.csv` (what the runtime reads) and its layouts file (every row).

    Returns the row count of the layouts file, which is every input row: none is ever dropped. The
    runtime's CSV holds one row per runtime key (`opperf.consumer.runtime.runtime_view`); the definition,
    where there is one, says which slots are `out=` arguments and whether the runtime queries the type
    by its output alone (`query_mode: elementwise`) or by its mean context too (`attention_special`). A phase
    stage's table (`phase_table`, opperf.replay.phase) is folded into the rows first.
    """
    from opperf.consumer.runtime import runtime_view

    rows_path, output = Path(rows_path), Path(output)
    layouts = Path(layouts) if layouts else layouts_path(output)
    contract.check_kernel_type(kernel_type, path=rows_path, field="kernel type")
    with span("database.kernel", log, kernel=kernel_type) as result:
        frame = read_database_csv(rows_path, required=contract.BASE_COLUMNS)
        validate_rows(frame, rows_path)
        if phase_table:
            from opperf.replay.phase_table import apply_phase_table, read_phase_table

            frame, result["phase_rows"] = apply_phase_table(frame, kernel_type, read_phase_table(phase_table))
        if contract.SOURCE not in frame.columns:
            frame[contract.SOURCE] = contract.SOURCE_PROFILED
        else:
            frame.loc[frame[contract.SOURCE] == "", contract.SOURCE] = contract.SOURCE_PROFILED
        frame = frame[contract.order_columns(frame.columns)]
        out_slots, query_mode = _runtime_traits(definition_path)
        view, every_row = runtime_view(frame, backend, out_slots=out_slots, elementwise=query_mode == "elementwise",
                                       attention=query_mode == "attention_special")
        write_csv_atomic(output, view)
        write_csv_atomic(layouts, every_row)
        result["rows"] = len(every_row)
        result["runtime_rows"] = len(view)
    if len(view) < len(every_row):
        shown = layouts.relative_to(output.parent) if layouts.is_relative_to(output.parent) else layouts
        log.info("%s: %d rows, %d runtime keys (rows sharing a key: the dominant layout is in %s, all in %s)",
                 kernel_type, len(every_row), len(view), output.name, shown)
    return len(every_row)


def _runtime_traits(definition_path: str | Path | None) -> tuple[dict[int, tuple[int, ...]], str | None]:
    """(input slots that are `out=` arguments by a row's slot count, the runtime's query mode) from a kernel
    definition file."""
    if not definition_path:
        return {}, None
    from opperf.replay.definitions import load_definition

    definition = load_definition(definition_path)
    out_slots = {count: definition.out_slots(count) for layout in definition.layouts for count in layout.slot_counts}
    return out_slots, definition.op_mapping.get("query_mode")


def _load_definitions(definitions_dir: Path, backend: str) -> dict:
    """The kernel definitions of a back end (replay stage's loader); empty if none are installed."""
    from opperf.replay.definitions import load_definitions

    family = DEFINITION_FAMILY[backend]
    # The workflow passes the family directory itself (config/kernels/npu); by hand, the root (config/kernels).
    family_dir = definitions_dir if definitions_dir.name == family else definitions_dir / family
    return load_definitions(family_dir, backend=backend) if family_dir.is_dir() else {}


def _mappings_for(definitions: dict, present: set[str]) -> tuple[dict[str, dict], dict[str, str]]:
    """(operator_mappings, framework ops left out and why) for the kernel types this database has.

    operator_mappings: framework op -> the runtime's lookup fields. One definition serves several reported
    Types (MatMulV2 replays MatMulV3 and MatMulCommon too); a database that only saw MatMulV3 maps
    `aten.mm.default` to MatMulV3. The first definition (by Type) naming a framework op wins; the replay
    API is recorded under `opperf.kernel_types`, not here. An op the runtime can never receive
    (`runtime_receives`) is left out, with the reason.
    """
    from opperf.consumer.runtime import runtime_receives
    from opperf.replay.definitions import framework_op_mappings

    mappings: dict[str, dict] = {}
    left_out: dict[str, str] = {}
    for entry in framework_op_mappings(definitions.values()):
        types = [t for t in (entry["kernel_type"], *entry["alternate_kernel_types"]) if t in present]
        if not types or entry["framework_op"] in mappings:
            continue
        received, why = runtime_receives(entry["framework_op"])
        if not received:
            left_out[entry["framework_op"]] = why
            continue
        runtime = {"kernel_type": types[0], "alternate_kernel_types": types[1:], "category": entry["category"]}
        runtime.update({k: entry[k] for k in RUNTIME_MAPPING_EXTRAS if k in entry})
        mappings[entry["framework_op"]] = runtime
    return mappings, left_out


def _policies_for(definitions: dict, present: set[str]) -> dict[str, dict]:
    """op_mapping.yaml's `{name}_policy: {kernel_overrides: {Type: fields}}` from the definitions' runtime_policies."""
    policies: dict[str, dict] = {}
    for definition in sorted(definitions.values(), key=lambda d: d.type):
        for name, fields in definition.runtime_policies.items():
            for kernel_type in definition.kernel_types:
                if kernel_type in present:
                    overrides = policies.setdefault(f"{name}_policy", {"kernel_overrides": {}})["kernel_overrides"]
                    overrides.setdefault(kernel_type, dict(fields))
    return policies


def _schema_query_mode(framework_op: str) -> dict:
    """A mapping's query mode where no definition gives one: `elementwise` for an op torch tags pointwise."""
    from opperf.consumer.runtime import is_pointwise

    return {"query_mode": "elementwise"} if is_pointwise(framework_op) else {}


# Per-mapping keys the runtime reads beyond kernel_type / alternate_kernel_types / category.
RUNTIME_MAPPING_EXTRAS = ("query_mode", "tc_input_count")
# Databases msmodeling's CLI can run on a device it does not ship: cpu and cuda ones get its DeviceProfile file.
MSMODELING_BACKENDS = ("cpu", "cuda")
COMM_DIRECTORY = {"npu": "hccl"}


def build_op_mapping(kernel_csvs: list[str | Path], device: str, devices_path: str | Path,
                     definitions_dir: str | Path, output: str | Path, collected_at: str | None = None,
                     not_replayed_path: str | Path | None = None, database_dir: str | Path | None = None,
                     consumer_record: dict | None = None) -> dict:
    """op_mapping.yaml in the peer runtime's contract, generated from the kernel definitions.

    Top-level keys the runtime reads or audits (`version`, `device`, `cann_version`, `pytorch_version`,
    `collection_date`, `communication_data_ref`, `operator_mappings` keyed by framework op) come first;
    everything of opperf's own (device alias, stack versions, per-type replay API, kernel types that are
    not replayed and why) lives under the one key `opperf`, which the runtime ignores.
    `kernel_csvs` are the database's kernel CSVs (all in one data/{device}/{stack}/{version_dir}/).
    `database_dir` is where the database will live when it is built elsewhere first (a staging directory);
    its stack and version_dir are recorded (default: `output`'s directory). `consumer_record`: the grid's record of
    who recorded the consumer's queries (contract.CONSUMER_QUERIES_RECORD), kept as `opperf.consumer_queries`.
    """
    from opperf.consumer.dtype import count_activation_dtypes, op_mapping_fields
    from opperf.coverage import load_not_replayed

    kernel_files = sorted(Path(p) for p in kernel_csvs)
    database_path = Path(database_dir) if database_dir is not None else Path(output).parent
    definitions_dir = Path(definitions_dir)
    catalog = load_catalog(devices_path)
    if device not in catalog:
        raise OpperfError(f"unknown device {device!r}", path=devices_path)
    entry = catalog[device]
    stack_versions = parse_version_dir(database_path.name)
    definitions = _load_definitions(definitions_dir, entry.backend)
    not_replayed = load_not_replayed(not_replayed_path).get(entry.backend, {})
    kernel_types = {}
    every_row_tables: dict[str, pd.DataFrame] = {}     # kernel type -> every row (the database's dtype)
    queried: dict[str, tuple] = {}    # kernel type -> (the framework ops its consumer-query rows answer, query mode)
    silent: set[str] = set()          # kernel types every replayed call of which ran no device work
    from opperf.replay.definitions import definition_for
    from opperf.replay.engine import STATUS_FAILED_NO_SAMPLES

    for csv_path in kernel_files:
        kernel = csv_path.stem
        definition = definition_for(definitions, kernel, entry.backend)
        frame = read_database_csv(csv_path)
        rows = len(frame)
        # The ops the consumer's queries issue, from every row (the layouts file): a query the runtime's CSV
        # answers with another row of its key (arange.default by the profiled arange.start_out) is mapped too.
        layouts = layouts_path(csv_path)
        every_row = read_database_csv(layouts) if layouts.is_file() else frame
        every_row_tables[kernel] = every_row
        # On cuda CUPTI attributes every kernel a call launches; on npu no samples can mean msprof did not match
        # the call's signature, so only cuda reads "nothing measured" as "nothing ran".
        if entry.backend == "cuda" and len(every_row) and contract.REPLAY_STATUS in every_row.columns and (
                every_row[contract.REPLAY_STATUS] == STATUS_FAILED_NO_SAMPLES).all():
            silent.add(kernel)
        if contract.CONSUMER_QUERY in every_row.columns:
            extras = {k: v for k, v in (definition.op_mapping if definition else {}).items()
                      if k in RUNTIME_MAPPING_EXTRAS}
            queried[kernel] = (sorted({op for op in every_row[contract.CONSUMER_QUERY] if op}), extras)
        kernel_types[kernel] = {
            "csv": csv_path.name,
            "rows": rows,
            "replay_api": (definition.api or f"{definition.hook}.build_case") if definition else None,
            "category": definition.category if definition else None,
            "definition": definition.source if definition else None,
        }
        if definition is not None and definition.memcpy_when_dense:
            kernel_types[kernel]["memcpy_when_dense"] = True
        if definition is None and kernel in not_replayed:
            kernel_types[kernel]["not_replayed"] = not_replayed[kernel].reason
            kernel_types[kernel]["not_replayed_because"] = not_replayed[kernel].detail
    mappings, left_out = _mappings_for(definitions, set(kernel_types))
    if entry.backend in ("cpu", "cuda"):
        from opperf.consumer.runtime import schema_framework_ops

        # Types replayed from their op's schema (no definition): the op's functional overloads map to them. A
        # type named after the op holds calls of that op in its own argument layout (a profiled call, or the
        # consumer's query, opperf.grid.queries): it answers first, another op's kernel type second.
        for kernel, fields in kernel_types.items():
            for framework_op in schema_framework_ops(kernel):
                existing = mappings.get(framework_op)
                if existing is None:
                    if fields["definition"] is None:
                        mappings[framework_op] = {"kernel_type": kernel, "alternate_kernel_types": [],
                                                  **_schema_query_mode(framework_op)}
                elif existing["kernel_type"] != kernel:
                    alternates = [existing["kernel_type"], *existing.get("alternate_kernel_types", [])]
                    # tc_input_count / query_mode described the other type's layout, not this one's.
                    mappings[framework_op] = {
                        "kernel_type": kernel, "alternate_kernel_types": [k for k in alternates if k != kernel],
                        **({"category": existing["category"]} if "category" in existing else {})}
    # A row made from a performance model's query (grid.queries) answers that query's op, also where the type's
    # definition maps only the op a profile records (`arange`: the profile's start_out, the model's default).
    for kernel, (framework_ops, extras) in queried.items():
        for framework_op in framework_ops:
            if framework_op not in mappings:
                category = kernel_types[kernel]["category"]
                mappings[framework_op] = {"kernel_type": kernel, "alternate_kernel_types": [],
                                          **({"category": category} if category else {}),
                                          **(extras or _schema_query_mode(framework_op))}
    # An op whose every replayed call ran no device work (an allocation: empty_like on cuda) costs nothing, as a
    # view: left mapped to its rows, which have no duration, the runtime would price it at its roofline.
    for framework_op, mapping in list(mappings.items()):
        types = [mapping.get("kernel_type"), *(mapping.get("alternate_kernel_types") or [])]
        if mapping.get("kernel_type") and all(k in silent for k in types if k):
            mappings[framework_op] = {"zero_cost": True, "notes": f"no device work: every replayed call of "
                                                                  f"{mapping['kernel_type']} measured 0 us"}
    from opperf.consumer.runtime import view_framework_ops

    for framework_op in view_framework_ops():
        mappings.setdefault(framework_op, {"zero_cost": True,
                                           "notes": "a view (its schema's return aliases an input): no kernel runs"})
    versions = {"torch": stack_versions.torch}
    if stack_versions.vllm:
        versions["vllm"] = stack_versions.vllm
    if stack_versions.runtime != "cpu":
        versions[stack_versions.runtime] = stack_versions.runtime_version
    collection_date = collected_at or dt.date.today().isoformat()
    document: dict = {"version": database_path.name, "device": entry.full_name}
    if stack_versions.runtime == "cann":
        document["cann_version"] = stack_versions.runtime_version
    document["pytorch_version"] = stack_versions.torch
    document["collection_date"] = collection_date
    if entry.backend in COMM_DIRECTORY and stack_versions.runtime == "cann":
        # The runtime's data tree: collectives of a CANN stack live in data/{device}/hccl/v{cann_version}/.
        document["communication_data_ref"] = (f"../../{COMM_DIRECTORY[entry.backend]}/"
                                              f"{hccl_version_dir(stack_versions.runtime_version)}")
    document.update(_policies_for(definitions, set(kernel_types)))
    document["operator_mappings"] = mappings
    document["opperf"] = {
        "device": device,
        "backend": entry.backend,
        "stack": database_path.parent.name,
        "version_dir": database_path.name,
        "versions": versions,
        # The activation dtype of the GEMM rows (opperf.consumer.dtype): what scripts/predict.py records queries in.
        **op_mapping_fields(count_activation_dtypes(every_row_tables, {k: v["category"]
                                                                       for k, v in kernel_types.items()})),
        "generated_by": f"opperf {__version__}",
        "kernel_types": kernel_types,
        "framework_ops_left_out": left_out,
    }
    if consumer_record:
        # Which program recorded the queries its rows answer (msmodeling's runner, with its commit, or opperf's).
        document["opperf"]["consumer_queries"] = consumer_record
    with atomic_output(output) as handle:
        handle.write("# Generated by opperf from config/kernels/ definitions; do not edit by hand.\n"
                     "# Keys outside `opperf:` follow the peer runtime's op_mapping contract (docs/database.md).\n")
        yaml.safe_dump(document, handle, sort_keys=False, allow_unicode=False)
    log.info("op_mapping: %d kernel types, %d framework-op mappings", len(kernel_types), len(mappings))
    return document


@dataclass(frozen=True)
class Replacement:
    """What building a database over an existing one changed: its kernel types whose CSV and layouts file were
    rewritten, added, and removed (the new build lacks them), and any other files the old directory held."""

    database: Path
    rewritten: list[str]
    added: list[str]
    removed: list[str]
    other_files: list[str]

    def summary(self) -> str:
        lines = [f"replaced the database in {self.database}: {len(self.rewritten)} kernel types rewritten, "
                 f"{len(self.added)} added, {len(self.removed)} removed"]
        for what, names in (("rewritten", self.rewritten), ("added", self.added),
                            ("removed (CSV and layouts file)", self.removed), ("other files removed", self.other_files)):
            if names:
                lines.append(f"  {what}: {', '.join(names)}")
        return "\n".join(lines)


@dataclass(frozen=True)
class BuiltDatabase:
    files: list[Path]                   # every file written, under the database directory
    replaced: Replacement | None        # None: the directory was new (or empty)


def _database_entries(directory: Path) -> tuple[list[str], list[str]]:
    """(kernel types, other files) an existing database directory holds: its {KernelType}.csv files, and every
    file that is none of those, their layouts/{KernelType}.csv or op_mapping.yaml (paths relative to it)."""
    kernel_types = sorted(p.stem for p in directory.glob("*.csv") if p.is_file())
    database_files = {f"{k}.csv" for k in kernel_types} | {f"layouts/{k}.csv" for k in kernel_types}
    database_files |= {"op_mapping.yaml", MSMODELING_DEVICE_FILE}
    others = sorted(str(p.relative_to(directory)) for p in directory.rglob("*")
                    if not p.is_dir() and str(p.relative_to(directory)) not in database_files)
    return kernel_types, others


def build_database_directory(rows_dir: str | Path, device: str, output_dir: str | Path,
                             devices_path: str | Path = "config/devices.yaml",
                             definitions_dir: str | Path = "config/kernels", *,
                             overwrite: bool = False) -> BuiltDatabase:
    """A whole database from a directory of last-stage rows (one `{KernelType}.csv` each), as the workflow
    builds it: every kernel CSV and layouts file, then op_mapping.yaml (with the rows directory's
    consumer_queries.json, the grid's record of who recorded its queries, where it has one) and, for a cpu or cuda
    device, msmodeling_device.py. For replays run by hand or by a benchmark outside Snakemake.

    The database is built in a temporary sibling of `output_dir` and renamed into place, so a reader sees the
    old database or the new one, never a mix. An `output_dir` that holds files already is another database:
    refused unless `overwrite`, and then replaced whole: kernel types the new build lacks are gone with it
    (left behind, a stale CSV would be counted by the check and answer the runtime's queries).
    """
    from opperf.consumer.recorder import read_consumer_record
    from opperf.io import staged_directory
    from opperf.replay.definitions import definition_for

    rows_dir, output_dir = Path(rows_dir), Path(output_dir)
    try:
        parse_version_dir(output_dir.name)
    except OpperfError as exc:
        raise OpperfError(f"{exc.reason}: the database directory's name is the version directory op_mapping.yaml "
                          "records (data/{device}/{stack}/{version_dir})", path=output_dir, field="--output") from None
    old_types, old_others = _database_entries(output_dir) if output_dir.is_dir() else ([], [])
    if (old_types or old_others) and not overwrite:
        held = (f"a database of {len(old_types)} kernel type{'s' * (len(old_types) != 1)}" if old_types
                else f"{len(old_others)} file{'s' * (len(old_others) != 1)}")
        raise OpperfError(f"already holds {held}; give --overwrite to replace it (kernel types the new build lacks "
                          "are removed), or another --output", path=output_dir, field="--overwrite")
    catalog = load_catalog(devices_path)
    if device not in catalog:
        raise OpperfError(f"unknown device {device!r} (known: {', '.join(sorted(catalog))})", path=devices_path)
    backend = catalog[device].backend
    definitions = _load_definitions(Path(definitions_dir), backend)
    rows_files = sorted(p for p in rows_dir.glob("*.csv"))
    if not rows_files:
        raise OpperfError("no {KernelType}.csv in this directory", path=rows_dir)
    record_path = rows_dir / contract.CONSUMER_QUERIES_RECORD
    record = read_consumer_record(record_path) if record_path.is_file() else None
    with staged_directory(output_dir, replace_whole=True) as staging:
        for rows in rows_files:
            definition = definition_for(definitions, rows.stem, backend)
            finalise_kernel_csv(rows, rows.stem, staging / rows.name, backend=backend,
                                definition_path=definition.path if definition else None)
        build_op_mapping([staging / r.name for r in rows_files], device, devices_path, definitions_dir,
                         staging / "op_mapping.yaml", database_dir=output_dir, consumer_record=record)
        extra = [write_msmodeling_device(device, devices_path, staging)] if backend in MSMODELING_BACKENDS else []
    new_types = [r.stem for r in rows_files]
    written = [path for kernel in new_types for path in (output_dir / f"{kernel}.csv",
                                                         layouts_path(output_dir / f"{kernel}.csv"))]
    replaced = None
    if old_types or old_others:
        replaced = Replacement(output_dir, rewritten=sorted(set(old_types) & set(new_types)),
                               added=sorted(set(new_types) - set(old_types)),
                               removed=sorted(set(old_types) - set(new_types)), other_files=old_others)
    return BuiltDatabase(files=[*written, output_dir / "op_mapping.yaml", *(output_dir / p.name for p in extra)],
                         replaced=replaced)


def write_msmodeling_device(device: str, devices_path: str | Path, directory: str | Path) -> Path:
    """The database directory's msmodeling_device.py: a DeviceProfile of `device` (config/devices.yaml) that
    msmodeling's CLI loads through opperf's launcher (docs/msmodeling.md); returns its path."""
    from opperf.consumer.msmodeling_device import write_device_profile

    catalog = load_catalog(devices_path)
    if device not in catalog:
        raise OpperfError(f"unknown device {device!r} (known: {', '.join(sorted(catalog))})", path=devices_path)
    return write_device_profile(catalog[device], directory)


def write_manifest(files: list[str | Path], output: str | Path) -> None:
    """A TSV of every file of a database with its row count: the marker that the database is complete."""
    lines = ["file\trows"]
    for name in files:
        path = Path(name)
        rows = len(read_database_csv(path)) if path.suffix == ".csv" else ""
        lines.append(f"{path}\t{rows}")
    with atomic_output(output) as handle:
        handle.write("\n".join(lines) + "\n")
