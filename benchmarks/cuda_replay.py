#!/usr/bin/env python
"""Replay accuracy, repeatability and throughput on a CUDA GPU, through the workflow's own stages.

For each workload, on this host's GPU: a dense and a MoE model of config/models.yaml run by the reference
decoder (`source: reference`), and real framework models, HuggingFace transformers causal LMs built from the
config.json files under benchmarks/workloads/ (`source: transformers`; random weights, nothing downloaded;
models that are not in config/models.yaml, dense and MoE of different expert counts and top-k). A few layers,
prefill and decode over a KV cache:

  1. profile    scripts/profile_workload.py --backend cuda (torch.profiler, CUPTI kernel times)
  2. parse      scripts/parse_kernel_details.py → data/{device}/torch/{version_dir}/{Type}.csv
  3. replay     scripts/replay.py --database-path (a copy of the parsed database per cache policy,
                plus a second, independent replay under the default policy for repeatability)
  4. phase      scripts/phase_replay.py --apply-to each replayed database: the workload's calls replayed in its
                own order, three passes (each call's warm inputs rewritten into L2 before it), and folded into
                the rows, as the workflow's stage 4b does with its defaults (`--no-phase`: the rows as replayed
                one at a time)
  5. fixed cost scripts/replay.py --rows on a one-row CSV, three times (a warm machine's per-job cost)

and writes `cuda_replay.json` and `cuda_replay.md` in --output: per policy the median / p90 /
time-weighted gap between each profiled row's replay and its in-workload time (overall and per
kernel type), repeatability, rows/s at the repeat count and the share of replay time spent inside
measured kernels, the worst rows with their shapes, and device, driver, CUDA, torch and date.

Gap of a row: |1 - replay / profiled|, replay = `Average Duration(us)` (mean of the timed calls),
profiled = `Profiling Average Duration(us)` (mean over the workload's calls of that signature).
Time-weighted gap: sum |replay - profiled| x calls / sum profiled x calls (calls = Profiling Sample Count).

The JSON's top-level `workloads` list has one entry per workload: `name`, `source`, `rows` (profiled rows),
`profiled_time_replayed` (share of the profiled rows' time, Σ mean × calls, whose rows replayed `ok`),
`trace_time_attributed` (share of the trace's device time the parse put into rows, trace_attribution.json),
`median_gap`, `p90_gap`, `time_weighted_gap` (default policy), `schema_rows` / `schema_median_gap` (rows replayed
from their op's schema, no definition), `cat_rows` / `cat_median_gap` / `cat_max_gap`, and `unseen` (true: the
workload played no part in developing the replay code, issue 18), `large_elementwise_rows` / `_ratio` (median
replay/profiled of the elementwise rows of 20 µs or more), `repeatability_median` (the workload's two replays) and
`gates` (issue 18's acceptance: TARGETS, per-type medians, the large elementwise ratio; each value, target and
whether it is met; `policy_gates` has the same under every other cache policy replayed). `power_state` splits the
default policy's rows by the SM clock the workload ran them at (`power_state_split`): how much of the time-weighted
gap comes from rows the workload ran throttled; each workload's `profile_clock_event_reasons` says why, by NVML's
clock-event reasons over the profile's throttled samples (opperf.power_samples.reason_shares), and its
`phase_replay` what stage 4b did (rows replayed in the profile's order, rows folded in, their in-order time over
profiled; null when the stage did not run). A transformers
trace is parsed without its workload.json (renamed workload_info.json), as a user's trace comes.

Stages can run separately (`--stages profile parse` on one call, `--stages replay report` on a later
one with the same --work-dir), so the whole benchmark fits machines held for a few minutes at a time.
`--backend cpu` runs every code path on a CPU host with tiny configs (tests/data/workload/) and a short plan:
a smoke test of the benchmark itself, not a measurement.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opperf import contract  # noqa: E402
from opperf.model_names import config_model_name  # noqa: E402
from opperf.power_samples import OLD_SAMPLE_FIELDS, POWER_SAMPLES, THROTTLED_MHZ, reason_shares  # noqa: E402
from opperf.replay.phase_table import PHASE_CALLS, PHASE_METHOD, applied_time_ratio, read_phase_table  # noqa: E402
from opperf.replay.methods import CACHE_POLICY, DEFAULT_HEATER_MIN_POWER_W, POWER_POLICY  # noqa: E402

DEFAULT_CACHE_POLICY = CACHE_POLICY      # replay's one cache state since issue 42 (flush and none were removed)

@dataclass(frozen=True)
class Workload:
    """What one workload runs: the reference decoder at a model's dims, or a transformers config."""

    source: str                     # reference | transformers
    model: str                      # config/models.yaml name, or a config.json path (repository-relative)
    layers: int
    prefill_lengths: tuple[int, ...]
    decode_batch_sizes: tuple[int, ...]
    decode_context: int
    decode_steps: int
    unseen: bool                    # never used while developing the replay code (issue 18)


WORKLOADS = {
    "dense": Workload("reference", "Qwen3-32B", 2, (128, 512, 2048, 4096), (1, 8, 64), 1024, 2, False),
    # Routing gives each expert its own token count, so every forward adds ~100 distinct expert GEMM shapes:
    # fewer forwards keep the MoE database near 1,000 rows.
    "moe": Workload("reference", "Qwen3-235B-A22B", 2, (128, 1024, 4096), (1, 16, 64), 256, 2, False),
    "hf_mistral": Workload("transformers", "benchmarks/workloads/mistral_7b.json", 2, (128, 512, 2048),
                           (1, 16, 64), 512, 2, True),
    "hf_mixtral_8x2": Workload("transformers", "benchmarks/workloads/mixtral_8x7b.json", 2, (128, 512, 2048),
                               (1, 16, 64), 512, 2, True),
    "hf_qwen2_moe_60x4": Workload("transformers", "benchmarks/workloads/qwen2_moe_a2_7b.json", 2, (128, 512, 2048),
                                  (1, 16, 64), 512, 2, True),
    "hf_olmoe_64x8": Workload("transformers", "benchmarks/workloads/olmoe_1b_7b.json", 2, (128, 512, 2048),
                              (1, 16, 64), 512, 2, True),
    # Architectures no replay code was looked at with (issue 18): fused qkv/gate_up projections, and multi-head
    # latent attention with a dense first layer, shared experts and top-6 routing.
    "hf_phi3_mini": Workload("transformers", "benchmarks/workloads/phi3_mini.json", 2, (128, 512, 2048),
                             (1, 16, 64), 512, 2, True),
    "hf_deepseek_v2_lite": Workload("transformers", "benchmarks/workloads/deepseek_v2_lite.json", 2,
                                    (128, 512, 2048), (1, 16, 64), 512, 2, True),
}
# --backend cpu: the same code paths at toy sizes (a smoke test of this script on a host without a GPU).
SMOKE_WORKLOADS = {
    "dense": Workload("reference", "opperf-tiny", 2, (16,), (2,), 16, 1, False),
    "hf_mistral": Workload("transformers", "tests/data/workload/tiny_mistral.json", 2, (16,), (2,), 16, 1, True),
    "hf_mixtral_8x2": Workload("transformers", "tests/data/workload/tiny_mixtral.json", 2, (16,), (2,), 16, 1, True),
    "hf_qwen2_moe_60x4": Workload("transformers", "tests/data/workload/tiny_qwen2_moe.json", 2, (16,), (2,), 16, 1,
                                  True),
}
STAGES = ("profile", "parse", "replay", "phase", "fixed", "report")
PHASE_TABLE = "phase_replay.csv"          # scripts/phase_replay.py's table, beside a run's database
ENVIRONMENT_FILE = "environment.json"     # written on the GPU host, so the report can be made anywhere
REPEAT_RUN = f"{DEFAULT_CACHE_POLICY}-repeat"


def config_workloads(paths: list[Path], smoke: bool) -> dict[str, Workload]:
    """Each transformers config.json named (a file, or a directory's *.json), under the name predictions give it
    (`hf_<file stem>`, or `hf_<folder>` for a checkpoint's config.json: config_model_name), planned as the
    back end's transformers workloads are (hf_mistral's plan; the smoke plan on cpu), with the config's own layer
    count (a hybrid model needs its attention layer)."""
    template = (SMOKE_WORKLOADS if smoke else WORKLOADS)["hf_mistral"]
    files = [f for path in paths for f in (sorted(path.glob("*.json")) if path.is_dir() else [path])]
    workloads = {}
    for path in files:
        layers = int(json.loads(path.read_text(encoding="utf-8")).get("num_hidden_layers") or template.layers)
        model = str(path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path.resolve())
        workloads[config_model_name(path)] = replace(template, model=model, layers=layers, unseen=True)
    return workloads


def run(command: list[str], log_path: Path) -> float:
    """Run one stage's script; its output goes to log_path; returns wall seconds (raises on failure)."""
    began = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        completed = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
    elapsed = time.perf_counter() - began
    if completed.returncode != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise SystemExit(f"{' '.join(command)} failed ({completed.returncode}):\n{tail}")
    return elapsed


def environment(backend: str) -> dict:
    import torch

    if backend == "cpu":
        return {"device": f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
                "nvidia_smi": "-", "version_dir": version_dir(backend), "l2_cache_bytes": 0, "sm_count": 0,
                "torch": torch.__version__, "cuda": None, "python": platform.python_version(),
                "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "smoke_test": True}
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True)
    properties = torch.cuda.get_device_properties(0)
    return {"device": torch.cuda.get_device_name(0), "nvidia_smi": smi.stdout.strip(), "version_dir": version_dir(backend),
            "l2_cache_bytes": int(properties.L2_cache_size), "sm_count": properties.multi_processor_count,
            "transformers": _version_of("transformers"),
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


def version_dir(backend: str) -> str:
    from opperf.versions import workload_version_dir

    return workload_version_dir(backend)


def _version_of(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def database_dir(work: Path, workload: str, run_name: str, args) -> Path:
    return work / workload / run_name / "data" / args.device / "torch" / args.version_dir


def stage_profile(work: Path, args) -> dict:
    timings = {}
    for name in args.workloads:
        workload = args.catalog[name]
        out = work / name / "profile"
        (work / name).mkdir(parents=True, exist_ok=True)
        model = (["--transformers-config", str(ROOT / workload.model)] if workload.source == "transformers"
                 else ["--model", workload.model])
        command = [sys.executable, "scripts/profile_workload.py", "--backend", args.backend, "--dtype", args.dtype,
                   *model, "--num-layers", str(workload.layers),
                   "--prefill-lengths", *map(str, workload.prefill_lengths),
                   "--decode-batch-sizes", *map(str, workload.decode_batch_sizes),
                   "--decode-context", str(workload.decode_context), "--decode-steps", str(workload.decode_steps),
                   "--profile-iterations", str(args.profile_iterations), "--output", str(out)]
        timings[name] = run(command, work / name / "profile.log")
        if workload.source == "transformers":
            # A user's trace comes without our workload.json: the parse must infer what it would have said.
            (out / contract.WORKLOAD_MANIFEST).rename(out / "workload_info.json")
    return timings


def stage_parse(work: Path, args) -> dict:
    timings = {}
    for name in args.workloads:
        target = database_dir(work, name, "parsed", args)
        command = [sys.executable, "scripts/parse_kernel_details.py", "--profiling-path",
                   str(work / name / "profile" / "trace.json"), "--database-path", str(target)]
        timings[name] = run(command, work / name / "parse.log")
    return timings


def replay_runs(args) -> list[str]:
    """Each cache policy, then (unless --no-repeat) a second replay under the default policy with another seed."""
    return [*args.policies, *([REPEAT_RUN] if args.repeat else [])]


def runs_to_replay(args) -> list[str]:
    """The runs this call replays: all, or those named by --replay-runs (a workload too long for one call of the
    device tool replays `insitu` in one call and `insitu-repeat` in the next, on the same work directory; the
    report reads every run's database there)."""
    return [run for run in replay_runs(args) if not args.replay_runs or run in args.replay_runs]


def stage_replay(work: Path, args) -> dict:
    timings = {}
    for name in args.workloads:
        parsed = database_dir(work, name, "parsed", args)
        for run_name in runs_to_replay(args):
            target = database_dir(work, name, run_name, args)
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(parsed, target)
            command = [sys.executable, "scripts/replay.py", "--database-path", str(target), "--backend", args.backend,
                       "--device", args.device, "--repeat-count", str(args.repeat_count),
                       "--seed", str(1 if run_name == REPEAT_RUN else 0),
                       "--heater-min-power", str(args.heater_min_power),
                       "--reports-dir", str(work / name / run_name / "reports")]
            timings[f"{name}/{run_name}"] = run(command, work / name / f"replay_{run_name}.log")
    return timings


def stage_phase(work: Path, args) -> dict:
    """Stage 4b on every replayed run of every workload: its calls replayed in order and folded into its rows in
    place."""
    timings = {}
    for name in args.workloads:
        for run_name in runs_to_replay(args):
            target = database_dir(work, name, run_name, args)
            command = [sys.executable, "scripts/phase_replay.py", "--profiling-path",
                       str(work / name / "profile" / "trace.json"), "--rows", str(target),
                       "--output", str(work / name / run_name / PHASE_TABLE), "--apply-to", str(target),
                       "--device", "cuda" if args.backend == "cuda" else "cpu",
                       *(["--iterations", str(args.phase_iterations)] if args.phase_iterations else []),
                       *(["--cold-copies"] if args.phase_cold_copies else [])]
            timings[f"{name}/{run_name}"] = run(command, work / name / f"phase_{run_name}.log")
    return timings


def phase_summary(work: Path, name: str, args) -> dict | None:
    """What stage 4b did for a workload's default run: rows in its phases, rows folded in, their in-phase time
    over their profiled time (None: the stage did not run)."""
    path = work / name / DEFAULT_CACHE_POLICY / PHASE_TABLE
    if not path.exists():
        return None
    table = read_phase_table(path)
    applied, ratio = applied_time_ratio(table)
    return {"rows": len(table), "rows_applied": applied, "calls": int(table[PHASE_CALLS].astype(int).sum()),
            "method": table[PHASE_METHOD].iloc[0] if len(table) else None, "time_ratio": ratio}


def stage_fixed(work: Path, args) -> dict:
    """A one-row job's wall time minus its row's own replay time, three times (the per-job fixed cost)."""
    name = args.workloads[0]
    parsed = database_dir(work, name, "parsed", args)
    source = parsed / "mul.csv" if (parsed / "mul.csv").exists() else sorted(parsed.glob("*.csv"))[0]
    with open(source, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        first = next(reader)
        fields = reader.fieldnames
    one_row = work / "fixed" / source.name
    one_row.parent.mkdir(parents=True, exist_ok=True)
    with open(one_row, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerow(first)
    walls = []
    for attempt in range(3):
        output = work / "fixed" / f"out_{attempt}.csv"
        command = [sys.executable, "scripts/replay.py", "--rows", str(one_row), "--kernel", source.stem,
                   "--definitions", "config/kernels", "--backend", args.backend, "--version-dir", args.version_dir,
                   "--output", str(output), "--repeat-count", str(args.repeat_count)]
        wall = run(command, work / "fixed" / f"replay_{attempt}.log")
        with open(output, newline="", encoding="utf-8") as handle:
            row = next(csv.DictReader(handle))
        kernel_s = float(row[contract.REPLAY_AVERAGE] or 0) * (args.repeat_count + 3) / 1e6
        walls.append({"wall_s": round(wall, 3), "row_kernel_s": round(kernel_s, 6),
                      "log": _child_stats(work / "fixed" / f"replay_{attempt}.log")})
    return {"kernel_type": source.stem, "runs": walls,
            "fixed_cost_s_median": round(statistics.median(w["wall_s"] - w["row_kernel_s"] for w in walls), 3)}


_STATS_RE = re.compile(r"imports ([\d.]+) s, setup ([\d.]+) s, (\d+) rows in ([\d.]+) s "
                       r"\(of which collecting samples ([\d.]+) s\)")


def _child_stats(log_path: Path) -> list[dict]:
    text = log_path.read_text(encoding="utf-8", errors="replace")
    return [{"import_s": float(m[0]), "setup_s": float(m[1]), "rows": int(m[2]), "rows_s": float(m[3]),
             "collect_s": float(m[4])} for m in _STATS_RE.findall(text)]


def _number(value: str | None) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


def read_rows(database: Path) -> list[dict]:
    rows = []
    for path in sorted(database.glob("*.csv")):
        with open(path, newline="", encoding="utf-8") as handle:
            for line, row in enumerate(csv.DictReader(handle), start=2):
                row["_type"], row["_line"] = path.stem, line
                rows.append(row)
    return rows


def replayed_rows(workload_dir: Path, policy: str) -> list[dict]:
    """The rows of one workload's database replayed under `policy` (`<workload_dir>/<policy>/data/<device>/torch/
    <version>/*.csv`, as the replay stage and benchmarks/lib/chain_run.sh leave them); [] when there is none."""
    return [row for directory in sorted(workload_dir.glob(f"{policy}/data/*/*/*")) for row in read_rows(directory)]


def unpacked(path: Path, scratch: Path) -> Path:
    """A directory of replayed databases: `path` itself, or the .tar.gz it names unpacked into `scratch`."""
    if path.is_dir():
        return path
    with tarfile.open(path) as archive:
        archive.extractall(scratch, filter="data")
    return scratch


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def gap_summary(pairs: list[tuple[float, float, int]]) -> dict:
    """pairs: (replay µs, profiled µs, profiled calls)."""
    gaps = [abs(1 - r / p) for r, p, _ in pairs]
    weighted = (sum(abs(r - p) * n for r, p, n in pairs) / sum(p * n for _, p, n in pairs)) if pairs else None
    return {"rows": len(pairs), "median_gap": quantile(gaps, 0.5), "p90_gap": quantile(gaps, 0.9),
            "time_weighted_gap": weighted,
            "median_ratio": quantile([r / p for r, p, _ in pairs], 0.5),
            "profiled_time_share": sum(p * n for _, p, n in pairs)}


# Issue 18's acceptance, per workload and device: the headline gaps, repeatability, the median gap of every kernel
# type with at least TYPE_SHARE of the workload's time, and the median replay/profiled of its large elementwise rows.
TARGETS = {"median_gap": 0.03, "p90_gap": 0.12, "time_weighted_gap": 0.03, "repeatability_median": 0.01}
TYPE_SHARE, TYPE_MEDIAN_GAP = 0.01, 0.05
LARGE_ROW_US, LARGE_RATIO = 20.0, (0.97, 1.03)
# Memory-bound TensorIterator kernels (and the copies and concatenations that behave like them): the rows whose
# in-workload time the GPU's power and clock state moves most (benchmarks/results/cuda_replay/README.md,
# "The remaining error, by cause").
ELEMENTWISE_TYPES = frozenset(
    "abs add add_ bitwise_and bitwise_not bitwise_or cat clamp clamp_ clone copy_ cos div div_ eq exp fill_ ge gelu "
    "gt le lt masked_fill masked_fill_ maximum minimum mul mul_ ne neg pow reciprocal relu rsqrt sigmoid silu sin "
    "sqrt sub sub_ tanh where _to_copy".split())


def large_elementwise(rows: list[dict]) -> dict:
    """Median replay/profiled of the elementwise rows whose in-workload mean is at least LARGE_ROW_US."""
    ratios = [_number(r.get(contract.REPLAY_AVERAGE)) / _number(r.get(contract.PROFILING_AVERAGE)) for r in rows
              if r["_type"] in ELEMENTWISE_TYPES and _number(r.get(contract.REPLAY_AVERAGE))
              and (_number(r.get(contract.PROFILING_AVERAGE)) or 0) >= LARGE_ROW_US]
    return {"large_elementwise_rows": len(ratios), "large_elementwise_ratio": quantile(ratios, 0.5)}


def gates(entry: dict, per_type: dict) -> dict:
    """Issue 18's gates for one workload's entry (with `repeatability_median` and `large_elementwise_ratio`) and its
    per-type summary: {gate: {"value", "target", "met"}}, `met` None where the value is missing."""
    result = {name: {"value": entry.get(name), "target": target,
                     "met": None if entry.get(name) is None else entry[name] <= target}
              for name, target in TARGETS.items()}
    over = {name: t["median_gap"] for name, t in per_type.items()
            if t["profiled_time_share"] >= TYPE_SHARE and (t["median_gap"] or 0) > TYPE_MEDIAN_GAP}
    result["type_median_gap"] = {"value": over, "target": TYPE_MEDIAN_GAP, "met": not over}
    ratio = entry.get("large_elementwise_ratio")
    result["large_elementwise_ratio"] = {"value": ratio, "target": list(LARGE_RATIO),
                                         "met": None if ratio is None else LARGE_RATIO[0] <= ratio <= LARGE_RATIO[1]}
    return result


def gap_pair(row: dict) -> tuple[float, float, int] | None:
    """(replay µs, profiled µs, profiled calls) of a row with both times, else None: what gap_summary takes."""
    replay, profiled = _number(row.get(contract.REPLAY_AVERAGE)), _number(row.get(contract.PROFILING_AVERAGE))
    if replay is None or profiled is None:
        return None
    return replay, profiled, int(float(row.get(contract.PROFILING_SAMPLE_COUNT) or 1))


def analyse_run(rows: list[dict]) -> dict:
    pairs, per_type, statuses, worst = [], {}, {}, []
    for row in rows:
        statuses[row.get(contract.REPLAY_STATUS, "")] = statuses.get(row.get(contract.REPLAY_STATUS, ""), 0) + 1
        pair = gap_pair(row)
        if pair is None:
            continue
        replay, profiled, calls = pair
        pairs.append(pair)
        per_type.setdefault(row["_type"], []).append((replay, profiled, calls))
        worst.append({"type": row["_type"], "line": row["_line"], "replay_us": replay, "profiled_us": profiled,
                      "ratio": replay / profiled, "calls": calls, "shapes": row.get(contract.INPUT_SHAPES, ""),
                      "strides": row.get(contract.INPUT_STRIDES, ""), "dtypes": row.get(contract.INPUT_DTYPES, ""),
                      "cache": row.get(contract.REPLAY_L2_POLICY, "")})
    total_time = sum(p * n for _, p, n in pairs) or 1.0
    summary = gap_summary(pairs)
    types = {}
    for name, type_pairs in sorted(per_type.items()):
        types[name] = gap_summary(type_pairs)
        types[name]["profiled_time_share"] /= total_time
    summary["profiled_time_share"] = 1.0
    worst.sort(key=lambda w: -abs(1 - w["ratio"]) * w["profiled_us"] * w["calls"])
    return {**summary, "statuses": statuses, "per_type": types, "worst_rows": worst[:25]}


def _profiled_time(row: dict) -> float:
    profiled = _number(row.get(contract.PROFILING_AVERAGE))
    return profiled * int(float(row.get(contract.PROFILING_SAMPLE_COUNT) or 1)) if profiled else 0.0


def workload_entry(work: Path, name: str, args) -> dict:
    """The workload's line of the `workloads` list (see the module docstring)."""
    rows = [r for r in read_rows(database_dir(work, name, DEFAULT_CACHE_POLICY, args))
            if r.get(contract.SOURCE, contract.SOURCE_PROFILED) == contract.SOURCE_PROFILED]
    total = sum(_profiled_time(r) for r in rows)
    replayed = sum(_profiled_time(r) for r in rows if r.get(contract.REPLAY_STATUS) == "ok")
    attribution_path = database_dir(work, name, "parsed", args) / contract.TRACE_ATTRIBUTION
    attribution = json.loads(attribution_path.read_text()) if attribution_path.exists() else {}
    shares = [entry["share"] for entry in attribution.values() if entry.get("share") is not None]
    summary = analyse_run(rows)
    schema = analyse_run([r for r in rows if r.get(contract.REPLAY_RECIPE, "").startswith("schema ")])
    cat_rows = [r for r in rows if r["_type"] == "cat"]
    cat = analyse_run(cat_rows)
    cat_gaps = [abs(1 - _number(r.get(contract.REPLAY_AVERAGE)) / _number(r.get(contract.PROFILING_AVERAGE)))
                for r in cat_rows if _number(r.get(contract.REPLAY_AVERAGE)) and _number(r.get(contract.PROFILING_AVERAGE))]
    not_ok = {}
    for row in rows:
        if row.get(contract.REPLAY_STATUS) != "ok":
            entry = not_ok.setdefault(row["_type"], {"rows": 0, "profiled_time_share": 0.0, "status": set()})
            entry["rows"] += 1
            entry["profiled_time_share"] += _profiled_time(row) / total if total else 0.0
            entry["status"].add(row.get(contract.REPLAY_STATUS, ""))
    workload = args.catalog[name]
    return {"name": name, "source": workload.source, "model": workload.model, "unseen": workload.unseen,
            "profile_iterations": profile_iterations(work / name / "profile"),
            "profile_clock_event_reasons": profile_clock_event_reasons(work / name / "profile"),
            "phase_replay": phase_summary(work, name, args), "rows": len(rows),
            "profiled_time_replayed": replayed / total if total else None,
            "trace_time_attributed": min(shares) if shares else None,
            "unattributed": {t: e["unattributed"] for t, e in attribution.items() if e.get("unattributed")},
            "median_gap": summary["median_gap"], "p90_gap": summary["p90_gap"],
            "time_weighted_gap": summary["time_weighted_gap"],
            "schema_rows": schema["rows"], "schema_median_gap": schema["median_gap"],
            "schema_p90_gap": schema["p90_gap"], "schema_time_weighted_gap": schema["time_weighted_gap"],
            "cat_rows": cat["rows"], "cat_median_gap": cat["median_gap"],
            "cat_max_gap": max(cat_gaps) if cat_gaps else None, **large_elementwise(rows),
            "not_replayed": {t: {**e, "status": sorted(e["status"])} for t, e in sorted(not_ok.items())}}


def profile_clock_event_reasons(profile: Path) -> dict | None:
    """NVML's reasons for the profile's throttled samples (opperf.power_samples.reason_shares), where its sampler
    recorded them."""
    path = profile / POWER_SAMPLES
    if not path.exists():
        return None
    document = json.loads(path.read_text(encoding="utf-8"))
    return reason_shares(document.get("samples") or [], document.get("max_clock_mhz"),
                         tuple(document.get("fields") or OLD_SAMPLE_FIELDS))


def profile_iterations(profile: Path) -> int | None:
    """Passes of the workload under the profiler, from the manifest the profile stage left (renamed for
    transformers traces, which the parse must read without it)."""
    for manifest in (profile / contract.WORKLOAD_MANIFEST, profile / "workload_info.json"):
        if manifest.exists():
            return json.loads(manifest.read_text(encoding="utf-8"))["plan"].get("profile_iterations", 1)
    return None


# Input-shape prefixes of the dense decoder's 64 x 1,024-token prefill, its power-limited phase.
POWER_LIMITED_PREFILL_SHAPES = ("65536,", "64,1024,", "64,64,1024,", "64,8,8,1024,")


def in_power_limited_phase(row: dict) -> bool:
    """A dense row of the decode-batch-64 context prefill (64 x 1024 = 65,536 tokens): the longest, GEMM-bound
    phase of the run, where the GPU sits at its power limit and every kernel runs at a lower clock than
    replay's (see cuda_power_probe.json). Reported apart so that its bias is visible, never dropped."""
    shapes = row.get(contract.INPUT_SHAPES, "")
    return row.get("_workload") == "dense" and shapes.startswith(POWER_LIMITED_PREFILL_SHAPES)


def power_state_split(rows: list[dict]) -> dict:
    """The rows by the SM clock the workload ran them at (`Profiling Average SM Clock(MHz)`, NVML beside the profile):
    throttled (THROTTLED_MHZ or more under the full clock), at full clock, or profiled without the sampler. The full
    clock is the highest the profile or the replay saw: a whole profile can run throttled (the dense decoder's H200
    profile of 2026-11-28 never went over 1,869 MHz). Each part's share of the profiled time and its contribution to
    the whole time-weighted gap (absolute and signed: the parts' absolute contributions add up to it), so that a
    report says how much of its error the power state accounts for (docs/replay.md, "The remaining error, by
    cause")."""
    clocks = [_number(r.get(contract.PROFILED_SM_CLOCK)) for r in rows]
    full = max((c for c in clocks + [_number(r.get(contract.REPLAY_SM_CLOCK)) for r in rows] if c), default=None)
    parts: dict[str, list[tuple[float, float, int]]] = {}
    for row, clock in zip(rows, clocks):
        pair = gap_pair(row)
        if pair is None or not pair[1]:
            continue
        part = ("no_profiled_clock" if not clock else
                "throttled_in_workload" if clock <= full - THROTTLED_MHZ else "full_clock_in_workload")
        parts.setdefault(part, []).append(pair)
    summaries = {part: gap_summary(pairs) for part, pairs in parts.items()}
    total = sum(summary["profiled_time_share"] for summary in summaries.values()) or 1.0   # Σ profiled × calls
    split = {}
    for part in ("throttled_in_workload", "full_clock_in_workload", "no_profiled_clock"):
        if part in parts:
            pairs = parts[part]
            split[part] = {**_headline(summaries[part]), "full_clock_mhz": full,
                           "profiled_time_share": summaries[part]["profiled_time_share"] / total,
                           "gap_contribution": sum(abs(r - p) * n for r, p, n in pairs) / total,
                           "signed_gap_contribution": sum((r - p) * n for r, p, n in pairs) / total}
    return split


def repeatability(first: list[dict], second: list[dict]) -> dict:
    def key(row):
        return row["_type"], row["_line"]
    other = {key(r): _number(r.get(contract.REPLAY_AVERAGE)) for r in second}
    diffs = []
    for row in first:
        a, b = _number(row.get(contract.REPLAY_AVERAGE)), other.get(key(row))
        if a is not None and b is not None:
            diffs.append(abs(1 - b / a))
    return {"rows": len(diffs), "median": quantile(diffs, 0.5), "p90": quantile(diffs, 0.9)}


def stage_report(work: Path, args, env: dict, wall: dict, fixed: dict | None) -> dict:
    report = {"device": env.get("device"), "environment": env, "repeat_count": args.repeat_count,
              "default_policy": DEFAULT_CACHE_POLICY,
              "power_policy": POWER_POLICY, "heater_min_power_w": args.heater_min_power,
              "phase_cold_copies": args.phase_cold_copies,
              "workloads": [workload_entry(work, name, args) for name in args.workloads],
              "workload_plans": {n: asdict(args.catalog[n]) for n in args.workloads},
              "policies": {}, "per_workload": {}, "fixed_cost": fixed, "stage_wall_s": wall}
    for run_name in replay_runs(args):
        merged = []
        for name in args.workloads:
            rows = read_rows(database_dir(work, name, run_name, args))
            for row in rows:
                row["_workload"] = name
            report["per_workload"].setdefault(name, {})[run_name] = {**analyse_run(rows), **large_elementwise(rows)}
            merged += [{**r, "_line": f"{name}:{r['_line']}"} for r in rows]
        report["policies"][run_name] = analyse_run(merged)
    default = report["policies"][DEFAULT_CACHE_POLICY]
    merged = [r for n in args.workloads for r in _tagged(read_rows(database_dir(work, n, DEFAULT_CACHE_POLICY, args)),
                                                         n)]
    report["phases"] = {
        "power_limited_prefill": _headline(analyse_run([r for r in merged if in_power_limited_phase(r)])),
        "all_other_rows": _headline(analyse_run([r for r in merged if not in_power_limited_phase(r)]))}
    report["power_state"] = power_state_split(merged)
    first = [r for n in args.workloads for r in _tagged(read_rows(database_dir(work, n, DEFAULT_CACHE_POLICY, args)), n)]
    second = [r for n in args.workloads for r in _tagged(read_rows(database_dir(work, n, REPEAT_RUN, args)), n)] \
        if args.repeat else []
    report["repeatability"] = repeatability(first, second)
    for entry in report["workloads"]:
        name = entry["name"]
        entry["repeatability_median"] = repeatability(
            [r for r in first if r["_workload"] == name], [r for r in second if r["_workload"] == name])["median"]
        entry["gates"] = gates(entry, report["per_workload"][name][DEFAULT_CACHE_POLICY]["per_type"])
    # The same gates under each other cache policy (its own replay; the default's repeatability).
    report["policy_gates"] = {
        run_name: [_policy_entry(w, report["per_workload"][w["name"]][run_name]) for w in report["workloads"]]
        for run_name in args.policies if run_name != DEFAULT_CACHE_POLICY}
    replay_wall = sum(wall.get("replay", {}).get(f"{n}/{DEFAULT_CACHE_POLICY}", 0) for n in args.workloads)
    replayed = sum(1 for r in first if _number(r.get(contract.REPLAY_AVERAGE)) is not None)
    kernel_s = sum(_number(r.get(contract.REPLAY_AVERAGE)) * args.repeat_count / 1e6 for r in first
                   if _number(r.get(contract.REPLAY_AVERAGE)) is not None)
    report.update({"median_gap": default["median_gap"], "p90_gap": default["p90_gap"],
                   "time_weighted_gap": default["time_weighted_gap"],
                   "repeatability_median": report["repeatability"]["median"],
                   "rows_per_s": replayed / replay_wall if replay_wall else None,
                   "replayed_rows": replayed, "replay_wall_s": replay_wall,
                   "kernel_time_share": kernel_s / replay_wall if replay_wall else None})
    return report


def write_summary(path: Path, document: dict | list, found: bool) -> int:
    """Write a benchmark summary's JSON, say where; exit status 1 when it found nothing to summarise."""
    path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    print(f"\nwritten to {path}")
    return 0 if found else 1


def _policy_entry(workload: dict, run: dict) -> dict:
    """A workload's gates under another cache policy: that run's numbers, the default policy's repeatability."""
    entry = {**_headline(run), "name": workload["name"], "unseen": workload["unseen"],
             "repeatability_median": workload["repeatability_median"],
             "large_elementwise_rows": run["large_elementwise_rows"],
             "large_elementwise_ratio": run["large_elementwise_ratio"]}
    return {**entry, "gates": gates(entry, run["per_type"])}


def _tagged(rows: list[dict], name: str) -> list[dict]:
    return [{**r, "_line": f"{name}:{r['_line']}", "_workload": name} for r in rows]


def _headline(summary: dict) -> dict:
    return {k: summary[k] for k in ("rows", "median_gap", "p90_gap", "time_weighted_gap", "median_ratio")}


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _ratio(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def _gate_cell(gate: dict | None, text: str) -> str:
    if gate is None or gate["met"] is None:
        return "-"
    return text if gate["met"] else f"**{text}** ✗"


def gates_table(workloads: list[dict], device: str | None = None) -> list[str]:
    """Markdown rows of issue 18's gates, one per workload entry with `gates` (bold ✗: not met)."""
    lead = "| device " if device is not None else ""
    lines = [f"{lead}| workload | unseen | median ≤ 3 % | p90 ≤ 12 % | time-weighted ≤ 3 % | repeatability ≤ 1 % | "
             "types ≥ 1 % of time over a 5 % median | large elementwise ratio 0.97–1.03 | all met |",
             f"{'|---' if device is not None else ''}|---|---|---|---|---|---|---|---|---|"]
    for w in workloads:
        g = w.get("gates") or {}
        over = (g.get("type_median_gap") or {}).get("value") or {}
        types = ", ".join(f"{t} {100 * v:.1f} %" for t, v in sorted(over.items())) or "none"
        met = [gate["met"] for gate in g.values()]
        verdict = "yes" if met and all(met) else ("-" if not met or None in met else "no")
        lines.append(f"{f'| {device} ' if device is not None else ''}| {w['name']} | {w['unseen']} | "
                     + " | ".join(_gate_cell(g.get(k), _pct(w.get(k))) for k in (*TARGETS,))
                     + f" | {_gate_cell(g.get('type_median_gap'), types)} | "
                     f"{_gate_cell(g.get('large_elementwise_ratio'), _ratio(w.get('large_elementwise_ratio')))} "
                     f"({w.get('large_elementwise_rows', '-')} rows) | {verdict} |")
    return lines


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [f"# CUDA replay accuracy ({env['device']}, {env['date'][:10]})", "",
             f"{env['nvidia_smi']}; torch {env['torch']}, CUDA {env['cuda']}, Python {env['python']}; "
             f"L2 {env['l2_cache_bytes'] // 1024} KiB. Repeat count {report['repeat_count']}, power policy {report.get('power_policy', 'cooldown')}"
             + (f" (no heater under {report['heater_min_power_w']:.0f} W profiled)" if report.get("heater_min_power_w")
                else "") + ". "
             "Produced by `python benchmarks/cuda_replay.py` (see its docstring for the definitions).", "",
             "| workload | source | model | layers | prefill | decode batches (context, steps) | passes profiled |",
             "|---|---|---|---|---|---|---|"]
    passes = {w["name"]: w.get("profile_iterations") for w in report["workloads"]}
    for name, w in report["workload_plans"].items():
        lines.append(f"| {name} | {w['source']} | {w['model']} | {w['layers']} | "
                     f"{', '.join(map(str, w['prefill_lengths']))} | {', '.join(map(str, w['decode_batch_sizes']))} "
                     f"({w['decode_context']}, {w['decode_steps']}) | {passes.get(name) or '-'} |")
    lines += ["", "## Per workload (default policy)", "",
              "| workload | unseen | rows | profiled time replayed | trace time attributed | median gap | p90 gap | "
              "time-weighted gap | schema rows (median gap) | cat rows (median / max gap) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for w in report["workloads"]:
        lines.append(f"| {w['name']} | {w['unseen']} | {w['rows']} | {_pct(w['profiled_time_replayed'])} | "
                     f"{_pct(w['trace_time_attributed'])} | {_pct(w['median_gap'])} | {_pct(w['p90_gap'])} | "
                     f"{_pct(w['time_weighted_gap'])} | {w['schema_rows']} ({_pct(w['schema_median_gap'])}) | "
                     f"{w['cat_rows']} ({_pct(w['cat_median_gap'])} / {_pct(w['cat_max_gap'])}) |")
    lines += ["", "## Issue 18's gates (default policy)", "", *gates_table(report["workloads"])]
    for run_name, entries in report.get("policy_gates", {}).items():
        lines += ["", f"The same under `{run_name}` (repeatability: the default policy's):", "", *gates_table(entries)]
    lines += ["", "## Gap to the in-workload time, per cache policy (profiled rows of both workloads)", "",
              "| policy | rows | median gap | p90 gap | time-weighted gap | median replay/profiled |",
              "|---|---|---|---|---|---|"]
    for run_name, summary in report["policies"].items():
        lines.append(f"| {run_name} | {summary['rows']} | {_pct(summary['median_gap'])} | {_pct(summary['p90_gap'])} | "
                     f"{_pct(summary['time_weighted_gap'])} | {_ratio(summary['median_ratio'])} |")
    default = report["policies"][report["default_policy"]]
    lines += ["", f"## Per kernel type ({report['default_policy']})", "",
              "| type | rows | share of workload time | median gap | p90 gap | time-weighted gap | median ratio |",
              "|---|---|---|---|---|---|---|"]
    for name, t in sorted(default["per_type"].items(), key=lambda kv: -kv[1]["profiled_time_share"]):
        lines.append(f"| {name} | {t['rows']} | {_pct(t['profiled_time_share'])} | {_pct(t['median_gap'])} | "
                     f"{_pct(t['p90_gap'])} | {_pct(t['time_weighted_gap'])} | {_ratio(t['median_ratio'])} |")
    lines += ["", "## Worst rows (by |replay - profiled| x calls)", "",
              "| row | replay µs | profiled µs | ratio | calls | input shapes | strides |", "|---|---|---|---|---|---|---|"]
    for w in default["worst_rows"][:15]:
        lines.append(f"| {w['type']} {w['line']} | {w['replay_us']:.2f} | {w['profiled_us']:.2f} | {w['ratio']:.2f} | "
                     f"{w['calls']} | `{w['shapes']}` | `{w['strides']}` |")
    lines += ["", f"## Where the remaining gap is ({report['default_policy']})", "",
              "| rows | count | median gap | p90 gap | time-weighted gap | median ratio |", "|---|---|---|---|---|---|"]
    for name, phase in report.get("phases", {}).items():
        lines.append(f"| {name.replace('_', ' ')} | {phase['rows']} | {_pct(phase['median_gap'])} | "
                     f"{_pct(phase['p90_gap'])} | {_pct(phase['time_weighted_gap'])} | {_ratio(phase['median_ratio'])} |")
    lines += ["", f"## The workload's power state ({report['default_policy']}; rows by the SM clock they ran at)", "",
              "| rows | count | share of profiled time | median ratio | time-weighted gap | its part of the whole "
              "time-weighted gap (signed) |", "|---|---|---|---|---|---|"]
    for name, part in report.get("power_state", {}).items():
        label = {"throttled_in_workload": f"throttled (≥ {THROTTLED_MHZ:.0f} MHz under "
                                          f"{part['full_clock_mhz'] or 0:.0f})",
                 "full_clock_in_workload": "at full clock", "no_profiled_clock": "no profiled clock"}[name]
        lines.append(f"| {label} | {part['rows']} | {_pct(part['profiled_time_share'])} | "
                     f"{_ratio(part['median_ratio'])} | {_pct(part['time_weighted_gap'])} | "
                     f"{_pct(part['gap_contribution'])} ({_pct(part['signed_gap_contribution'])}) |")
    for entry in report["workloads"]:
        phase = entry.get("phase_replay")
        if phase and phase["rows"]:
            lines.append(f"\n{entry['name']}: phase replay (stage 4b) ran {phase['calls']} calls of {phase['rows']} "
                         f"rows in the profile's order and folded {phase['rows_applied']} rows in; "
                         f"their in-order time was {_ratio(phase['time_ratio'])} of profiled")
        elif phase:
            lines.append(f"\n{entry['name']}: phase replay (stage 4b) found nothing to replay")
        shares = entry.get("profile_clock_event_reasons")
        if shares and shares["throttled_samples"]:
            lines.append(f"\n{entry['name']}: {shares['throttled_samples']} of the profile's {shares['samples']} NVML "
                         f"samples throttled; their clock-event reasons: "
                         + ", ".join(f"{name} {_pct(share)}" for name, share in shares["reasons"].items()))
    rep = report["repeatability"]
    fixed = report.get("fixed_cost") or {}
    lines += ["", "## Repeatability and throughput", "",
              f"- Two independent replays ({report['default_policy']}, seeds 0 and 1): median difference "
              f"{_pct(rep['median'])}, p90 {_pct(rep['p90'])} over {rep['rows']} rows.",
              f"- {report['replayed_rows']} rows replayed in {report['replay_wall_s']:.1f} s of wall time at "
              f"{report['repeat_count']} repetitions ({report['rows_per_s'] or 0:.1f} rows/s, every job's fixed cost "
              f"included); measured kernels fill {_pct(report['kernel_time_share'])} of it.",
              f"- Fixed cost of a one-row kernel-type job on a warm machine: {fixed.get('fixed_cost_s_median', '-')} s "
              f"(median of 3; `{fixed.get('kernel_type', '-')}`)."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, help="where cuda_replay.json/.md go (default: "
                        "benchmarks/results/cuda_replay; with --backend cpu: <work-dir>/results)")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/opperf_cuda_replay"))
    parser.add_argument("--backend", choices=["cuda", "cpu"], default="cuda",
                        help="cuda: the measurement; cpu: a smoke test of every code path at toy sizes (tiny configs, "
                             "float32, device CPU)")
    parser.add_argument("--device", help="device key of config/devices.yaml (default: H100; CPU with --backend cpu)")
    parser.add_argument("--workloads", nargs="+", help=f"default: all (of the back end's): {sorted(WORKLOADS)}")
    parser.add_argument("--transformers-configs", nargs="+", type=Path, default=[], metavar="PATH",
                        help="transformers config.json files or directories of them, each a workload hf_<stem> "
                             "(e.g. benchmarks/workloads/tiny with --backend cpu); alone, only these run")
    parser.add_argument("--policies", nargs="+", choices=[CACHE_POLICY], default=[CACHE_POLICY],
                        help="replay's cache state (one since issue 42: the flush/none comparison is in "
                             "benchmarks/results/cuda_replay/, made at 5780ade)")
    parser.add_argument("--repeat-count", type=int, default=30)
    parser.add_argument("--heater-min-power", type=float, default=DEFAULT_HEATER_MIN_POWER_W, metavar="W",
                        help="scripts/replay.py --heater-min-power of every replay run (recorded in the JSON)")
    parser.add_argument("--profile-iterations", type=int, default=1,
                        help="passes of each workload under the profiler (scripts/profile_workload.py; recorded in "
                             "the JSON): more passes average each row's profiled time over more calls")
    parser.add_argument("--phase-iterations", type=int, default=0, metavar="N",
                        help="stage 4b: times the profile's order is replayed (0: the stage's default)")
    parser.add_argument("--phase-cold-copies", action=argparse.BooleanOptionalAction, default=False,
                        help="stage 4b: a row's calls take turns over copies of its cold inputs (recorded in the JSON)")
    parser.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES))
    parser.add_argument("--repeat", action=argparse.BooleanOptionalAction, default=True,
                        help="a second replay under the default policy (another seed) for repeatability "
                             "(--no-repeat: skip it, half the replay time)")
    parser.add_argument("--replay-runs", nargs="+", metavar="RUN",
                        help="replay only these runs (policy names, insitu-repeat); the others keep the databases an "
                             "earlier call left in --work-dir, and the report reads them all")
    args = parser.parse_args()
    smoke = args.backend == "cpu"
    configs = config_workloads(args.transformers_configs, smoke)
    args.catalog = {**(SMOKE_WORKLOADS if smoke else WORKLOADS), **configs}
    args.workloads = args.workloads or sorted(configs or args.catalog)
    unknown = [w for w in args.workloads if w not in args.catalog]
    if unknown:
        parser.error(f"--backend {args.backend} has no workload(s) {unknown} (has {sorted(args.catalog)})")
    args.device = args.device or ("CPU" if smoke else "H100")
    args.output = args.output or (args.work_dir / "results" if smoke else ROOT / "benchmarks" / "results" / "cuda_replay")
    args.dtype = "float32" if smoke else "bfloat16"
    if DEFAULT_CACHE_POLICY not in args.policies:
        args.policies.insert(0, DEFAULT_CACHE_POLICY)
    unknown_runs = sorted(set(args.replay_runs or ()) - set(replay_runs(args)))
    if unknown_runs:
        parser.error(f"--replay-runs {unknown_runs}: not among this call's runs {replay_runs(args)}")
    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    wall_path = work / "stage_wall.json"
    wall = json.loads(wall_path.read_text()) if wall_path.exists() else {}
    if (work / ENVIRONMENT_FILE).exists() and "profile" not in args.stages:
        args.version_dir = json.loads((work / ENVIRONMENT_FILE).read_text()).get("version_dir") or \
            version_dir(args.backend)
    else:
        args.version_dir = version_dir(args.backend)
    for stage, function in (("profile", stage_profile), ("parse", stage_parse), ("replay", stage_replay),
                            ("phase", stage_phase), ("fixed", stage_fixed)):
        if stage in args.stages:
            print(f"== {stage}", flush=True)
            wall[stage] = function(work, args)
            wall_path.write_text(json.dumps(wall, indent=1))
            print(json.dumps(wall[stage]), flush=True)
    if any(stage in args.stages for stage in ("profile", "replay")):
        (work / ENVIRONMENT_FILE).write_text(json.dumps(environment(args.backend), indent=1))
    if "report" in args.stages:
        report = stage_report(work, args, json.loads((work / ENVIRONMENT_FILE).read_text()), wall, wall.get("fixed"))
        args.output.mkdir(parents=True, exist_ok=True)
        (args.output / "cuda_replay.json").write_text(json.dumps(report, indent=1))
        (args.output / "cuda_replay.md").write_text(markdown(report))
        print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
