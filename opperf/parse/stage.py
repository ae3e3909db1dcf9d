"""The parse stage: raw profiles of one database → one CSV per kernel type + the kernel_types.txt manifest."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from opperf.contract import WORKLOAD_MANIFEST
from opperf.errors import OpperfError
from opperf.log import get_logger, span
from opperf.parse.aggregate import EXAMPLES_PER_REASON, ParsedDatabase, aggregate
from opperf.parse.attribution import DEVICE_TIME, KERNEL_TIME, Attribution
from opperf.parse.discover import discover_inputs
from opperf.parse.fia_metadata import add_fia_profile_metadata
from opperf.parse.kernel_details import TRACE_EVENT, ProfileTable, read_profile_table
from opperf.parse.output import write_parse_traces, write_parsed_directory

log = get_logger("parse")


def _read_tables(profiling_paths: list[str | Path]):
    """Discover and read every input into row form; any bad file raises before anything is written."""
    inputs = discover_inputs(profiling_paths)
    tables: list[ProfileTable] = []
    for path in inputs.tables:
        with span("parse.read", log, file=path) as fields:
            table = read_profile_table(path)
            if table.frame.is_empty():
                raise OpperfError("file has a header but no data rows", path=path, row=2)
            fields["rows"] = table.frame.height
            if table.ignored_columns:
                log.info("%s: text columns %s are not counters, not averaged", path, table.ignored_columns)
        tables.append(table)
    if inputs.torch_traces:
        from opperf.parse.torch_trace import read_torch_trace   # imports torch: only when there is a trace

        for path in inputs.torch_traces:
            with span("parse.read_trace", log, file=path) as fields:
                table = read_torch_trace(path)
                fields["rows"] = table.frame.height
            tables.append(table)
    return inputs, tables


def parse_profiles(profiling_paths: list[str | Path], database_path: str | Path, trace_dir: str | Path | None = None,
                   task_id: str | None = None) -> ParsedDatabase:
    """Parse every given profile, then write `database_path` (all input validated before anything is written)."""
    with span("parse", log, database=database_path) as fields:
        inputs, tables = _read_tables(profiling_paths)
        with span("parse.aggregate", log):
            database = aggregate(tables)
        add_fia_profile_metadata(database, inputs, tables)
        _log_skips(database)
        if not database.rows:
            log.warning("no row could be used: writing an empty manifest")
        database.attribution = _attribution(tables, database)
        # trace_attribution.json keeps the traces' accounts; a kernel table's is printed and logged only, so an
        # Ascend database directory stays the CSVs and the manifest the runtime reads.
        attribution = {path: account for path, account in database.attribution.items()
                       if account["measure"] == DEVICE_TIME}
        if trace_dir:
            write_parse_traces(trace_dir, database, task_id)
        write_parsed_directory(database_path, database, attribution,       # last: the output, once all else is written
                               profile_overheads(tables))
        fields.update(rows=database.rows_read, kernel_types=len(database.rows),
                      groups=sum(len(r) for r in database.rows.values()),
                      skipped=sum(database.skip_counts.values()))
    return database


def profile_overheads(tables: list[ProfileTable]) -> dict[str, dict]:
    """Per profile with a workload.json beside it that measured one (opperf.workload.profile.profile_overhead): how
    much longer a pass ran under the profiler than without it, and whether that is beyond the noise; the report says
    so when the profiled times are inflated."""
    found = {}
    for table in tables:
        manifest = Path(table.path).parent / WORKLOAD_MANIFEST
        if not manifest.is_file():
            continue
        try:
            workload = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        record = workload.get("profile_overhead") if isinstance(workload, dict) else None
        if isinstance(record, dict):
            found[str(table.path)] = {**record, "backend": workload.get("backend", "")}
    return found


def _attribution(tables: list[ProfileTable], database: ParsedDatabase) -> dict[str, dict]:
    """Per profile, the share of its time that is in the written rows and what the rest was (opperf.parse.attribution):
    a trace's account from its conversion, a kernel table's from its durations, each less the rows the aggregator
    then skipped; logged at WARNING where much is in no row. CPU traces (wall times, no device time) have none."""
    accounts = {}
    for table in tables:
        path = str(table.path)
        account = table.attribution
        if account is None:
            if table.row_unit == TRACE_EVENT:
                continue
            total_us = database.profile_us.get(path, 0.0)
            account = Attribution(device_us=total_us, rows_us=total_us, measure=KERNEL_TIME)
        for reason, (duration_us, rows) in sorted(database.skipped_us.get(path, {}).items()):
            account.skipped(reason, duration_us, rows)
        if not account.device_us:
            continue
        level = logging.WARNING if account.large else logging.INFO
        for line in account.lines():
            log.log(level, "%s: attribution: %s", path, line)
        accounts[path] = account.to_json()
    return accounts


def _log_skips(database: ParsedDatabase) -> None:
    """Per reason how many rows were skipped, then the first rows of each with file, line and field."""
    for reason, count in sorted(database.skip_counts.items(), key=lambda item: -item[1]):
        log.info("skipped %d rows: %s", count, reason)
    for example in database.skipped_examples:
        log.info("skipped %s", example.describe())
    if any(count > EXAMPLES_PER_REASON for count in database.skip_counts.values()):
        log.info("(at most %d rows per reason shown; the PARSE error_log traces list every skipped row of "
                 "each kernel type)", EXAMPLES_PER_REASON)


def database_path_for(device: str, vllm_version: str | None, torch_version: str | None, cann_version: str | None,
                      data_root: str | Path = "data", catalog: dict | None = None) -> Path:
    """The seed's derived output: `{data_root}/{device key}/vllm_ascend/vllm{v}_torch{t}_cann{c}`."""
    from opperf.devices import resolve_device
    from opperf.versions import npu_version_dir

    version_dir = npu_version_dir(vllm_version or "", torch_version or "", cann_version or "")
    return Path(data_root) / resolve_device(device, catalog).name / "vllm_ascend" / version_dir
