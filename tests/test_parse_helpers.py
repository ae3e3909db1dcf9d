"""Helpers shared by the parse tests (no tests here): run the CLI, read outputs, rewrite the fixture into variants."""

from __future__ import annotations

import csv
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "parse_kernel_details.py"
FIXTURE = REPO / "resources" / "profiles" / "A3_vllm0.18.0_torch2.9.0_cann8.5" / "kernel_details.csv"
PARSE_DATA = REPO / "tests" / "data" / "parse"


def run_parse(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def read_header(path: Path) -> list[str]:
    with open(path, newline="", encoding="utf-8") as handle:
        return next(csv.reader(handle))


def fixture_table() -> tuple[list[str], list[list[str]]]:
    """The real fixture as (header, rows), read with the csv module only."""
    with open(FIXTURE, newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        return header, [row for row in reader if row]


def write_table(path: Path, header: list[str], rows: list[list[str]], *, bom: bool = False,
                quote_all: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8-sig" if bom else "utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n", quoting=csv.QUOTE_ALL if quote_all else csv.QUOTE_MINIMAL)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def expected_number(value: float) -> str:
    """The documented number format, written independently of opperf: 6 decimals, trailing zeros dropped."""
    text = ("%.6f" % value).rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def expected_groups(header: list[str], rows: list[list[str]], counters: list[str]):
    """(Type, Input Shapes, Output Shapes) → statistics, computed with csv + statistics (not opperf)."""
    col = {name: i for i, name in enumerate(header)}
    groups: dict = defaultdict(lambda: {"durations": [], "counters": defaultdict(list), "first": None})
    for row in rows:
        key = (row[col["Type"]].strip(), row[col["Input Shapes"]].strip('"'), row[col["Output Shapes"]].strip('"'))
        group = groups[key]
        group["first"] = group["first"] or row
        group["durations"].append(float(row[col["Duration(us)"]]))
        for counter in counters:
            try:
                group["counters"][counter].append(float(row[col[counter]]))
            except ValueError:
                pass
    result = {}
    for key, group in groups.items():
        durations = group["durations"]
        result[key] = {
            "Profiling Average Duration(us)": expected_number(statistics.mean(durations)),
            "Profiling Median Duration(us)": expected_number(statistics.median(durations)),
            "Profiling Std Duration(us)": expected_number(statistics.pstdev(durations)),
            "Profiling Sample Count": str(len(durations)),
            **{f"Profiling Average {c}": expected_number(statistics.mean(v)) if (v := group["counters"][c]) else ""
               for c in counters},
        }
    return result


def parsed_groups(directory: Path) -> dict:
    """(Type, Input Shapes, Output Shapes) → row, over every kernel type CSV of a parsed directory."""
    result = {}
    for kernel_type in (directory / "kernel_types.txt").read_text().split():
        for row in read_csv(directory / f"{kernel_type}.csv"):
            result[(kernel_type, row["Input Shapes"], row["Output Shapes"])] = row
    return result
