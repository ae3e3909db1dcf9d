"""Parse-stage speed benchmark: our parser vs a plain csv-module parser on a 500,000-row kernel_details.csv.

The input is made by rescaling the rows of the real Ascend fixture (durations jittered, token dimensions
varied so the groups look like a serving run's), written once and reused. Each parser runs in its own
subprocess so its wall time and peak RSS (ru_maxrss of the child) are measured alone. Both outputs are
compared file by file; the table is printed and written as JSON (+ Markdown) with the machine it ran on.

    python benchmarks/parse_speed.py                 # 500,000 rows, writes benchmarks/results/parse_speed.{json,md}
    python benchmarks/parse_speed.py --rows 50000    # quicker look (results not written unless --write)
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

FIXTURE = REPO / "resources" / "profiles" / "A3_vllm0.18.0_torch2.9.0_cann8.5" / "kernel_details.csv"
RESULTS = REPO / "benchmarks" / "results"
TOKEN_COUNTS = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
                6144, 8192, 12288, 16384, 32768, 65536, 81920]


def _rescale_shapes(field: str, original_tokens: int, tokens: int) -> str:
    """Replace the token dimension (the first dim of the first slot) the way a different batch would."""
    text = field.strip('"')
    if not text or text == "N/A":
        return field
    slots = text.split(";")
    dims = slots[0].split(",")
    if dims and dims[0] == str(original_tokens):
        dims[0] = str(tokens)
        slots[0] = ",".join(dims)
    return '"' + ";".join(slots) + '"'


def make_input(path: Path, rows: int, seed: int = 0) -> None:
    """Write a `rows`-row kernel_details.csv built from the fixture's rows (same header, same quoting)."""
    with open(FIXTURE, newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        templates = [r for r in reader if r]
    index = {name: i for i, name in enumerate(header)}
    duration = index["Duration(us)"]
    inputs, outputs = index["Input Shapes"], index["Output Shapes"]
    # Times and cycle counts grow with the work; ratios and utilisations only wobble.
    extensive = [i for i, name in enumerate(header) if name.endswith(("(us)", "cycles"))
                 and name not in ("Start Time(us)", "Duration(us)", "Wait Time(us)")]
    intensive = [i for i, name in enumerate(header) if name.endswith(("ratio", "rate", "(%)"))]
    rng = random.Random(seed)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(header)
        for n in range(rows):
            row = list(templates[n % len(templates)])
            first_dim = row[inputs].strip('"').split(",")[0]
            tokens = rng.choice(TOKEN_COUNTS)
            if first_dim.isdigit():
                scale = tokens / int(first_dim)
                row[inputs] = _rescale_shapes(row[inputs], int(first_dim), tokens)
                row[outputs] = _rescale_shapes(row[outputs], int(first_dim), tokens)
            else:
                scale = 1.0
            jitter = rng.uniform(0.95, 1.05)
            growth = jitter * max(scale, 0.01)
            row[duration] = f"{float(row[duration]) * growth:.3f}"
            for columns, factor in ((extensive, growth), (intensive, jitter)):
                for i in columns:
                    try:
                        row[i] = f"{float(row[i]) * factor:.3f}"
                    except ValueError:
                        pass
            writer.writerow(row)
    os.replace(tmp, path)


# --- the baseline: the peer's approach (csv.DictReader, dict of lists, statistics) ------------------------


def baseline_parse(source: Path, out_dir: Path) -> None:
    """A plain csv-module parser producing the same files as ours (same grouping, statistics, formatting)."""
    from opperf.contract import BASE_COLUMNS, PROFILING_AVERAGE, PROFILING_MEDIAN, PROFILING_STD, \
        PROFILING_SAMPLE_COUNT, SOURCE, SOURCE_PROFILED, normalise_kernel_type, order_columns, \
        profiling_counter_column, strip_profiler_quotes
    from opperf.parse.aggregate import format_number, BOOKKEEPING_COLUMNS, canonical_names_field

    groups: dict = {}
    counters: list[str] = []
    with open(source, newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        counters = [c for c in reader.fieldnames if c not in BOOKKEEPING_COLUMNS and c not in BASE_COLUMNS]
        for row in reader:
            kernel_type = normalise_kernel_type(row["Type"])
            in_shapes = strip_profiler_quotes(row["Input Shapes"])
            out_shapes = strip_profiler_quotes(row["Output Shapes"])
            if in_shapes.upper() == "N/A" or out_shapes.upper() == "N/A":
                continue
            key = (kernel_type, in_shapes, out_shapes)
            group = groups.get(key)
            if group is None:
                group = groups[key] = {"first": row, "durations": [], "counters": defaultdict(list)}
            group["durations"].append(float(row["Duration(us)"]))
            for counter in counters:
                try:
                    group["counters"][counter].append(float(row[counter]))
                except ValueError:
                    pass
    by_type: dict[str, list[dict]] = defaultdict(list)
    for (kernel_type, in_shapes, out_shapes), group in groups.items():
        first = group["first"]
        durations = group["durations"]
        record = {column: strip_profiler_quotes(first.get(column, "")) for column in BASE_COLUMNS}
        record["Input Shapes"], record["Output Shapes"] = in_shapes, out_shapes
        for column in ("Input Data Types", "Output Data Types", "Input Formats", "Output Formats"):
            record[column] = canonical_names_field(record[column], column)
        record[PROFILING_AVERAGE] = format_number(statistics.mean(durations))
        record[PROFILING_MEDIAN] = format_number(statistics.median(durations))
        record[PROFILING_STD] = format_number(statistics.pstdev(durations))
        for counter in counters:
            values = group["counters"].get(counter)
            record[profiling_counter_column(counter)] = format_number(statistics.mean(values)) if values else ""
        record[SOURCE] = SOURCE_PROFILED
        record[PROFILING_SAMPLE_COUNT] = str(len(durations))
        by_type[kernel_type].append(record)
    out_dir.mkdir(parents=True, exist_ok=True)
    for kernel_type, records in by_type.items():
        columns = order_columns(records[0].keys())
        with open(out_dir / f"{kernel_type}.csv", "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns, lineterminator="\n")
            writer.writeheader()
            writer.writerows(records)
    (out_dir / "kernel_types.txt").write_text("".join(f"{t}\n" for t in sorted(by_type)))
