"""Database rows replayed one at a time under a probe's own cache state, through the replay stage's own code
(opperf.replay.engine: the row's recipe, its output check, CUPTI kernel time): what the probes beside this file
(small_kernel_probe.py, strided_view_probe.py) share."""

from __future__ import annotations

import csv
import datetime
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from opperf import contract  # noqa: E402
from opperf.replay.definitions import DEFAULT_DEFINITIONS_DIR  # noqa: E402
from opperf.replay.engine import STATUS_OK, RowOutcome, measure_prepared, prepare_row  # noqa: E402
from opperf.replay.job import find_definition, recipe_for  # noqa: E402
from opperf.replay.timing import CacheState, CudaTimer  # noqa: E402


def time_rows(rows: Iterable[tuple[str, int, dict, dict]], make_cache: Callable[[CudaTimer], CacheState],
              variant: str, repeat_count: int, recipes: dict, results: list, failures: list,
              batch: int = 64) -> None:
    """Replay each (kernel type, line, row, meta) on cuda with `make_cache(timer)` as the cache state; append
    meta + {variant, replay_us, ratio to meta's profiled_us, method} to `results`, or a line to `failures`."""
    timer = CudaTimer("cuda", power_policy="cooldown")
    timer.cache = make_cache(timer)
    started, pending = time.monotonic(), []

    def collect():
        timings = timer.collect()
        for prepared, key, meta in pending:
            outcome = prepared.outcome(timings.get(key))
            if outcome.status == STATUS_OK:
                replay = float(outcome.columns[contract.REPLAY_AVERAGE])
                results.append({**meta, "variant": variant, "replay_us": replay,
                                "ratio": replay / meta["profiled_us"],
                                "method": outcome.columns.get(contract.REPLAY_TIMING_METHOD, "")})
            else:
                failures.append(f"{variant} {meta['type']}:{meta['line']} {outcome.status} {outcome.error}")
        pending.clear()

    done = 0
    for key, (kernel_type, line, row, meta) in enumerate(rows):
        if kernel_type not in recipes:
            recipes[kernel_type] = recipe_for(kernel_type, "cuda", find_definition(
                kernel_type, "cuda", DEFAULT_DEFINITIONS_DIR))
        if recipes[kernel_type] is None:
            continue
        prepared = prepare_row(recipes[kernel_type], row, backend="cuda", device="cuda", timer=timer, line=line)
        failed = prepared if isinstance(prepared, RowOutcome) else measure_prepared(
            prepared, timer, key, repeat_count=repeat_count, warmup_count=3)
        if failed is not None:
            failures.append(f"{variant} {kernel_type}:{line} {failed.status} {failed.error}")
            continue
        pending.append((prepared, key, {**meta, "type": kernel_type, "line": line}))
        done += 1
        if len(pending) >= batch:
            collect()
    collect()
    print(f"{variant}: {done} rows in {time.monotonic() - started:.0f} s", flush=True)


def ratio_summary(selected: list[dict]) -> dict:
    """Rows, median replay/profiled ratio, median and largest gap of the results `selected`."""
    ratios = [r["ratio"] for r in selected]
    return {"rows": len(ratios), "median_ratio": statistics.median(ratios) if ratios else None,
            "median_gap": statistics.median(abs(1 - x) for x in ratios) if ratios else None,
            "max_gap": max((abs(1 - x) for x in ratios), default=None)}


def write_result(output: str | Path, script: str, summary: dict, rows: list[dict]) -> Path:
    """<output>/<device>.json: the device, torch, date, command line, the summary and every row's result."""
    import torch

    device = torch.cuda.get_device_name()
    path = Path(output) / f"{device.replace(' ', '_')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"device": device, "torch": torch.__version__, "date": datetime.date.today().isoformat(),
                                "command": f"python benchmarks/{script} " + " ".join(sys.argv[1:]),
                                "summary": summary, "rows": rows}, indent=1) + "\n")
    print(f"wrote {path}")
    return path


def profiled_rows(db_dirs: Iterable[str | Path]):
    """(database, kernel type, line, row, profiled mean µs) of every row of the databases' CSVs with a profiled
    mean."""
    for db in db_dirs:
        for path in sorted(Path(db).glob("*.csv")):
            with path.open(newline="") as handle:
                for line, row in enumerate(csv.DictReader(handle), start=2):
                    try:
                        profiled = float(row.get(contract.PROFILING_AVERAGE) or "nan")
                    except ValueError:
                        continue
                    if profiled == profiled:
                        yield Path(db), path.stem, line, row, profiled
