"""The replay report of one database: replay_report.md, duration_gap.csv, summary.json, PNG plots.

summary.json follows seeds/reproduce-scripts-conventions (benchmark, script, workflow, pass_n, ops_count,
elapsed_s, device_ids, max_concurrency, llm_concurrency, env_spec, task_log_dir, stats). An "op" is
a kernel type; its `passed`/`total` count rows (replayed with status ok / all rows), its `profile`
compares the mean replay duration (`gen_time`, µs) with the mean profiled duration (`base_time`, µs)
over the rows that have both, `speedup = base_time / gen_time`.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from opperf import contract
from opperf.errors import OpperfError
from opperf.io import atomic_output, read_database_csv, write_text_atomic
from opperf.log import get_logger
from opperf.replay.engine import STATUS_OK, duration_value

log = get_logger("report")
DEFAULT_BAND = (0.8, 1.2)
REPORT_FILES = ("replay_report.md", "duration_gap.csv", "summary.json", "replay_vs_profile.png",
                "status_by_kernel.png")
GAP_COLUMNS = ("Type", "line", *contract.SIGNATURE_COLUMNS, contract.PROFILING_AVERAGE, contract.REPLAY_AVERAGE,
               "replay_over_profile", "band", contract.SOURCE)


@dataclass
class KernelSummary:
    """One kernel type's replay result: row counts by status, and replay vs profile where both exist."""

    kernel_type: str
    rows: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    pairs: list[tuple[float, float]] = field(default_factory=list)     # (profiled µs, replayed µs)
    replayed_us: list[float] = field(default_factory=list)
    errors: list[tuple[int, str, str]] = field(default_factory=list)   # (line, status, error)

    @property
    def passed(self) -> int:
        return self.statuses.get(STATUS_OK, 0)

    def profile(self) -> dict | None:
        if not self.pairs:
            return None
        base = statistics.fmean(p for p, _ in self.pairs)
        gen = statistics.fmean(r for _, r in self.pairs)
        return {"gen_time": round(gen, 4), "base_time": round(base, 4), "speedup": round(base / gen, 4)}


def summarise_kernel(path: Path, kernel_type: str, band: tuple[float, float], gaps: list[dict]) -> KernelSummary:
    frame = read_database_csv(path)
    summary = KernelSummary(kernel_type, rows=len(frame))
    for index, row in enumerate(frame.to_dict(orient="records")):
        line = index + 2
        status = row.get(contract.REPLAY_STATUS, "") or "not_replayed"
        summary.statuses[status] = summary.statuses.get(status, 0) + 1
        if row.get(contract.REPLAY_ERROR):
            summary.errors.append((line, status, row[contract.REPLAY_ERROR]))
        replayed = duration_value(row.get(contract.REPLAY_AVERAGE, ""))
        profiled = duration_value(row.get(contract.PROFILING_AVERAGE, ""))
        if replayed is not None:
            summary.replayed_us.append(replayed)
        if replayed is not None and profiled is not None:
            summary.pairs.append((profiled, replayed))
            ratio = replayed / profiled
            if not band[0] <= ratio <= band[1]:
                gap = {"Type": kernel_type, "line": str(line)}
                gap.update({c: contract.strip_profiler_quotes(row.get(c, "")) for c in contract.SIGNATURE_COLUMNS})
                gap.update({contract.PROFILING_AVERAGE: row[contract.PROFILING_AVERAGE],
                            contract.REPLAY_AVERAGE: row[contract.REPLAY_AVERAGE],
                            "replay_over_profile": f"{ratio:.4f}", "band": f"{band[0]:g}-{band[1]:g}",
                            contract.SOURCE: row.get(contract.SOURCE, "")})
                gaps.append(gap)
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


def environment_spec(backend: str) -> dict:
    spec = {"python": platform.python_version(), "platform": platform.platform(), "machine": platform.machine(),
            "cpu_count": os.cpu_count(), "backend": backend, "executable": sys.executable}
    try:
        import importlib.metadata as metadata
        spec["torch"] = metadata.version("torch")
    except Exception:     # noqa: BLE001 - the report must not fail for want of a version string
        spec["torch"] = ""
    return spec


def _plot(summaries: Sequence[KernelSummary], output_dir: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    figure, axes = plt.subplots(figsize=(6, 6))
    pairs = [(p, r, s.kernel_type) for s in summaries for p, r in s.pairs]
    if pairs:
        axes.scatter([p for p, _, _ in pairs], [r for _, r, _ in pairs], s=10, alpha=0.7)
        low = min(min(p, r) for p, r, _ in pairs)
        high = max(max(p, r) for p, r, _ in pairs)
        axes.plot([low, high], [low, high], color="grey", linewidth=1, label="replay = profile")
        axes.set_xscale("log")
        axes.set_yscale("log")
        axes.legend()
    else:
        axes.text(0.5, 0.5, "no row has both a profiled and a replayed duration", ha="center", va="center")
    axes.set_xlabel("Profiling Average Duration (us)")
    axes.set_ylabel("Average Duration (us), replay")
    axes.set_title("Replay vs profile, one point per row")
    figure.tight_layout()
    written.append(_save(figure, output_dir / "replay_vs_profile.png"))
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


def _save(figure, path: Path) -> Path:
    with atomic_output(path, "wb") as handle:
        figure.savefig(handle, format="png", dpi=100)
    return path


def _markdown(title: str, summaries: Sequence[KernelSummary], gaps: Sequence[dict], band, timings,
              summary: dict) -> str:
    stats = summary["stats"]
    lines = [f"# Replay report: {title}", "",
             f"{stats['total_ops']} kernel types, {sum(s.rows for s in summaries)} rows; "
             f"{stats['passed_ops']} kernel types replayed every row (pass rate {stats['pass_rate']:.3f}); "
             f"{sum(s.passed for s in summaries)} rows hold a replay duration. "
             f"{len(gaps)} rows have a replay/profile ratio outside {band[0]:g}-{band[1]:g} (duration_gap.csv).", "",
             "## Kernel types", "",
             "| Type | rows | ok | other statuses | mean replay (us) | mean profiled (us) | profiled/replay |",
             "|---|---:|---:|---|---:|---:|---:|"]
    for s in summaries:
        others = ", ".join(f"{k} {v}" for k, v in s.statuses.items() if k != STATUS_OK) or "-"
        profile = s.profile()
        mean_replay = f"{statistics.fmean(s.replayed_us):.3f}" if s.replayed_us else "-"
        lines.append(f"| {s.kernel_type} | {s.rows} | {s.passed} | {others} | {mean_replay} | "
                     f"{profile['base_time'] if profile else '-'} | {profile['speedup'] if profile else '-'} |")
    failing = [(s.kernel_type, e) for s in summaries for e in s.errors]
    if failing:
        lines += ["", "## Rows that did not replay", "", "| Type | line | status | error |", "|---|---:|---|---|"]
        for kernel_type, (line, status, error) in failing[:200]:
            lines.append(f"| {kernel_type} | {line} | {status} | {error.replace('|', '/')[:200]} |")
        if len(failing) > 200:
            lines.append(f"| … | | | {len(failing) - 200} more in the CSVs' Replay Error column |")
    if timings:
        lines += ["", "## Stage timings (Snakemake benchmark files)", "", "| stage | jobs | total s | slowest job s |",
                  "|---|---:|---:|---:|"]
        for stage, entry in sorted(timings.items()):
            lines.append(f"| {stage} | {entry['jobs']} | {entry['total_s']:.2f} | {entry['max_s']:.2f} |")
    lines += ["", "## Plots", "", "![replay vs profile](replay_vs_profile.png)", "",
              "![status by kernel](status_by_kernel.png)", ""]
    return "\n".join(lines)


def write_report(csv_files: Iterable[str | Path], output_dir: str | Path, *, title: str, backend: str = "cpu",
                 band: tuple[float, float] = DEFAULT_BAND, benchmarks_root: str | Path | None = None,
                 database_key: Sequence[str] = (), task_log_dir: str = "", device_ids: Sequence[int] = (),
                 max_concurrency: int = 1) -> list[Path]:
    """Write the report files (REPORT_FILES) for the given per-kernel CSVs (replayed or final database)."""
    if not 0 < band[0] < band[1]:
        raise OpperfError(f"band {list(band)} must be two increasing positive ratios", field="duration_gap_band")
    output_dir = Path(output_dir)
    gaps: list[dict] = []
    summaries = [summarise_kernel(Path(p), Path(p).stem, band, gaps) for p in sorted(csv_files, key=str)]
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
        "script": "scripts/replay.py",
        "workflow": "opperf snakemake: parse -> grid -> replay -> database -> report",
        "pass_n": 1,
        "ops_count": len(summaries),
        "elapsed_s": round(timings.get("replay", {}).get("total_s", 0.0), 3),
        "device_ids": list(device_ids),
        "max_concurrency": max_concurrency,
        "llm_concurrency": 0,
        "env_spec": environment_spec(backend),
        "task_log_dir": task_log_dir,
        "stats": {"total_ops": len(summaries), "passed_ops": passed_ops, "failed_ops": len(summaries) - passed_ops,
                  "pass_rate": round(passed_ops / len(summaries), 4) if summaries else 0.0,
                  "op_results": op_results},
        "stage_timings_s": timings,
    }
    written = []
    with atomic_output(output_dir / "duration_gap.csv") as handle:
        writer = csv.DictWriter(handle, GAP_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(gaps)
    written.append(output_dir / "duration_gap.csv")
    write_text_atomic(output_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    written.append(output_dir / "summary.json")
    written += _plot(summaries, output_dir)
    write_text_atomic(output_dir / "replay_report.md", _markdown(title, summaries, gaps, band, timings, summary))
    written.append(output_dir / "replay_report.md")
    log.info("report of %s: %d kernel types, %d gap rows -> %s", title, len(summaries), len(gaps), output_dir)
    return written


def write_database_report(database_dir: Path, reports_dir: Path, *, kernels: Sequence[str] | None = None,
                          band: tuple[float, float] = DEFAULT_BAND, backend: str = "cpu",
                          device_ids: Sequence[int] = ()) -> list[Path]:
    """The report of a database directory (the replay CLI's database form: one kernel type after another)."""
    files = [database_dir / f"{k}.csv" for k in kernels] if kernels else sorted(database_dir.glob("*.csv"))
    return write_report(files, reports_dir, title=str(database_dir), backend=backend, band=band,
                        device_ids=device_ids, max_concurrency=1)
