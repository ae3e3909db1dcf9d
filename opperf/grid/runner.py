"""The grid stage: per kernel type, parsed rows + generated theory rows, written as one CSV each.

For every type in the manifest (`kernel_types.txt`): route it to its patterns, enumerate candidates,
lay each onto the templates (profiled rows' stable metadata), drop signatures already present, drop rows
over the HBM budget, cap at `rows` by dropping whole buckets (least-used first, see buckets.py; the log
names what the cap cost), and write parsed rows (unchanged) followed by the generated ones. Types without
a pattern are copied through and listed in the log. Nothing is written until every type has been
computed, so bad input leaves no partial output.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from opperf.contract import (CONSUMER_QUERY, KERNEL_TYPES_MANIFEST, INPUT_DTYPES, INPUT_STRIDES, INPUT_FORMATS, INPUT_SHAPES, OUTPUT_DTYPES, OUTPUT_FORMATS,
                             OUTPUT_SHAPES, SOURCE, SOURCE_GENERATED, check_kernel_type, format_shapes,
                             order_columns, parse_names, row_signature)
from opperf.contract import CONSUMER_QUERIES_RECORD
from opperf.errors import OpperfError
from opperf.grid.buckets import (DUPLICATE, EXCUSED, NEW, AxisPointSet, Bucket, BucketKey, PointSetRecorder,
                                 choose_buckets)
from opperf.grid.config import GridConfig
from opperf.grid.memory import MemoryEstimator
from opperf.grid.models import ModelConfig, select_models
from opperf.grid.patterns import CandidateStats, pattern_candidates
from opperf.grid.queries import CONSUMER_BUCKET, QueryRows
from opperf.grid.templates import Template, templates_from_rows
from opperf.grid.values import ValueGrids
from opperf.io import read_database_csv, staged_directory, write_csv_atomic, write_text_atomic
from opperf.log import Progress, get_logger, span
from opperf.trace import Trace

MANIFEST = KERNEL_TYPES_MANIFEST
SUMMARY = "grid_summary.tsv"
TRACE_STEP = 2          # S01 is the parse, S02 the grid
STATUS_GENERATED = "generated"
STATUS_NO_PATTERN = "no_pattern"
STATUS_NO_TEMPLATE = "no_fitting_profiled_row"
STATUS_NOTHING_NEW = "nothing_new"
STATUS_NO_CANDIDATES = "no_candidates"      # constraints or the token cap left no combination

log = get_logger("grid")


@dataclass
class KernelGridResult:
    """What the grid did for one kernel type (one line of grid_summary.tsv)."""

    kernel_type: str
    patterns: str = ""
    status: str = STATUS_NO_PATTERN
    existing_rows: int = 0
    unparsable_profiled_rows: int = 0      # rows whose shapes cannot serve as a template (N/A, malformed)
    templates: int = 0
    combinations: int = 0
    rejected_by_constraints: int = 0
    invalid_dimensions: int = 0
    no_fitting_template: int = 0
    duplicates: int = 0
    over_hbm_budget: int = 0
    buckets: int = 0                       # buckets with new rows (the row cap's unit)
    dropped_buckets: int = 0
    dropped_by_row_cap: int = 0
    generated: int = 0
    consumer_queries: int = 0              # of `generated`: rows of the performance model's own queries
    consumer_recorder: str = ""            # who recorded those queries: msmodeling | transformers (grid.queries)


@dataclass(frozen=True)
class GridSettings:
    """One run's knobs: what to generate for, how many rows, which seed, which memory budget."""

    grid_config: GridConfig
    grids: ValueGrids
    estimator: MemoryEstimator
    rows: int                   # cap on generated rows per CSV, whole buckets at a time; 0 = no cap
    seed: int                   # orders buckets of equal use under the cap
    settings_text: dict = field(default_factory=dict)
    target_models: tuple[str, ...] = ()
    consumer_rows: QueryRows | None = None   # rows of the performance model's own queries (grid/queries.py)
    patterns: bool = True       # False: only the queries' rows (no row that no query needs)
    consumer_record: dict | None = None   # written as consumer_queries.json (opperf.consumer.recorder)

    @property
    def configurations(self) -> int:
        """Target-model configurations (model x TP size): the use of a bucket tied to no model."""
        return sum(len(m.tp_sizes) for m in self.grids.models) or 1


@dataclass
class KernelGrid:
    """One kernel type's generated rows, what happened, its axis point sets and the buckets the cap dropped."""

    rows: list[dict]
    result: KernelGridResult
    point_sets: list[AxisPointSet]
    buckets: list[Bucket]                  # every bucket with new rows, in enumeration order
    dropped: list[Bucket]                  # those the row cap dropped


def prepare_settings(*, grid_config: GridConfig, models: dict[str, ModelConfig], target_models: Sequence[str],
                     rows: int, seed: int, max_hbm_gb: float, max_tokens: int | None = None, backend: str = "default",
                     axis_caps: dict[str, int] | None = None, tile_boundaries: bool | None = None,
                     models_path=None) -> GridSettings:
    """Resolve the target models and build the value grids and memory estimator of one run. The token cap,
    axis caps and tile boundaries not given are grid.yaml's for `backend` (cpu, cuda, npu)."""
    max_tokens = grid_config.max_tokens_for(backend) if max_tokens is None else max_tokens
    axis_caps = grid_config.axis_caps_for(backend) if axis_caps is None else axis_caps
    tile_boundaries = grid_config.tile_boundaries_for(backend) if tile_boundaries is None else tile_boundaries
    if rows < 0:
        raise OpperfError(f"--rows must be >= 0 (0 = no cap), got {rows}", field="--rows")
    if max_hbm_gb <= 0:
        raise OpperfError(f"--max-hbm-gb must be > 0, got {max_hbm_gb}", field="--max-hbm-gb")
    if max_tokens < 1:
        raise OpperfError(f"--max-tokens must be >= 1, got {max_tokens}", field="--max-tokens")
    chosen = select_models(models, list(target_models), path=models_path)
    grids = ValueGrids(grids=grid_config.grids, generic=grid_config.generic, models=chosen, max_tokens=max_tokens,
                       standard=grid_config.standard, token_axes=grid_config.token_axes, axis_caps=axis_caps,
                       tile_boundaries=tile_boundaries,
                       dense_tokens_up_to=grid_config.dense_tokens_up_to, sweep_at=grid_config.sweep_at,
                       config_path=grid_config.path)
    estimator = MemoryEstimator.for_budget_gb(max_hbm_gb, grid_config.memory.workspace_fraction,
                                              grid_config.memory.workspace_mib)
    described = {"target_models": [m.name for m in chosen], "rows": rows, "seed": seed, "max_hbm_gb": max_hbm_gb,
                 "max_tokens": max_tokens, "axis_caps": dict(axis_caps or {}), "tile_boundaries": tile_boundaries}
    return GridSettings(grid_config, grids, estimator, rows, seed, described, tuple(m.name for m in chosen))


def generate_kernel_rows(kernel_type: str, rows: Sequence[dict], settings: GridSettings, *, path=None
                         ) -> tuple[list[dict], KernelGridResult]:
    """The generated rows of one kernel type (not including its existing rows) and what happened."""
    grid = generate_kernel_grid(kernel_type, rows, settings, path=path)
    return grid.rows, grid.result


def generate_kernel_grid(kernel_type: str, rows: Sequence[dict], settings: GridSettings, *, path=None
                         ) -> KernelGrid:
    """One kernel type's generated rows with their buckets' axis point sets (see buckets.py)."""
    result = KernelGridResult(kernel_type, existing_rows=len(rows))
    patterns = settings.grid_config.patterns_for(kernel_type)
    recorder = PointSetRecorder(kernel_type)
    if not patterns:
        return KernelGrid([], result, [], [], [])
    result.patterns = ",".join(p.name for p in patterns)
    profiled = [r for r in rows if r.get(SOURCE, "") != SOURCE_GENERATED] or list(rows)
    templates, result.unparsable_profiled_rows = templates_from_rows(profiled, path=path)
    result.templates = len(templates)
    seen = {row_signature(r, kernel_type) for r in rows}
    stats = CandidateStats()
    generated: list[dict] = []
    buckets: dict[BucketKey, Bucket] = {}
    candidates = 0
    for pattern in patterns:
        usable = [(index, t) for index, t in enumerate(templates) if pattern.accepts(dict(t.metadata))]
        excluded_before = len(stats.excluded)
        for candidate in pattern_candidates(pattern, settings.grids, stats, settings.grid_config.path):
            candidates += 1
            fitted_any = False
            for index, template in usable:
                key = BucketKey(pattern.name, index, candidate.group)
                fitted = template.fit(candidate, pattern.match)
                if fitted is None:
                    recorder.record(key, candidate.axes, EXCUSED)
                    continue
                fitted_any = True
                row = _generated_row(template, fitted, candidate.columns)
                signature = row_signature(row, kernel_type)
                if signature in seen:
                    result.duplicates += 1
                    recorder.record(key, candidate.axes, DUPLICATE, signature)
                    continue
                seen.add(signature)
                if not _fits_budget(row, fitted, settings.estimator):
                    result.over_hbm_budget += 1
                    recorder.record(key, candidate.axes, EXCUSED)
                    continue
                recorder.record(key, candidate.axes, NEW, signature)
                buckets.setdefault(key, Bucket(key, candidate.users)).rows.append(len(generated))
                generated.append(row)
            if not fitted_any:
                result.no_fitting_template += 1
        for group, axes in stats.excluded[excluded_before:]:
            for index, _ in usable:
                recorder.record(BucketKey(pattern.name, index, group), axes, EXCUSED)
    result.combinations = stats.combinations
    result.rejected_by_constraints = stats.rejected_by_constraints
    result.invalid_dimensions = stats.invalid_dimensions
    kept, dropped = choose_buckets(list(buckets.values()), settings.rows, seed=settings.seed, kernel_type=kernel_type,
                                   model_order=settings.target_models, all_configurations=settings.configurations)
    keep = sorted(index for bucket in kept for index in bucket.rows)
    result.buckets, result.dropped_buckets = len(buckets), len(dropped)
    result.dropped_by_row_cap = len(generated) - len(keep)
    generated = [generated[i] for i in keep]
    result.generated = len(generated)
    if generated:
        result.status = STATUS_GENERATED
    elif candidates == 0:
        result.status = STATUS_NO_CANDIDATES
    elif result.no_fitting_template == candidates:
        result.status = STATUS_NO_TEMPLATE
    else:
        result.status = STATUS_NOTHING_NEW
    return KernelGrid(generated, result, recorder.point_sets({b.key for b in dropped}), list(buckets.values()),
                      dropped)


def _log_row_cap(grid: KernelGrid, cap: int) -> None:
    """What the row cap cost: the buckets it dropped whole (all of them at debug level)."""
    if not grid.dropped:
        return
    names = [f"{b.key.describe()} ({len(b.rows)} rows)" for b in grid.dropped]
    shown = "; ".join(names[:8]) + (f"; and {len(names) - 8} more" if len(names) > 8 else "")
    log.info("%s: the row cap (%d) dropped %d of %d buckets whole (%d rows): %s", grid.result.kernel_type, cap,
             grid.result.dropped_buckets, grid.result.buckets, grid.result.dropped_by_row_cap, shown)
    for name in names:
        log.debug("%s: dropped by the row cap: %s", grid.result.kernel_type, name)


def _generated_row(template: Template, fitted: tuple[tuple, tuple], columns) -> dict:
    inputs, outputs = fitted
    row = dict(template.metadata)
    row[INPUT_SHAPES] = format_shapes(inputs)
    row[OUTPUT_SHAPES] = format_shapes(outputs)
    strides = template.input_strides(inputs)
    if strides:
        row[INPUT_STRIDES] = strides
    row[SOURCE] = SOURCE_GENERATED
    row.update(columns)
    return row


def _fits_budget(row: dict, fitted: tuple[tuple, tuple], estimator: MemoryEstimator) -> bool:
    inputs, outputs = fitted
    return estimator.fits(inputs, parse_names(row.get(INPUT_DTYPES, "")), parse_names(row.get(INPUT_FORMATS, "")),
                          outputs, parse_names(row.get(OUTPUT_DTYPES, "")),
                          parse_names(row.get(OUTPUT_FORMATS, "")))


def read_manifest(directory: Path) -> list[str]:
    """The kernel types of a directory: its kernel_types.txt (parse stage output), else its *.csv files
    (a database directory, as the seed's --data-dir points at)."""
    manifest = directory / MANIFEST
    if not manifest.is_file():
        if not directory.is_dir():
            raise OpperfError("not a directory", path=directory)
        types = sorted(p.stem for p in directory.glob("*.csv"))
        if not types:
            raise OpperfError(f"neither {MANIFEST} nor any kernel CSV here", path=directory)
        return [check_kernel_type(t, path=directory / f"{t}.csv", field="file name") for t in types]
    types = []
    for line_number, line in enumerate(manifest.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            types.append(check_kernel_type(line.strip(), path=manifest, row=line_number, field="kernel type"))
    return types


def _merged_frame(frame: pd.DataFrame, generated: list[dict]) -> pd.DataFrame:
    extra = [c for row in generated for c in row if c not in frame.columns]
    columns = order_columns(list(frame.columns) + ([SOURCE] if SOURCE not in frame.columns else []) + extra)
    existing = frame.reindex(columns=columns, fill_value="")
    if not generated:
        return existing
    new = pd.DataFrame(generated).reindex(columns=columns, fill_value="").fillna("").astype(str)
    return pd.concat([existing, new], ignore_index=True)


def summary_table(results: Sequence[KernelGridResult]) -> str:
    names = list(asdict(results[0]).keys()) if results else list(KernelGridResult.__dataclass_fields__)
    lines = ["\t".join(names)]
    lines += ["\t".join(str(v) for v in asdict(r).values()) for r in results]
    return "\n".join(lines) + "\n"


def run_grid(input_dir: str | Path, output_dir: str | Path, settings: GridSettings,
             trace_dir: str | Path | None = None) -> list[KernelGridResult]:
    """The grid stage for one database directory (input_dir == output_dir appends in place)."""
    input_dir, output_dir = Path(input_dir), Path(output_dir)
    kernel_types = read_manifest(input_dir)
    frames: dict[str, pd.DataFrame] = {}
    results: list[KernelGridResult] = []
    dropped: dict[str, list[str]] = {}
    progress = Progress(log, "grid", len(kernel_types), unit="kernel types")
    with span("grid.generate", log, kernel_types=len(kernel_types)) as totals:
        for done, kernel_type in enumerate(kernel_types):
            progress.update(done)
            path = input_dir / f"{kernel_type}.csv"
            frame = read_database_csv(path, required=(INPUT_SHAPES, OUTPUT_SHAPES))
            rows = frame.to_dict("records")
            if not settings.patterns:            # queries only: the profiled rows as they are
                frames[kernel_type] = _merged_frame(frame, [])
                results.append(KernelGridResult(kernel_type, status="queries only", existing_rows=len(rows)))
                dropped[kernel_type] = []
                continue
            grid = generate_kernel_grid(kernel_type, rows, settings, path=path)
            generated, result = grid.rows, grid.result
            frames[kernel_type] = _merged_frame(frame, generated)
            results.append(result)
            dropped[kernel_type] = [b.key.describe() for b in grid.dropped]
            _log_row_cap(grid, settings.rows)
            log.info("%s: %s (%d existing rows, %d generated; %d duplicate, %d over the HBM budget, %d over the "
                     "row cap, %d rejected by constraints)", kernel_type, result.status, result.existing_rows,
                     result.generated, result.duplicates, result.over_hbm_budget, result.dropped_by_row_cap,
                     result.rejected_by_constraints)
        progress.finish(len(kernel_types))
        added = _add_consumer_rows(frames, results, settings.consumer_rows) if settings.consumer_rows else []
        totals["generated"] = sum(r.generated for r in results)
    _log_coverage(results)
    manifest = input_dir / MANIFEST
    manifest_text = manifest.read_text(encoding="utf-8") if manifest.is_file() else "".join(
        f"{t}\n" for t in kernel_types)
    manifest_text += "".join(f"{t}\n" for t in added)
    _write_outputs(input_dir, output_dir, frames, manifest_text, summary_table(results), settings.consumer_record)
    if trace_dir:
        _write_traces(Path(trace_dir), results, settings, dropped)
    return results


def _add_consumer_rows(frames: dict[str, pd.DataFrame], results: list[KernelGridResult], consumer: QueryRows
                       ) -> list[str]:
    """Append each recorded query's row to its kernel type (a new type where the profile has none), unless a
    row of that signature is already there; returns the new kernel types, in name order."""
    by_type = {r.kernel_type: r for r in results}
    template_columns = next(iter(frames.values())).columns if frames else pd.Index([])
    added_types, added_rows = [], 0
    for kernel_type in sorted(consumer.rows):
        check_kernel_type(kernel_type)
        frame = frames.get(kernel_type)
        if frame is None:
            frame = pd.DataFrame(columns=template_columns)
            added_types.append(kernel_type)
            by_type[kernel_type] = KernelGridResult(kernel_type, existing_rows=0, patterns=CONSUMER_BUCKET)
            results.append(by_type[kernel_type])
        existing = [row_signature(r, kernel_type) for r in frame.to_dict("records")]
        seen, answered_by = set(existing), {}
        new = []
        for row in consumer.rows[kernel_type]:
            signature = row_signature(row, kernel_type)
            if signature not in seen:
                seen.add(signature)
                new.append(row)
            elif signature in existing:
                answered_by.setdefault(signature, row[CONSUMER_QUERY])
        merged = _merged_frame(frame, new)
        if answered_by and CONSUMER_QUERY not in merged.columns:
            merged = merged.assign(**{CONSUMER_QUERY: ""})[order_columns([*merged.columns, CONSUMER_QUERY])]
        for index, signature in enumerate(existing):
            # A profiled row the query duplicates answers it: its op (arange.default where the profile ran
            # arange.start_out) must map to this type too.
            if signature in answered_by and not merged.at[index, CONSUMER_QUERY].strip():
                merged.at[index, CONSUMER_QUERY] = answered_by[signature]
        frames[kernel_type] = merged
        result = by_type[kernel_type]
        result.generated += len(new)
        result.consumer_queries = len(new)
        result.consumer_recorder = consumer.recorder
        if new:
            result.status = STATUS_GENERATED
        added_rows += len(new)
    log.info("consumer queries: %d distinct (%d views, no kernel), %d rows added (%d over the HBM budget) in %d "
             "kernel types, %d of them new: %s", consumer.queries + consumer.views, consumer.views, added_rows,
             consumer.over_hbm_budget, len(consumer.rows), len(added_types), ", ".join(added_types) or "none")
    for kernel_type, count in sorted(consumer.lookup_rows.items()):
        log.info("consumer queries: %s: %d of its rows lie between the recorded queries where msmodeling's lookup "
                 "looks (docs/msmodeling.md, \"Rows where its runtime looks\")", kernel_type, count)
    for op, count in sorted(consumer.not_laid_out.items()):
        log.warning("consumer queries: %d queries of %s have no recorded arguments and became no row", count, op)
    return added_types


def _log_coverage(results: Sequence[KernelGridResult]) -> None:
    without_pattern = [r.kernel_type for r in results if r.status == STATUS_NO_PATTERN]
    without_template = [r.kernel_type for r in results if r.status == STATUS_NO_TEMPLATE]
    if without_pattern:
        log.info("kernel types with no grid pattern (copied through unchanged): %s", ", ".join(without_pattern))
    if without_template:
        log.info("kernel types whose patterns fit none of their profiled rows (copied through unchanged): %s",
                 ", ".join(without_template))


def _write_outputs(input_dir: Path, output_dir: Path, frames: dict[str, pd.DataFrame], manifest_text: str,
                   summary_text: str, consumer_record: dict | None = None) -> None:
    """Write every CSV, the manifest, the summary and the consumer queries' record (which recorder, which
    msmodeling); a new output directory appears complete or not at all."""
    record_text = json.dumps(consumer_record, indent=1, sort_keys=True) + "\n" if consumer_record else None
    if output_dir.resolve() == input_dir.resolve():
        # In place (a database directory): only the kernel CSVs; the summary goes to the log, not among them.
        for kernel_type, frame in frames.items():
            write_csv_atomic(output_dir / f"{kernel_type}.csv", frame)
        log.debug("grid summary:\n%s", summary_text)
        if record_text:
            log.info("consumer queries: %s", record_text.strip())
        return
    with staged_directory(output_dir, replace_whole=True) as staging:
        for kernel_type, frame in frames.items():
            write_csv_atomic(staging / f"{kernel_type}.csv", frame)
        write_text_atomic(staging / MANIFEST, manifest_text)
        write_text_atomic(staging / SUMMARY, summary_text)
        if record_text:
            write_text_atomic(staging / CONSUMER_QUERIES_RECORD, record_text)


def _write_traces(trace_dir: Path, results: Sequence[KernelGridResult], settings: GridSettings,
                  dropped: dict[str, list[str]]) -> None:
    for result in results:
        trace = Trace(trace_dir, result.kernel_type)
        trace.record(TRACE_STEP, "GRID", "spec", json.dumps(
            {"kernel_type": result.kernel_type, "patterns": result.patterns.split(",") if result.patterns else [],
             **settings.settings_text}, indent=2, sort_keys=True))
        trace.record(TRACE_STEP, "GRID", "result", json.dumps(
            {**asdict(result), "buckets_dropped_by_row_cap": dropped.get(result.kernel_type, [])}, indent=2,
            sort_keys=True))
