"""Point-by-point comparison of collective CSVs: a new collection against a reference (another run,
another machine, the peer's files), reporting every point whose duration disagrees beyond a tolerance.

Points are matched on (message_bytes, num_devices, dtype, topology_tier). The ratio is
measured / reference; a point agrees when 1/(1+tolerance) <= ratio <= 1+tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from opperf.comm.collectives import BACKENDS, OPS, op_of_file_name
from opperf.comm.results import DURATION, KEY_COLUMNS, number_column, read_comm_csv
from opperf.errors import OpperfError
from opperf.io import write_csv_atomic

AGREES = "agrees"
SLOWER = "slower"             # measured takes longer than the reference allows
FASTER = "faster"
ONLY_MEASURED = "only_measured"
ONLY_REFERENCE = "only_reference"
REPORT_COLUMNS = ("collective", *KEY_COLUMNS, "measured_us", "reference_us", "ratio", "status")


@dataclass
class AlignmentSummary:
    rows: pd.DataFrame

    def count(self, status: str) -> int:
        return int((self.rows["status"] == status).sum())

    @property
    def disagreements(self) -> int:
        return self.count(SLOWER) + self.count(FASTER)

    @property
    def unmatched(self) -> int:
        return self.count(ONLY_MEASURED) + self.count(ONLY_REFERENCE)

    def text(self) -> str:
        compared = self.count(AGREES) + self.disagreements
        lines = [f"{compared} points compared: {self.count(AGREES)} agree, {self.count(SLOWER)} slower, "
                 f"{self.count(FASTER)} faster; {self.count(ONLY_MEASURED)} only in measured, "
                 f"{self.count(ONLY_REFERENCE)} only in reference"]
        matched = self.rows[self.rows["ratio"] != ""]
        if len(matched):
            ratios = matched["ratio"].astype(float)
            lines.append(f"ratio measured/reference: min {ratios.min():.3f}, median {ratios.median():.3f}, "
                         f"max {ratios.max():.3f}")
        for _, row in self.rows[self.rows["status"].isin([SLOWER, FASTER])].iterrows():
            lines.append(f"  {row['status']:<7} {row['collective']:<15} {row['message_bytes']:>11} B "
                         f"x{row['num_devices']} {row['dtype']} tier {row['topology_tier']}: "
                         f"{row['measured_us']} us vs {row['reference_us']} us (ratio {row['ratio']})")
        return "\n".join(lines)


def _collective_of(path: Path) -> str:
    for backend in BACKENDS:
        try:
            return op_of_file_name(backend, path.name)
        except OpperfError:
            continue
    return path.stem


def compare_frames(collective: str, measured: pd.DataFrame, reference: pd.DataFrame, tolerance: float,
                   column: str = DURATION) -> list[dict]:
    """The report rows of one collective (typed frames from `read_comm_csv`)."""
    keys = list(KEY_COLUMNS)
    merged = measured[keys + [column]].merge(reference[keys + [column]], on=keys, how="outer",
                                             suffixes=("_measured", "_reference"), indicator=True)
    rows = []
    for _, point in merged.sort_values(keys).iterrows():
        row = {"collective": collective, **{k: str(point[k]) for k in keys},
               "measured_us": "", "reference_us": "", "ratio": "", "status": ""}
        if point["_merge"] == "left_only":
            row.update(measured_us=f"{point[column + '_measured']:.3f}", status=ONLY_MEASURED)
        elif point["_merge"] == "right_only":
            row.update(reference_us=f"{point[column + '_reference']:.3f}", status=ONLY_REFERENCE)
        else:
            ratio = point[column + "_measured"] / point[column + "_reference"]
            status = SLOWER if ratio > 1 + tolerance else FASTER if ratio < 1 / (1 + tolerance) else AGREES
            row.update(measured_us=f"{point[column + '_measured']:.3f}",
                       reference_us=f"{point[column + '_reference']:.3f}", ratio=f"{ratio:.4f}", status=status)
        rows.append(row)
    return rows


def _pairs(measured: Path, reference: Path) -> list[tuple[str, Path, Path]]:
    """(collective, measured file, reference file): two files, or the collectives two directories share."""
    if measured.is_file() and reference.is_file():
        return [(_collective_of(measured), measured, reference)]
    if measured.is_dir() and reference.is_dir():
        in_reference = {_collective_of(p): p for p in sorted(reference.glob("*.csv"))}
        pairs = [(op, p, in_reference[op]) for p in sorted(measured.glob("*.csv"))
                 if (op := _collective_of(p)) in in_reference and op in OPS]
        if not pairs:
            raise OpperfError(f"no collective CSV of {measured} has a counterpart in {reference}", path=measured)
        return pairs
    missing = measured if not measured.exists() else reference
    if not missing.exists():
        raise OpperfError("not found", path=missing)
    raise OpperfError(f"compare two files or two directories, not {measured} with {reference}", path=measured)


def validate_alignment(measured: str | Path, reference: str | Path, tolerance: float = 0.2,
                       column: str = DURATION, report: str | Path | None = None) -> AlignmentSummary:
    """Compare measured against reference point by point; optionally write the per-point report CSV."""
    if tolerance <= 0:
        raise OpperfError(f"tolerance must be positive, got {tolerance}", field="--tolerance")
    rows = []
    for collective, measured_file, reference_file in _pairs(Path(measured), Path(reference)):
        measured_frame, reference_frame = read_comm_csv(measured_file), read_comm_csv(reference_file)
        for path, frame in ((measured_file, measured_frame), (reference_file, reference_frame)):
            if column not in frame.columns:
                raise OpperfError(f"no column {column!r}", path=path, field=column)
            frame[column] = number_column(frame, column, path)
        rows += compare_frames(collective, measured_frame, reference_frame, tolerance, column)
    summary = AlignmentSummary(pd.DataFrame(rows, columns=list(REPORT_COLUMNS)))
    if report is not None:
        write_csv_atomic(report, summary.rows)
    return summary
