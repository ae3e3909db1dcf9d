"""The replay report of one database: replay_report.md and .html, duration_gap.csv, summary.json, PNG plots.

The question a reader brings is "how far is replay from the profile, per kernel type, and can I trust
it". Profiled rows (they have a profiled in-workload duration) answer it: each is compared with its own
replay, as the ratio replay/profile (median, p10, p90, rows inside the band). Generated grid rows have no
profile to compare with; they are counted apart with their replay median. No statistic mixes the two.

Where the database directory is given (the workflow gives it), a row is named by its line in the database
CSV the runtime reads (`data/…/{Type}.csv`), in that file's spelling (`FLOAT`, quoted shapes stripped); a row
that file does not hold (another row of its runtime key stands for it) by its line in `layouts/{Type}.csv`.

summary.json (docs/report.md, "summary.json"): `ops_count` and `stats` (an "op" is a kernel type: its
`passed`/`total` count rows, replayed with status ok / all rows; its `profile` compares the mean replay
duration with the mean profiled duration over the rows that have both), `replay_job_time_sum_s` (the replay
jobs' run times added up: not wall time), `stage_timings_s`, `env_spec`, `task_log_dir` and
`replay_accuracy` (the ratio statistics per kernel type and for the whole database). The reproduce
scripts' JSON adds the fields of the reproduce-scripts conventions to it (`reproduce_fields`).
"""

from __future__ import annotations

import csv
import json
import math
import os
import platform
import re
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from opperf import contract
from opperf.errors import OpperfError
from opperf.io import atomic_output, read_database_csv, write_text_atomic
from opperf.log import get_logger
from opperf.replay.engine import STATUS_OK, duration_value

if TYPE_CHECKING:
    import pandas as pd

log = get_logger("report")
TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "templates"
DEFAULT_BAND = (0.8, 1.2)
WORST_ROWS = 15
REPORT_FILES = ("replay_report.md", "replay_report.html", "duration_gap.csv", "summary.json", "replay_vs_profile.png",
                "duration_gap_histogram.png", "status_by_kernel.png")
GAP_COLUMNS = ("Type", "file", "line", *contract.SIGNATURE_COLUMNS, contract.PROFILING_SAMPLE_COUNT,
               contract.PROFILING_AVERAGE, contract.PROFILING_MEDIAN, contract.PROFILING_STD, contract.REPLAY_AVERAGE,
               "replay_over_profile", "replay_over_profiled_median", "band", contract.SOURCE)


@dataclass(frozen=True)
class RowPlace:
    """Where a reader finds a row: a file and its line there, and the row's cells as that file spells them."""

    file: str
    line: int
    cell: str                  # the report's `line` cell: "12", or "layouts/mm.csv:12" outside the database CSV
    shapes: dict[str, str]


@dataclass
class RowPair:
    """One row having both durations: where it is (line, shapes) and how far its replay is from its profile."""

    kernel_type: str
    line: int                                   # in the CSV the report read (the replayed rows' order)
    profiled_us: float                          # the profiled calls' mean
    replayed_us: float
    source: str
    shapes: dict[str, str]
    place: RowPlace | None = None
    profiled_median_us: float | None = None
    profiled_std_us: float | None = None
    profiled_calls: int | None = None

    @property
    def ratio(self) -> float:
        """replay / profile: 1.0 is a perfect replay, 2.0 replay twice as slow as the workload ran."""
        return self.replayed_us / self.profiled_us

    @property
    def median_ratio(self) -> float | None:
        """replay / the profiled calls' median: where a few slow calls pull the profiled mean up, this one says
        how replay compares with a typical call."""
        return self.replayed_us / self.profiled_median_us if self.profiled_median_us else None


@dataclass
class KernelSummary:
    """One kernel type's replay result: row counts by status, paired rows, and generated rows' replays."""

    kernel_type: str
    rows: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    pairs: list[RowPair] = field(default_factory=list)
    profiled_rows: int = 0                      # rows with a profiled duration (paired or not)
    generated_rows: int = 0                     # grid rows: no profile to compare with
    generated_replayed_us: list[float] = field(default_factory=list)
    errors: list[tuple[str, str, str]] = field(default_factory=list)   # (line cell, status, error)

    @property
    def passed(self) -> int:
        return self.statuses.get(STATUS_OK, 0)

    def profile(self) -> dict | None:
        """Mean replay vs mean profiled µs over the paired rows only (the reproduce scripts' op_results profile,
        under names that say what they are: `reproduce_fields` gives the conventions' names)."""
        if not self.pairs:
            return None
        profiled = statistics.fmean(p.profiled_us for p in self.pairs)
        replayed = statistics.fmean(p.replayed_us for p in self.pairs)
        return {"replay_mean_us": round(replayed, 4), "profiled_mean_us": round(profiled, 4),
                "profiled_over_replay": round(profiled / replayed, 4)}

    def accuracy(self, band: tuple[float, float]) -> dict:
        """Ratio statistics of the paired rows and the generated rows' replay median (None where no row)."""
        ratios = [p.ratio for p in self.pairs]
        inside = sum(1 for r in ratios if band[0] <= r <= band[1])
        return {
            "profiled_rows": self.profiled_rows,
            "paired_rows": len(ratios),
            "median_ratio": _round(statistics.median(ratios)) if ratios else None,
            "p10_ratio": _round(percentile(ratios, 10)) if ratios else None,
            "p90_ratio": _round(percentile(ratios, 90)) if ratios else None,
            "inside_band": inside,
            "inside_band_share": _round(inside / len(ratios)) if ratios else None,
            "generated_rows": self.generated_rows,
            "generated_replayed_rows": len(self.generated_replayed_us),
            "generated_median_replay_us": (_round(statistics.median(self.generated_replayed_us))
                                           if self.generated_replayed_us else None),
        }


def whole_database(summaries: Sequence[KernelSummary]) -> KernelSummary:
    """Every kernel type's rows together: the whole database's accuracy figure."""
    total = KernelSummary("(all kernel types)")
    for s in summaries:
        total.rows += s.rows
        for status, count in s.statuses.items():
            total.statuses[status] = total.statuses.get(status, 0) + count
        total.pairs += s.pairs
        total.profiled_rows += s.profiled_rows
        total.generated_rows += s.generated_rows
        total.generated_replayed_us += s.generated_replayed_us
    return total


def _round(value: float) -> float:
    return round(value, 4)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile with linear interpolation between closest ranks (numpy's default method)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _shape_cells(row: dict) -> dict[str, str]:
    return {c: contract.strip_profiler_quotes(row.get(c, "")) for c in contract.SIGNATURE_COLUMNS}


def row_places(path: Path, kernel_type: str, rows: Sequence[dict], database_dir: Path | None) -> list[RowPlace]:
    """Where each of a kernel type's rows is for a reader: its line in the database CSV (`database_dir`'s
    {Type}.csv, as that file spells it), else in layouts/{Type}.csv; without a database, in `path` itself."""
    if database_dir is None:
        return [RowPlace(str(path), line, str(line), _shape_cells(row)) for line, row in enumerate(rows, start=2)]
    from opperf.consumer.runtime import runtime_lines

    kernel_csv = database_dir / f"{kernel_type}.csv"
    layouts_csv = database_dir / "layouts" / f"{kernel_type}.csv"
    view, every_row = read_database_csv(kernel_csv), read_database_csv(layouts_csv)
    if len(every_row) != len(rows):
        raise OpperfError(f"{len(every_row)} rows, but {path} has {len(rows)}: the database was built from other "
                          "rows (rebuild it)", path=layouts_csv)
    written = view.to_dict(orient="records")
    every = every_row.to_dict(orient="records")
    places = []
    for index, line in enumerate(runtime_lines(view, every_row)):
        if line is None:
            places.append(RowPlace(str(layouts_csv), index + 2, f"layouts/{kernel_type}.csv:{index + 2}",
                                   _shape_cells(every[index])))
        else:
            places.append(RowPlace(str(kernel_csv), line, str(line), _shape_cells(written[line - 2])))
    return places


def _number(value: object) -> float | None:
    """A finite number of a cell (0 included: a std of one call), else None."""
    try:
        number = float(contract.strip_profiler_quotes(value))
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _count(value: object) -> int | None:
    number = _number(value)
    return None if number is None else int(number)


def summarise_kernel(path: Path, kernel_type: str, band: tuple[float, float], gaps: list[dict],
                     phase_table: "pd.DataFrame | None" = None, database_dir: Path | None = None) -> KernelSummary:
    """One kernel type's rows against their profile; a phase stage's table folded in first, as the database
    stage folds it (opperf.replay.phase). With `database_dir`, rows are named as the database holds them
    (row_places)."""
    frame = read_database_csv(path)
    if phase_table is not None:
        from opperf.replay.phase_table import apply_phase_table

        frame, _ = apply_phase_table(frame, kernel_type, phase_table)
    summary = KernelSummary(kernel_type, rows=len(frame))
    records = frame.to_dict(orient="records")
    places = row_places(path, kernel_type, records, database_dir)
    for index, row in enumerate(records):
        line, place = index + 2, places[index]
        status = row.get(contract.REPLAY_STATUS, "") or "not_replayed"
        summary.statuses[status] = summary.statuses.get(status, 0) + 1
        if row.get(contract.REPLAY_ERROR):
            summary.errors.append((place.cell, status, row[contract.REPLAY_ERROR]))
        replayed = duration_value(row.get(contract.REPLAY_AVERAGE, ""))
        profiled = duration_value(row.get(contract.PROFILING_AVERAGE, ""))
        source = row.get(contract.SOURCE, "")
        if profiled is None:
            if source == contract.SOURCE_GENERATED:
                summary.generated_rows += 1
                if replayed is not None:
                    summary.generated_replayed_us.append(replayed)
            continue
        summary.profiled_rows += 1
        if replayed is None:
            continue
        pair = RowPair(kernel_type, line, profiled, replayed, source, place.shapes, place,
                       duration_value(row.get(contract.PROFILING_MEDIAN, "")),
                       _number(row.get(contract.PROFILING_STD, "")),
                       _count(row.get(contract.PROFILING_SAMPLE_COUNT, "")))
        summary.pairs.append(pair)
        if not band[0] <= pair.ratio <= band[1]:
            median_ratio = pair.median_ratio
            gaps.append({"Type": kernel_type, "file": place.file, "line": str(place.line), **place.shapes,
                         contract.PROFILING_SAMPLE_COUNT: row.get(contract.PROFILING_SAMPLE_COUNT, ""),
                         contract.PROFILING_AVERAGE: row[contract.PROFILING_AVERAGE],
                         contract.PROFILING_MEDIAN: row.get(contract.PROFILING_MEDIAN, ""),
                         contract.PROFILING_STD: row.get(contract.PROFILING_STD, ""),
                         contract.REPLAY_AVERAGE: row[contract.REPLAY_AVERAGE],
                         "replay_over_profile": f"{pair.ratio:.4f}",
                         "replay_over_profiled_median": "" if median_ratio is None else f"{median_ratio:.4f}",
                         "band": f"{band[0]:g}-{band[1]:g}", contract.SOURCE: source})
    return summary


def stage_timings(benchmarks_root: Path, database_key: Sequence[str]) -> dict[str, dict[str, float]]:
    """Seconds per stage of this database from Snakemake `benchmark:` files (benchmarks/runs/{stage}/...)."""
    timings: dict[str, dict[str, float]] = {}
    if not benchmarks_root.is_dir():
        return timings
    for path in sorted(benchmarks_root.rglob("*.tsv")):
        # {stage}/{device}/{stack}/{version_dir}.tsv or {stage}/{device}/{stack}/{version_dir}/{job}.tsv:
        # compared part by part, so A3 does not take XA3's files, nor v those of v_shape_generated.
        stage, *key = path.relative_to(benchmarks_root).with_suffix("").parts[:4]
        if tuple(key) != tuple(database_key):
            continue
        try:
            with open(path, newline="", encoding="utf-8") as handle:
                records = list(csv.DictReader(handle, delimiter="\t"))
            seconds = sum(float(r["s"]) for r in records)
        except (OSError, KeyError, ValueError):
            continue
        entry = timings.setdefault(stage, {"jobs": 0, "total_s": 0.0, "max_s": 0.0})
        entry["jobs"] += 1
        entry["total_s"] += seconds
        entry["max_s"] = max(entry["max_s"], seconds)
    return timings


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), to say which machine a timing comes from."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment_spec(backend: str) -> dict:
    spec = {"python": platform.python_version(), "platform": platform.platform(), "machine": platform.machine(),
            "cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "backend": backend, "executable": sys.executable}
    try:
        import importlib.metadata as metadata
        spec["torch"] = metadata.version("torch")
    except Exception:     # noqa: BLE001 - the report must not fail for want of a version string
        spec["torch"] = ""
    return spec


def _plot(summaries: Sequence[KernelSummary], output_dir: Path, band: tuple[float, float]) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    pairs = [p for s in summaries for p in s.pairs]
    figure, axes = plt.subplots(figsize=(8.5, 6))
    if pairs:
        low = min(min(p.profiled_us, p.replayed_us) for p in pairs) * 0.8
        high = max(max(p.profiled_us, p.replayed_us) for p in pairs) * 1.25
        axes.fill_between([low, high], [low * band[0], high * band[0]], [low * band[1], high * band[1]],
                          color="tab:green", alpha=0.15, label=f"band {band[0]:g}-{band[1]:g} x profile")
        axes.plot([low, high], [low, high], color="grey", linewidth=1, label="replay = profile")
        for kernel_type, colour, group in _by_kernel_type(pairs):
            inside = [p for p in group if band[0] <= p.ratio <= band[1]]
            outside = [p for p in group if not band[0] <= p.ratio <= band[1]]
            label = f"{kernel_type} ({len(inside)} in, {len(outside)} out)"
            axes.scatter([p.profiled_us for p in inside], [p.replayed_us for p in inside], s=14, alpha=0.8,
                         color=colour, marker="o",   # matplotlib hides labels starting "_" (aten's _scaled_dot_…)
                         label=f" {label}" if label.startswith("_") else label)
            axes.scatter([p.profiled_us for p in outside], [p.replayed_us for p in outside], s=22, alpha=0.9,
                         color=colour, marker="x")
        axes.scatter([], [], color="black", marker="o", s=14, label="inside the band")
        axes.scatter([], [], color="black", marker="x", s=22, label="outside the band")
        axes.set_xscale("log")
        axes.set_yscale("log")
        axes.set_xlim(low, high)
        axes.set_ylim(low, high)
        axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    else:
        axes.text(0.5, 0.5, "no row has both a profiled and a replayed duration", ha="center", va="center")
    axes.set_xlabel("Profiling Average Duration (us)")
    axes.set_ylabel("Average Duration (us), replay")
    axes.set_title("Replay vs profile, one point per profiled row, by kernel type")
    figure.tight_layout()
    written.append(_save(figure, output_dir / "replay_vs_profile.png"))
    plt.close(figure)

    figure, axes = plt.subplots(figsize=(7, 4))
    if pairs:
        ratios = [p.ratio for p in pairs]
        low, high = min(*ratios, band[0]) / 1.1, max(*ratios, band[1]) * 1.1
        edges = [low * (high / low) ** (i / 40) for i in range(41)]          # 40 bins, even on a log axis
        axes.hist(ratios, bins=edges, color="tab:blue", alpha=0.8)
        axes.axvspan(band[0], band[1], color="tab:green", alpha=0.15, label=f"band {band[0]:g}-{band[1]:g}")
        axes.axvline(1.0, color="grey", linewidth=1, label="replay = profile")
        axes.set_xscale("log")
        axes.legend(fontsize=8)
    else:
        axes.text(0.5, 0.5, "no row has both a profiled and a replayed duration", ha="center", va="center")
    axes.set_xlabel("replay / profile (Average Duration / Profiling Average Duration)")
    axes.set_ylabel("rows")
    axes.set_title("Duration gap: replay/profile ratio of every profiled row")
    figure.tight_layout()
    written.append(_save(figure, output_dir / "duration_gap_histogram.png"))
    plt.close(figure)

    statuses = sorted({status for s in summaries for status in s.statuses})
    figure, axes = plt.subplots(figsize=(max(6, 0.3 * len(summaries) + 2), 4))
    bottom = [0] * len(summaries)
    for status in statuses:
        counts = [s.statuses.get(status, 0) for s in summaries]
        axes.bar(range(len(summaries)), counts, bottom=bottom, label=status)
        bottom = [b + c for b, c in zip(bottom, counts)]
    axes.set_xticks(range(len(summaries)), [s.kernel_type for s in summaries], rotation=90, fontsize=7)
    axes.set_ylabel("rows")
    axes.set_title("Replay status by kernel type")
    if statuses:
        axes.legend(fontsize=7)
    figure.tight_layout()
    written.append(_save(figure, output_dir / "status_by_kernel.png"))
    plt.close(figure)
    return written


KERNEL_TYPE_COLOURS = 18     # the kernel types with the most paired rows get a colour of tab20 (not its greys)


def _by_kernel_type(pairs: Sequence[RowPair]) -> list[tuple[str, object, list[RowPair]]]:
    """(label, colour, pairs) per kernel type, most paired rows first, the smallest types merged into 'other'."""
    import matplotlib

    groups: dict[str, list[RowPair]] = {}
    for pair in pairs:
        groups.setdefault(pair.kernel_type, []).append(pair)
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))
    palette = [colour for index, colour in enumerate(matplotlib.colormaps["tab20"].colors) if index not in (14, 15)]
    coloured = [(name, palette[i], group) for i, (name, group) in enumerate(ordered[:KERNEL_TYPE_COLOURS])]
    rest = [pair for _, group in ordered[KERNEL_TYPE_COLOURS:] for pair in group]
    if rest:
        coloured.append((f"{len(ordered) - KERNEL_TYPE_COLOURS} other types", "tab:gray", rest))
    return coloured


def _save(figure, path: Path) -> Path:
    with atomic_output(path, "wb") as handle:
        figure.savefig(handle, format="png", dpi=100)
    return path


def _cell(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


@dataclass(frozen=True)
class AccuracyExplained:
    """Where a back end's replay/profile gap is measured and explained, and the gist of it, said in the report
    itself: Snakemake's HTML report shows replay_report.html inside a `data:` frame, where no relative link
    resolves, so the HTML names the section instead of linking it."""

    doc: str                   # relative to the repository root
    anchor: str
    section: str
    gist: str


ACCURACY_EXPLAINED = {
    "cpu": AccuracyExplained(
        "docs/replay.md", "cpu-back-end-accuracy", "CPU back end: accuracy",
        "Measured there: on an idle 16-core Xeon the demo replays at 0.77-0.94 of its profile at the median over "
        "four settled runs (49 of 94 rows inside 0.8-1.2 at best). A reused input (a GEMM's weight) takes turns "
        "over copies at its profiled reuse distance, which makes decode GEMVs over small weights 1.5-2.2x slow on "
        "that Xeon; ops of a few µs replay at 0.5-0.7 there and 1.4-1.7 on a 2-core VM. A row's profiled mean is "
        "of 1-20 calls of one run, two runs of the workload differ by about 5 % at the median, and on a loaded "
        "host a single preempted call moves a row's mean."),
    "cuda": AccuracyExplained(
        "docs/replay.md", "accuracy-cuda-h100", "Accuracy (CUDA, H100)",
        "Measured there: on an H100 with the default cache (insitu) and power policies, replay is within 2.3 % "
        "of the profile at the median and 9.8 % at p90; what remains are long power-limited prefill phases "
        "and kernels of 1-10 µs, which differ by 0.2-1 µs."),
}


@dataclass
class Table:
    """One table of the report, rendered alike into replay_report.md and replay_report.html."""

    heading: str
    intro: str
    columns: list[str]
    rows: list[list[str]]
    numeric: set[int] = field(default_factory=set)      # right-aligned columns
    code: set[int] = field(default_factory=set)         # shapes: monospace


def _ratio_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _number_cell(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _report_context(title: str, summaries: Sequence[KernelSummary], gaps: Sequence[dict], band, timings,
                    summary: dict, backend: str, database_dir: Path | None = None) -> dict:
    """What replay_report.md and replay_report.html say, computed once (templates/replay_report.*.j2)."""
    stats = summary["stats"]
    pairs = [p for s in summaries for p in s.pairs]
    whole = summary["replay_accuracy"]["database"]
    rows_total = sum(s.rows for s in summaries)
    completion = (f"{stats['passed_ops']} of {stats['total_ops']} kernel types replayed every one of their rows "
                  f"(pass rate {stats['pass_rate']:.3f}); {sum(s.passed for s in summaries)} of {rows_total} rows "
                  "have a replay. This says that replay ran, not that it matches the profile.")
    if pairs:
        accuracy = (f"{whole['paired_rows']} of {whole['profiled_rows']} profiled rows have a replay; "
                    f"{whole['inside_band']} of them ({whole['inside_band_share']:.0%}) are inside the band "
                    f"{band[0]:g}-{band[1]:g} x profile, median replay/profile {whole['median_ratio']:.3f} "
                    f"(p10 {whole['p10_ratio']:.3f}, p90 {whole['p90_ratio']:.3f}); the {len(gaps)} outside are "
                    "listed in duration_gap.csv.")
    else:
        accuracy = "No row has both a profiled and a replayed duration."
    explained = None
    if backend in ACCURACY_EXPLAINED:
        entry = ACCURACY_EXPLAINED[backend]
        # The workflow writes into reports/{device}/{stack}/{version_dir}/: the repository root is 4 levels up
        # (the markdown's link; the HTML names the section, see AccuracyExplained).
        explained = {"href": f"../../../../{entry.doc}#{entry.anchor}", "doc": entry.doc, "section": entry.section,
                     "text": f"{entry.doc}, \u201c{entry.section}\u201d", "gist": entry.gist}
    if database_dir is not None:
        lines_in = (f"`line` is the row's line in `{database_dir}/{{Type}}.csv`, the database CSV the runtime "
                    "reads, and shapes and dtypes are as that file writes them; a row that CSV does not hold (it "
                    "shares its runtime key with a row that carried more of the workload's calls) is named by its "
                    f"line in `{database_dir}/layouts/{{Type}}.csv` (`layouts/{{Type}}.csv:N`).")
    else:
        lines_in = "`line` is the row's line in the kernel type's CSV the report read."

    tables = []
    kernel_rows = []
    for s in summaries:
        others = ", ".join(f"{k} {v}" for k, v in s.statuses.items() if k != STATUS_OK) or "-"
        a = s.accuracy(band)
        inside_cell = f"{a['inside_band']}/{a['paired_rows']}" if a["paired_rows"] else "-"
        kernel_rows.append([s.kernel_type, str(s.rows), str(s.passed), others, str(a["profiled_rows"]),
                            str(a["paired_rows"]), _cell(a["median_ratio"]), _cell(a["p10_ratio"]),
                            _cell(a["p90_ratio"]), inside_cell, str(a["generated_rows"]),
                            _cell(a["generated_median_replay_us"])])
    tables.append(Table(
        "Kernel types",
        "How to read: a *profiled* row carries the duration the kernel took inside the profiled workload; its "
        "replay is compared with it as the ratio replay/profile (1 = replay reproduces the workload, 2 = replay "
        "twice as slow). *paired* counts the profiled rows that also have a replay; the median, p10 and p90 of "
        "their ratios and how many fall inside the band say how far replay is from the profile. *Generated* rows "
        "come from the shape grid and have no profile: only their replay median is shown, never mixed into the "
        "ratios.",
        ["Type", "rows", "ok", "other statuses", "profiled rows", "paired", "median replay/profile", "p10", "p90",
         f"inside {band[0]:g}-{band[1]:g}", "generated rows", "generated replay median (us)"],
        kernel_rows, numeric={1, 2, 4, 5, 6, 7, 8, 9, 10, 11}))
    worst = sorted(pairs, key=lambda p: (-abs(math.log(p.ratio)), p.kernel_type, p.line))[:WORST_ROWS]
    if worst:
        tables.append(Table(
            f"The {len(worst)} rows furthest from their profile",
            "Ordered by how far replay/mean is from 1 in either direction (x2 and /2 count the same). A row's "
            "profile is the mean of its *calls* in the workload; their median and std say whether a few slow "
            "calls pulled the mean up (then replay/median, against a typical call, is the fairer comparison). "
            + lines_in,
            ["Type", "line", "Input Shapes", "Input Data Types", "Output Shapes", "calls", "profiled mean (us)",
             "profiled median (us)", "profiled std (us)", "replay (us)", "replay/mean", "replay/median"],
            [[p.kernel_type, p.place.cell if p.place else str(p.line), p.shapes[contract.INPUT_SHAPES],
              p.shapes[contract.INPUT_DTYPES], p.shapes[contract.OUTPUT_SHAPES],
              "-" if p.profiled_calls is None else str(p.profiled_calls), _number_cell(p.profiled_us),
              _number_cell(p.profiled_median_us), _number_cell(p.profiled_std_us), _number_cell(p.replayed_us),
              _ratio_cell(p.ratio), _ratio_cell(p.median_ratio)]
             for p in worst],
            numeric={1, 5, 6, 7, 8, 9, 10, 11}, code={2, 4}))
    failing = [(s.kernel_type, e) for s in summaries for e in s.errors]
    if failing:
        rows = [[kernel_type, line, status, error[:200]]
                for kernel_type, (line, status, error) in failing[:200]]
        if len(failing) > 200:
            rows.append(["…", "", "", f"{len(failing) - 200} more in the CSVs' Replay Error column"])
        tables.append(Table("Rows that did not replay", lines_in, ["Type", "line", "status", "error"], rows,
                            numeric={1}))
    if timings:
        tables.append(Table(
            "Stage timings (Snakemake benchmark files)",
            "Each stage's jobs' run times added up (*total s*): jobs that ran at once count each, so this is "
            "not the wall time of the run.",
            ["stage", "jobs", "total s", "slowest job s"],
            [[stage, str(e["jobs"]), f"{e['total_s']:.2f}", f"{e['max_s']:.2f}"] for stage, e in sorted(timings.items())],
            numeric={1, 2, 3}))
    plots = [
        {"file": "replay_vs_profile.png", "alt": "replay vs profile",
         "text": "Replay against profile, one point per paired row, coloured by kernel type; the shaded region is "
                 "the band, crosses are outside it:"},
        {"file": "duration_gap_histogram.png", "alt": "duration gap histogram",
         "text": "How the replay/profile ratios spread (log axis, the band shaded):"},
        {"file": "status_by_kernel.png", "alt": "status by kernel", "text": ""},
    ]
    return {"title": title, "completion": completion, "accuracy": accuracy, "explained": explained,
            "tables": tables, "plots": plots}


def _render(template: str, context: dict) -> str:
    """templates/<template> with the report context (HTML escaped where the template is HTML)."""
    import jinja2

    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
                                     undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                                     autoescape=jinja2.select_autoescape(["html.j2"]))
    environment.filters["markdown_cell"] = lambda text: str(text).replace("|", "/")
    environment.filters["inline_markup"] = _inline_markup
    environment.filters["breakable"] = _breakable
    return environment.get_template(template).render(**context)


def _breakable(text: object):
    """A table cell as HTML that may wrap after each `;` (between shape or dtype slots), so a long slot list wraps
    there rather than mid-slot or past the frame's edge."""
    import html

    import markupsafe

    return markupsafe.Markup(html.escape(str(text)).replace(";", ";<wbr>"))


def _inline_markup(text: str) -> str:
    """The report's prose as HTML: escaped, with its markdown *emphasis* and `code` spans kept (the template
    marks the result safe)."""
    import html

    marked = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))
    return re.sub(r"\*([^*]+)\*", r"<em>\1</em>", marked)


def _parsed_json(parsed_dir: str | Path, name: str, what: str) -> dict | None:
    path = Path(parsed_dir) / name
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise OpperfError(f"cannot read the parse's {what}: {exc}", path=path) from exc


def read_attribution(parsed_dir: str | Path) -> dict | None:
    """The parse's trace_attribution.json of a database directory (None when its profiles were no torch traces)."""
    return _parsed_json(parsed_dir, contract.TRACE_ATTRIBUTION, "attribution accounting")


def read_profile_overhead(parsed_dir: str | Path) -> dict | None:
    """The parse's profile_overhead.json of a database directory: per profile, its profiler overhead."""
    return _parsed_json(parsed_dir, contract.PROFILE_OVERHEAD, "profiler overhead")


def _overhead_lines(overhead: dict) -> list[str]:
    lines = ["", "## The profile's own overhead (workload stage)", "",
             "A pass of the workload timed without the profiler (two passes: their spread is the noise floor) and "
             "under it. Beyond the floor, on the cpu back end the profiled op times carry the profiler's cost and "
             "replay/profile reads low; on a device the kernels do not, but the host side is stretched.", "",
             "| profile | plain pass (s) | profiled pass (s) | ratio | noise | beyond the floor |", "|---|---:|---:|---:|---:|---|"]
    for trace, entry in overhead.items():
        plain = ", ".join(f"{v:.4f}" for v in entry.get("plain_pass_s", []))
        lines.append(f"| {trace} | {plain} | {entry.get('profiled_pass_s', 0):.4f} | x{entry.get('ratio', 0):.3f} | "
                     f"{100 * entry.get('noise', 0):.1f} % | {'**yes**' if entry.get('inflated') else 'no'} |")
    return lines


def _attribution_lines(attribution: dict) -> list[str]:
    lines = ["", "## How much of the profiled device time is in rows (parse)", "",
             "| trace | device time (us) | in rows | not in any row |", "|---|---:|---:|---|"]
    for trace, entry in attribution.items():
        rest = "; ".join(f"{kind}: {value['us']:.1f} us ({value['activities']})"
                         for kind, value in entry.get("unattributed", {}).items()) or "-"
        share = entry.get("share")
        lines.append(f"| {trace} | {entry['device_us']:.1f} | {'-' if share is None else f'{100 * share:.2f} %'} | "
                     f"{rest} |")
    return lines


def write_report(csv_files: Iterable[str | Path], output_dir: str | Path, *, title: str, backend: str = "cpu",
                 band: tuple[float, float] = DEFAULT_BAND, benchmarks_root: str | Path | None = None,
                 database_key: Sequence[str] = (), task_log_dir: str = "", attribution: dict | None = None,
                 overhead: dict | None = None,
                 phase_table: str | Path | None = None, database_dir: str | Path | None = None,
                 script: str = "scripts/report.py") -> list[Path]:
    """Write the report files (REPORT_FILES) for the given per-kernel CSVs (replayed or final database), with a
    phase stage's table (`phase_table`) folded into replayed rows as the database holds them; with
    `database_dir` (the built database of these rows), rows are named by their line in its CSVs."""
    if not 0 < band[0] < band[1]:
        raise OpperfError(f"band {list(band)} must be two increasing positive ratios", field="duration_gap_band")
    output_dir = Path(output_dir)
    database_dir = Path(database_dir) if database_dir else None
    gaps: list[dict] = []
    table = None
    if phase_table:
        from opperf.replay.phase_table import read_phase_table

        table = read_phase_table(phase_table)
    summaries = [summarise_kernel(Path(p), Path(p).stem, band, gaps, table, database_dir)
                 for p in sorted(csv_files, key=str)]
    timings = stage_timings(Path(benchmarks_root), database_key) if benchmarks_root else {}
    passed_ops = sum(1 for s in summaries if s.rows and s.passed == s.rows)
    op_results = {}
    for s in summaries:
        entry = {"passed": s.passed, "total": s.rows}
        profile = s.profile()
        if profile:
            entry["profile"] = profile
        op_results[s.kernel_type] = entry
    summary = {
        "benchmark": f"opperf-replay:{title}",
        "script": script,
        "workflow": "opperf snakemake: parse -> grid -> replay -> database -> report",
        "ops_count": len(summaries),
        "replay_job_time_sum_s": round(timings.get("replay", {}).get("total_s", 0.0), 3),
        "env_spec": environment_spec(backend),
        "task_log_dir": task_log_dir,
        "stats": {"total_ops": len(summaries), "passed_ops": passed_ops, "failed_ops": len(summaries) - passed_ops,
                  "pass_rate": round(passed_ops / len(summaries), 4) if summaries else 0.0,
                  "op_results": op_results},
        "stage_timings_s": timings,
        "replay_accuracy": {"band": list(band), "database": whole_database(summaries).accuracy(band),
                            "kernel_types": {s.kernel_type: s.accuracy(band) for s in summaries}},
    }
    if attribution:
        summary["trace_attribution"] = attribution
    if overhead:
        summary["profile_overhead"] = overhead
    written = []
    with atomic_output(output_dir / "duration_gap.csv") as handle:
        writer = csv.DictWriter(handle, GAP_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(gaps)
    written.append(output_dir / "duration_gap.csv")
    write_text_atomic(output_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    written.append(output_dir / "summary.json")
    written += _plot(summaries, output_dir, band)
    context = _report_context(title, summaries, gaps, band, timings, summary, backend, database_dir)
    for name in ("replay_report.md", "replay_report.html"):
        text = _render(f"{name}.j2", context)
        if attribution and name.endswith(".md"):
            text += "\n".join(_attribution_lines(attribution)) + "\n"
        if overhead and name.endswith(".md"):
            text += "\n".join(_overhead_lines(overhead)) + "\n"
        write_text_atomic(output_dir / name, text)
        written.append(output_dir / name)
    log.info("report of %s: %d kernel types, %d gap rows -> %s", title, len(summaries), len(gaps), output_dir)
    return written


def write_database_report(database_dir: Path, reports_dir: Path, *, kernels: Sequence[str] | None = None,
                          band: tuple[float, float] = DEFAULT_BAND, backend: str = "cpu") -> list[Path]:
    """The report of a database directory (the replay CLI's database form: one kernel type after another)."""
    files = [database_dir / f"{k}.csv" for k in kernels] if kernels else sorted(database_dir.glob("*.csv"))
    return write_report(files, reports_dir, title=str(database_dir), backend=backend, band=band,
                        attribution=read_attribution(database_dir), overhead=read_profile_overhead(database_dir),
                        script="scripts/replay.py")


# The JSON of a reproduce script (reproduce/README.md) must carry these top-level fields of the
# reproduce-scripts conventions, some of which mean nothing for a replay: `pass_n` (1: every row is replayed
# once per run) and `llm_concurrency` (0: no language model is asked anything).
REPRODUCE_PASS_N = 1
REPRODUCE_LLM_CONCURRENCY = 0


def reproduce_fields(summary: dict, *, script: str, workflow: str, elapsed_s: float, device_ids: Sequence[int],
                     max_concurrency: int, task_log_dir: str) -> dict:
    """A report's summary.json as a reproduce script's JSON: the conventions' fields added (`elapsed_s` the
    script's wall time, `device_ids` and `max_concurrency` what it ran with) and each op's `profile` under the
    conventions' names: `gen_time` = replay mean (µs), `base_time` = profiled mean (µs),
    `speedup` = base_time / gen_time (profiled over replay: above 1, replay ran faster than the workload)."""
    op_results = {}
    for op, entry in summary["stats"]["op_results"].items():
        entry = dict(entry)
        if "profile" in entry:
            profile = entry["profile"]
            entry["profile"] = {"gen_time": profile["replay_mean_us"], "base_time": profile["profiled_mean_us"],
                                "speedup": profile["profiled_over_replay"]}
        op_results[op] = entry
    return {**summary, "script": script, "workflow": workflow, "pass_n": REPRODUCE_PASS_N,
            "elapsed_s": round(elapsed_s, 3), "device_ids": list(device_ids), "max_concurrency": max_concurrency,
            "llm_concurrency": REPRODUCE_LLM_CONCURRENCY, "task_log_dir": task_log_dir,
            "stats": {**summary["stats"], "op_results": op_results}}
