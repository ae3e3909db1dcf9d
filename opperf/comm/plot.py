"""Bus bandwidth versus message size for collective CSVs, and a table of how close the largest messages
come to a link limit (e.g. NVLink 4: 450 GB/s per direction per H200)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from opperf.comm.collectives import OPS
from opperf.comm.results import (BENCH_MODE, BUSBW, DURATION, MESSAGE_BYTES, NUM_DEVICES, OP, number_column,
                                 read_comm_csv)
from opperf.comm.sizes import format_size
from opperf.errors import OpperfError
from opperf.io import atomic_output, write_text_atomic

RUN = "run"
LIMIT_IN_RANGE = 3      # the link limit is drawn when it is at most 3x the largest busbw measured


def load_runs(runs: Sequence[tuple[str, str | Path]]) -> pd.DataFrame:
    """Every collective CSV under each (label, directory or one CSV), with the run's label; needs our extra
    columns. A label given several times gathers all its paths into one run."""
    frames = []
    for label, directory in runs:
        files = sorted(Path(directory).rglob("*.csv")) if Path(directory).is_dir() else [Path(directory)]
        if not files or not files[0].is_file():
            raise OpperfError("no collective CSV found", path=directory)
        for path in files:
            frame = read_comm_csv(path)
            for column in (OP, BENCH_MODE, BUSBW):
                if column not in frame.columns:
                    raise OpperfError(f"no column {column!r} (written by opperf's collective benchmark)",
                                      path=path, field=column)
            frame[BUSBW] = number_column(frame, BUSBW, path)
            frame[RUN] = label
            frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def plot_bus_bandwidth(frame: pd.DataFrame, output: str | Path, limit_gbps: float | None = None,
                       limit_label: str = "link limit", title: str = "") -> None:
    """One panel per (bench mode, device count); a line per (collective, run); the limit as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = sorted(frame[BENCH_MODE].unique(), key=lambda m: m != "kernel")
    counts = sorted(frame[NUM_DEVICES].unique())
    figure, axes = plt.subplots(len(modes), len(counts), figsize=(6.2 * len(counts), 4.4 * len(modes)),
                                squeeze=False, sharex=True, sharey=True)
    runs = list(dict.fromkeys(frame[RUN]))
    styles = ["-", "--", ":", "-."]
    colours = dict(zip(OPS, ["tab:blue", "tab:orange", "tab:green", "tab:red"]))
    for row, mode in enumerate(modes):
        for col, count in enumerate(counts):
            axis = axes[row][col]
            panel = frame[(frame[BENCH_MODE] == mode) & (frame[NUM_DEVICES] == count)]
            for run_index, run in enumerate(runs):
                for op in OPS:
                    line = panel[(panel[RUN] == run) & (panel[OP] == op)].sort_values(MESSAGE_BYTES)
                    if len(line):
                        axis.plot(line[MESSAGE_BYTES], line[BUSBW], styles[run_index % len(styles)], marker=".",
                                  color=colours[op], label=f"{op} ({run})")
            if limit_gbps and limit_gbps <= LIMIT_IN_RANGE * frame[BUSBW].max():
                axis.axhline(limit_gbps, color="black", linestyle="--", linewidth=1)
                axis.text(frame[MESSAGE_BYTES].min(), limit_gbps * 1.02, f"{limit_label} {limit_gbps:g} GB/s",
                          fontsize=8)
            elif limit_gbps:   # drawn, it would flatten every curve to the axis
                axis.text(0.02, 0.97, f"{limit_label} {limit_gbps:g} GB/s: far above this range", fontsize=8,
                          transform=axis.transAxes, va="top")
            axis.set_xscale("log", base=2)
            axis.set_title(f"{mode} mode, {count} devices", fontsize=10)
            axis.grid(True, which="both", alpha=0.3)
            if row == len(modes) - 1:
                axis.set_xlabel("message_bytes per rank")
            if col == 0:
                axis.set_ylabel("busbw (GB/s)")
    ticks = sorted(frame[MESSAGE_BYTES].unique())[::3]
    for axis in axes[-1]:
        axis.set_xticks(ticks, [format_size(int(t)) for t in ticks], rotation=30, fontsize=8)
    axes[0][0].legend(fontsize=7, loc="center left")
    figure.suptitle(title or "Collective bus bandwidth vs message size")
    figure.tight_layout()
    with atomic_output(output, "wb") as handle:
        figure.savefig(handle, format="png", dpi=110)
    plt.close(figure)


def largest_message_table(frame: pd.DataFrame, limit_gbps: float) -> str:
    """Markdown: per run, mode, collective and device count, busbw at the largest size and its share of the limit."""
    lines = ["| run | mode | collective | devices | message | Duration(us) | busbw GB/s | busbw / limit |",
             "|---|---|---|---|---|---|---|---|"]
    largest = frame[frame[MESSAGE_BYTES] == frame[MESSAGE_BYTES].max()]
    order = {op: i for i, op in enumerate(OPS)}
    largest = largest.sort_values(by=[RUN, BENCH_MODE, OP, NUM_DEVICES],
                                  key=lambda c: c.map(order) if c.name == OP else c)
    for _, row in largest.iterrows():
        lines.append(f"| {row[RUN]} | {row[BENCH_MODE]} | {row[OP]} | {row[NUM_DEVICES]} | "
                     f"{format_size(int(row[MESSAGE_BYTES]))} | {row[DURATION]:.1f} | {row[BUSBW]:.1f} | "
                     f"{row[BUSBW] / limit_gbps:.1%} |")
    return "\n".join(lines) + "\n"


def write_summary(frame: pd.DataFrame, limit_gbps: float, output: str | Path) -> None:
    write_text_atomic(output, largest_message_table(frame, limit_gbps))
