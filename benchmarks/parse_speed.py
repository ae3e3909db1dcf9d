"""Parse-stage speed benchmark: our parser vs a plain csv-module parser on a 500,000-row kernel_details.csv.

The input is made by rescaling the rows of the real Ascend fixture (durations jittered, token dimensions
varied so the groups look like a serving run's), written once and reused. Each parser runs in its own
subprocess so its wall time and peak RSS (ru_maxrss of the child) are measured alone. Both outputs are
compared file by file; the table is printed and written as JSON (+ Markdown) with the machine it ran on.

    python benchmarks/parse_speed.py                 # 500,000 rows, writes benchmarks/results/parse_speed/{parse_speed.json,README.md}
    python benchmarks/parse_speed.py --rows 50000    # quicker look (results not written unless --write)
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import random
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
RESULTS = REPO / "benchmarks" / "results" / "parse_speed"
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
    from opperf.contract import canonical_field
    from opperf.parse.aggregate import BOOKKEEPING_COLUMNS
    from opperf.stats import format_number

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
            record[column] = canonical_field(column, record[column])
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


# --- measuring ----------------------------------------------------------------------------------------------


def _measure(command: list[str]) -> dict:
    """Run one command as a child; its wall time and its own peak RSS (os.wait4 gives that child's rusage)."""
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    _, status, usage = os.wait4(child.pid, 0)
    wall_s = time.perf_counter() - start
    _, stderr = child.stdout.read().decode(), child.stderr.read().decode()
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({child.returncode}):\n{stderr}")
    return {"wall_s": round(wall_s, 3), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "user_s": round(usage.ru_utime, 3), "system_s": round(usage.ru_stime, 3)}


def _numeric(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def compare_outputs(ours: Path, baseline: Path) -> dict:
    """Same files, columns and rows; text fields equal; numbers equal or 1e-6 apart (summation order)."""
    names = sorted(p.name for p in ours.iterdir())
    if names != sorted(p.name for p in baseline.iterdir()):
        return {"same": False, "why": f"file sets differ: {names} vs {sorted(p.name for p in baseline.iterdir())}"}
    fields = identical = last_digit = 0
    for name in names:
        if not name.endswith(".csv"):
            if (ours / name).read_bytes() != (baseline / name).read_bytes():
                return {"same": False, "why": f"{name} differs"}
            continue
        with open(ours / name, newline="") as a, open(baseline / name, newline="") as b:
            rows_a, rows_b = list(csv.reader(a)), list(csv.reader(b))
        if len(rows_a) != len(rows_b) or rows_a[0] != rows_b[0]:
            return {"same": False, "why": f"{name}: header or row count differs"}
        for row_a, row_b in zip(rows_a[1:], rows_b[1:]):
            for x, y in zip(row_a, row_b):
                fields += 1
                if x == y:
                    identical += 1
                    continue
                nx, ny = _numeric(x), _numeric(y)
                if nx is None or ny is None or abs(nx - ny) > 1.01e-6 * max(1.0, abs(ny) / 1e6):
                    return {"same": False, "why": f"{name}: {x!r} vs {y!r}"}
                last_digit += 1
    return {"same": True, "files": len(names), "fields": fields, "identical_fields": identical,
            "last_digit_differences": last_digit}


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal"))
    import polars

    return {"nproc": os.cpu_count(), "cpu": cpu, "ram_gb": round(mem_kb / 1024 / 1024, 1),
            "python": platform.python_version(), "polars": polars.__version__,
            "load_average_before": [round(x, 2) for x in os.getloadavg()]}


def render_markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"# Parse speed: {result['rows']:,}-row kernel_details.csv ({result['input_mb']} MB)", "",
             f"Measured {result['date']} on {m['nproc']} CPU cores ({m['cpu']}), {m['ram_gb']} GB RAM, "
             f"Python {m['python']}, polars {m['polars']}; load average before: {m['load_average_before']}.",
             "Each parser runs as its own process (interpreter start and imports included); peak RSS is that "
             "process's ru_maxrss. Command: `python benchmarks/parse_speed.py`.", "",
             "| parser | run | wall (s) | peak RSS (MB) | user CPU (s) |", "|---|---|---|---|---|"]
    for name, runs in result["runs"].items():
        for i, run in enumerate(runs, start=1):
            lines.append(f"| {name} | {i} | {run['wall_s']} | {run['peak_rss_mb']} | {run['user_s']} |")
    lines += ["", f"Target: at most {result['target']['wall_s']} s wall and {result['target']['peak_rss_mb']} MB peak "
              f"(ours, median of runs: {result['ours_median_wall_s']} s, max peak {result['ours_max_peak_rss_mb']} MB: "
              f"{'met' if result['target_met'] else 'NOT met'}).", ""]
    same = result["same_output"]
    if same.get("same"):
        lines.append(f"Outputs: same {same['files']} files; {same['identical_fields']} of {same['fields']} fields "
                     f"byte-identical" + (f", {same['last_digit_differences']} differ in the 6th decimal only (sums "
                     "in another order)." if same["last_digit_differences"] else "."))
    else:
        lines.append(f"Outputs differ: {same.get('why')}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=500_000, help="rows of the generated input (default 500000)")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/opperf_parse_speed"),
                        help="where the input and the outputs go (default: /tmp/opperf_parse_speed)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of our parser (default 3)")
    parser.add_argument("--skip-baseline", action="store_true", help="do not run the csv-module baseline")
    parser.add_argument("--write", action="store_true",
                        help="write benchmarks/results/parse_speed/ (default: only for 500000 rows)")
    parser.add_argument("--baseline-child", nargs=2, metavar=("INPUT", "OUTPUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.baseline_child:
        baseline_parse(Path(args.baseline_child[0]), Path(args.baseline_child[1]))
        return 0
    args.work_dir.mkdir(parents=True, exist_ok=True)
    source = args.work_dir / f"kernel_details_{args.rows}.csv"
    if not source.exists():
        print(f"generating {source} ...", flush=True)
        make_input(source, args.rows)
    input_mb = round(source.stat().st_size / 1e6, 1)
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": args.rows, "input_mb": input_mb,
              "machine": machine(), "target": {"wall_s": 2.0, "peak_rss_mb": 600}, "runs": {}}
    ours_out = args.work_dir / "ours"
    runs = []
    for _ in range(args.repeat):
        shutil.rmtree(ours_out, ignore_errors=True)
        runs.append(_measure([sys.executable, "scripts/parse_kernel_details.py", "--profiling-path", str(source),
                              "--database-path", str(ours_out), "--log-level", "warning"]))
    result["runs"]["opperf (polars + numpy)"] = runs
    result["ours_median_wall_s"] = statistics.median(r["wall_s"] for r in runs)
    result["ours_max_peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    result["target_met"] = (result["ours_median_wall_s"] <= result["target"]["wall_s"]
                            and result["ours_max_peak_rss_mb"] <= result["target"]["peak_rss_mb"])
    if not args.skip_baseline:
        baseline_out = args.work_dir / "baseline"
        shutil.rmtree(baseline_out, ignore_errors=True)
        result["runs"]["csv module baseline (peer's approach)"] = [_measure(
            [sys.executable, "benchmarks/parse_speed.py", "--baseline-child", str(source), str(baseline_out)])]
        result["same_output"] = compare_outputs(ours_out, baseline_out)
    else:
        result["same_output"] = {"same": None, "why": "baseline skipped"}
    table = render_markdown(result)
    print(table)
    if args.write or args.rows == 500_000:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "parse_speed.json").write_text(json.dumps(result, indent=2) + "\n")
        (RESULTS / "README.md").write_text(table)
        print(f"wrote {RESULTS / 'parse_speed.json'} and {RESULTS / 'README.md'}")
    return 0 if result["same_output"].get("same") is not False else 1


if __name__ == "__main__":
    sys.exit(main())
