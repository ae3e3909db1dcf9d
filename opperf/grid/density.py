"""Density per axis against the standard: of the grid's point sets, and of a database's rows.

`check_density(source, settings=..., standard=...)` takes either axis point sets (what
`generate_kernel_grid` returns) or a database directory of kernel CSVs. For a directory it lays the grid
of `settings` over the directory's profiled rows again, finds for each point of each bucket the rows
with that row signature (`contract.row_signature`), and checks the values the database holds; with
`require_duration`, only rows with a positive duration count (a replayed database). A bucket with none of
its values in the database is counted absent (the row cap, a grid of other models), not thinned.

Each axis point set is checked over the standard's range for the axis, cut at the cap this run gave
the axis (the token cap, grid.yaml `axis_caps`): both ends, every required value and the spacing, values
the kernel cannot take there excused (a constraint such as b * s <= max_tokens, the memory budget, a
template slot that cannot store the shape). So a bucket stopped short or thinned fails. Per kernel type
and axis the report also gives the union of the values against the same range (the coverage the issue
measured).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from opperf.contract import (INPUT_SHAPES, OUTPUT_SHAPES, PROFILING_AVERAGE, REPLAY_AVERAGE, SOURCE, SOURCE_GENERATED,
                             row_signature)
from opperf.density import AxisCheck, DensityStandard
from opperf.grid.buckets import AxisPointSet
from opperf.grid.runner import GridSettings, generate_kernel_grid, read_manifest
from opperf.io import read_database_csv

DURATION_COLUMNS = (REPLAY_AVERAGE, PROFILING_AVERAGE)


@dataclass(frozen=True)
class PointSetCheck:
    point_set: AxisPointSet
    check: AxisCheck


@dataclass
class AxisSummary:
    """One density axis of one kernel type: its point sets checked, and the union of their values."""

    kernel_type: str
    axis: str
    checks: list[PointSetCheck] = field(default_factory=list)
    absent: int = 0                        # buckets with none of their values (dropped by the row cap)
    coverage: AxisCheck | None = None      # the union of the values against the standard's range

    @property
    def failures(self) -> list[PointSetCheck]:
        return [c for c in self.checks if not c.check.ok]

    @property
    def ok(self) -> bool:
        return not self.failures

    def line(self) -> str:
        union = self.coverage
        covered = f"{union.values[0]}..{union.values[-1]}" if union and union.values else "-"
        missing = ",".join(map(str, union.missing_required)) if union and union.missing_required else "-"
        return (f"{self.kernel_type}\t{self.axis}\t{len(self.checks)}\t{len(self.checks) - len(self.failures)}\t"
                f"{self.absent}\t{covered}\t{missing}")


@dataclass
class DensityReport:
    """Per kernel type and axis: buckets checked, meeting the standard, absent, and the union's coverage."""

    standard: DensityStandard
    axes: list[AxisSummary]

    @property
    def ok(self) -> bool:
        return all(a.ok for a in self.axes)

    def summary(self, axis: str, kernel_type: str | None = None) -> list[AxisSummary]:
        return [a for a in self.axes if a.axis == axis and kernel_type in (None, a.kernel_type)]

    def table(self, failures_shown: int = 3) -> str:
        """A TSV of the axes, each followed by up to `failures_shown` failing buckets (indented)."""
        lines = ["kernel_type\taxis\tbuckets\tmeeting_standard\tabsent\tvalues\tunion_missing_required"]
        for summary in self.axes:
            lines.append(summary.line())
            lines += [f"  {c.point_set.describe()}: {c.check.describe()}" for c in summary.failures[:failures_shown]]
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict:
        return {"standard": dict(self.standard.source), "ok": self.ok, "axes": [
            {"kernel_type": a.kernel_type, "axis": a.axis, "buckets": len(a.checks),
             "meeting_standard": len(a.checks) - len(a.failures), "absent": a.absent,
             "values": list(a.coverage.values) if a.coverage else [],
             "union_missing_required": list(a.coverage.missing_required) if a.coverage else [],
             "failures": [f"{c.point_set.describe()}: {c.check.describe()}" for c in a.failures]}
            for a in self.axes]}


def _axis_caps(settings: GridSettings | None) -> dict[str, int]:
    """The high end each axis was generated up to (token axes stop at the token cap)."""
    if settings is None:
        return {}
    caps = {name: settings.grids.axis_high(name) for name in settings.grids.standard.rules}
    return {name: cap for name, cap in caps.items() if cap is not None}


def check_point_sets(point_sets: Iterable[AxisPointSet], standard: DensityStandard, *,
                     caps: dict[str, int] | None = None) -> DensityReport:
    """Check every point set not dropped by the row cap; the union per kernel type and axis for coverage."""
    caps = caps or {}

    def window(axis: str) -> tuple[int, int]:
        rule = standard.rule(axis)
        return rule.window(high=caps.get(axis, caps.get(rule.name)))

    summaries: dict[tuple[str, str], AxisSummary] = {}
    unions: dict[tuple[str, str], tuple[set[int], set[int]]] = {}
    for point_set in point_sets:
        key = (point_set.kernel_type, point_set.axis)
        summary = summaries.setdefault(key, AxisSummary(*key))
        if point_set.dropped_by_row_cap or not point_set.present:
            summary.absent += 1
            continue
        low, high = window(point_set.axis)
        summary.checks.append(PointSetCheck(point_set, standard.rule(point_set.axis).check(
            point_set.present, low=low, high=high, excused=point_set.excused)))
        present, excused = unions.setdefault(key, (set(), set()))
        present |= point_set.present
        excused |= point_set.excused
    for key, summary in summaries.items():
        present, excused = unions.get(key, (set(), set()))
        if present:
            low, high = window(summary.axis)
            summary.coverage = standard.rule(summary.axis).check(present, low=low, high=high, excused=excused - present)
    return DensityReport(standard, sorted(summaries.values(), key=lambda s: (s.kernel_type, s.axis)))


def _has_duration(row: dict) -> bool:
    for column in DURATION_COLUMNS:
        try:
            value = float(row.get(column, "") or "nan")
        except ValueError:
            continue
        if math.isfinite(value) and value > 0:
            return True
    return False


def database_point_sets(directory: str | Path, settings: GridSettings, *, require_duration: bool = False
                        ) -> list[AxisPointSet]:
    """The grid's point sets laid over a database directory: each holds the values the database has."""
    directory = Path(directory)
    settings = dataclasses.replace(settings, rows=0)      # every bucket the grid declares
    found: list[AxisPointSet] = []
    for kernel_type in read_manifest(directory):
        path = directory / f"{kernel_type}.csv"
        # A built database keeps every measured layout in layouts/ (its kernel CSV: one row per runtime key).
        every_layout = directory / "layouts" / f"{kernel_type}.csv"
        rows = read_database_csv(every_layout if every_layout.is_file() else path,
                                 required=(INPUT_SHAPES, OUTPUT_SHAPES)).to_dict("records")
        held = {row_signature(r, kernel_type) for r in rows if not require_duration or _has_duration(r)}
        profiled = [r for r in rows if r.get(SOURCE, "") != SOURCE_GENERATED]
        for point_set in generate_kernel_grid(kernel_type, profiled, settings, path=path).point_sets:
            point_set.present = {v for v in point_set.present if point_set.signatures.get(v, set()) & held}
            point_set.dropped_by_row_cap = False
            found.append(point_set)
    return found


def check_density(source: str | Path | Sequence[AxisPointSet], *, standard: DensityStandard | None = None,
                  settings: GridSettings | None = None, require_duration: bool = False) -> DensityReport:
    """Density per axis against the standard, of point sets or of a database directory (which needs the
    `settings` its grid was generated with: grid config, target models, token cap)."""
    if standard is None:
        if settings is None:
            raise ValueError("check_density needs a standard or grid settings (which carry one)")
        standard = settings.grid_config.standard
    if isinstance(source, (str, Path)):
        if settings is None:
            raise ValueError("checking a database directory needs the grid settings it was generated with")
        source = database_point_sets(source, settings, require_duration=require_duration)
    return check_point_sets(source, standard, caps=_axis_caps(settings))
