#!/usr/bin/env python
"""End to end: a database built for a model's scenario space predicts steps of that model nobody profiled.

For each workload (a transformers config.json; random weights, nothing downloaded; models that are not in
config/models.yaml):

  0. workflow the database as a user builds it (the device): `snakemake --resources gpu=1` in a copy of the
              workflow, with a config naming the model's config.json as the workload (profiled at --profile-prefill
              and decode --profile-decode-batches x --profile-context) and as the grid's target, its queries over
              --scenario-space the only generated rows (grid.queries_only), replay with stage 4b, database, check,
              predictions of the held-out scenarios; the database lands where `predict` reads it. Stages 1-2 are
              the same without a profile, by hand.
  1. grid     scripts/generate_shape_grid.py --consumer-models CONFIG --queries-only --scenario-space SPACE: the
              model's queries over the scenario space (config/scenarios.yaml), recorded on meta as msmodeling's
              TensorCast records a model run, one row each (host; no device needed)
  2. replay   scripts/replay.py --database-path on those rows (the device), repetitions chosen per row by
              --time-budget-s; then scripts/build_database.py directory (kernel CSVs + op_mapping.yaml)
  3. profile  scripts/profile_workload.py at the held-out scenarios (the device): prefill lengths and decode
              batches x contexts between the space's points, in-workload, --profile-iterations passes
  4. predict  each held-out scenario's queries answered from the database (opperf.consumer.predict: opperf's
              model of msmodeling's runtime) against the held-out profile (host)

Measured (the ground truth) is what a performance model predicts: the device time of the step, Σ over its kernels
(and memcpy/memset) launched inside the step's record_function range, mean over the passes. Per row: the
profile's calls grouped as TensorCast sees them — a kernel belongs to the outermost op of its launch's op stack
that torch does not decompose (no CompositeImplicitAutograd kernel: `linear` is `mm`, `to` is `_to_copy`), keyed
by (op, tensor input shapes, dtypes) — against the prediction's answer for the same key; row error |pred/meas - 1|.
`paired_time_share` says how much of the measured step time such pairs cover (the rest: calls whose key the
recording did not issue, e.g. an attention backend other than the one the recorder assumed).

Writes `e2e_prediction.json` and `README.md` in --output: `device`, and `workloads: [{name, unseen: true,
grid_rows, replay_s, scenarios: [{name, predicted_us, measured_us, status_time_share, row_median_error,
row_p90_error, paired_time_share}]}]`. Stages run separately (`--stages workflow profile` on the device machine,
`--stages predict report` here) with one --work-dir.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opperf.model_names import config_model_name  # noqa: E402

STAGES = ("workflow", "grid", "replay", "profile", "predict", "report")
HELD_OUT_PREFILL = (640, 1536, 3072)                     # between the dense space's 512/768, 1024/2048, 2048/4096
HELD_OUT_DECODE = {1024: (12, 24), 1536: (8,)}           # context -> batches: one axis off the grid at a time
DEVICE_KINDS = ("kernel", "gpu_memcpy", "gpu_memset")


def run(command: list[str], log_path: Path) -> float:
    began = time.perf_counter()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w", encoding="utf-8") as log:
        done = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if done.returncode != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{tail}")
    return time.perf_counter() - began


def database_rows(work: Path, args) -> Path:
    return work / "rows" / args.device / "torch" / args.version_dir


# --- stages -----------------------------------------------------------------------------------------------

def stage_grid(config: Path, work: Path, args) -> dict:
    empty = work / "empty_parse"
    empty.mkdir(parents=True, exist_ok=True)
    (empty / "kernel_types.txt").write_text("")
    rows = database_rows(work, args)
    seconds = run([sys.executable, "scripts/generate_shape_grid.py", "--input-dir", str(empty), "--output-dir",
                   str(rows), "--device", args.device, "--consumer-models", str(config), "--consumer-dtype",
                   args.dtype, "--scenarios", str(args.scenarios), "--scenario-space", args.scenario_space, "--queries-only", "--num-layers",
                   str(args.num_layers)], work / "logs" / "grid.log")
    counts = {p.stem: sum(1 for _ in p.open()) - 1 for p in rows.glob("*.csv")}
    return {"grid_rows": sum(counts.values()), "grid_kernel_types": len(counts), "grid_s": round(seconds, 1)}


def stage_replay(work: Path, args) -> dict:
    rows = database_rows(work, args)
    seconds = run([sys.executable, "scripts/replay.py", "--database-path", str(rows), "--backend", args.backend,
                   "--repeat-count", str(args.repeat_count), "--time-budget-s", str(args.time_budget_s)],
                  work / "logs" / "replay.log")
    database = work / "database" / args.device / "torch" / args.version_dir
    run([sys.executable, "scripts/build_database.py", "directory", "--rows-dir", str(rows), "--device", args.device,
         "--output", str(database), "--overwrite"], work / "logs" / "build.log")
    return {"replay_s": round(seconds, 1)}


def workflow_config(config: Path, args) -> dict:
    """The config a user writes to build a database for their model with the workflow: the model's config.json as
    the workload (profiled at --profile-prefill and decode --profile-decode-batches x --profile-context) and as the
    grid's one target, its queries over --scenario-space the only generated rows, replayed with stage 4b, the
    held-out scenarios predicted (stage 7b)."""
    model = str(config.resolve())
    held_out = [f"prefill:{t}" for t in args.held_out_prefill] + [
        f"decode:{b}x{c}" for c, batches in args.held_out_decode.items() for b in batches]
    return {"sources": "config/e2e_sources.tsv",
            "workload": {"backend": args.backend, "device": args.device, "model": model, "dtype": args.dtype,
                         "num_layers": args.num_layers, "prefill_lengths": args.profile_prefill, "decode_steps": 1,
                         "decode_context": args.profile_context, "decode_batch_sizes": args.profile_decode_batches,
                         "profile_iterations": args.profile_iterations},
            "grid": {"target_models": [model], "consumer_queries": True, "consumer_dtype": args.dtype,
                     "scenario_space": args.scenario_space, "queries_only": True},
            "replay": {"backends": [args.backend], "repeat_count": args.repeat_count,
                       "time_budget_s": args.time_budget_s, "phase": {"enabled": True, "backends": [args.backend]}},
            "predict": {"scenarios": held_out, "dtype": args.dtype},
            "comm": {"enabled": False}}


def stage_workflow(config: Path, work: Path, args) -> dict:
    """The database built by the workflow itself (`snakemake` in a copy of it, --resources gpu=1): profile, parse,
    grid, replay, stage 4b, database, check, prediction; the database is copied to where the predict stage reads."""
    import shutil

    import yaml

    from opperf.workflow_config import copy_workflow

    root = work / "workflow"
    if root.exists():
        shutil.rmtree(root)
    copy_workflow(root, ROOT)
    (root / "config" / "e2e_sources.tsv").write_text("device\tstack\tversion_dir\tpath\n")
    shutil.copy2(args.scenarios, root / "config" / "scenarios.yaml")
    (root / "e2e.yaml").write_text(yaml.safe_dump(workflow_config(config, args), sort_keys=False))
    from opperf.versions import workload_database_version_dir

    # The workflow's folder for the model's database ({stack}_{model}); copied below to where `predict` reads it.
    target = f"{args.device}/torch/{workload_database_version_dir(args.version_dir, str(config.resolve()), {})}"
    targets = [f"results/{target}/database_manifest.tsv", f"reports/{target}/database_check.json",
               f"reports/{target}/predictions.json"]
    began = time.perf_counter()
    log_path = work / "logs" / "workflow.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w", encoding="utf-8") as log:
        done = subprocess.run([sys.executable, "-m", "snakemake", "--cores", str(args.cores), "--resources", "gpu=1",
                               "--scheduler", "greedy",
                               "--configfile", "e2e.yaml", "--keep-going", *targets], cwd=root, stdout=log,
                              stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    seconds = time.perf_counter() - began
    database = root / "data" / target
    if not (root / "results" / target / "database_manifest.tsv").is_file():
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-4000:]
        raise SystemExit(f"the workflow built no database ({done.returncode}) for {config}:\n{tail}")
    destination = work / "database" / args.device / "torch" / args.version_dir
    if destination.exists():
        shutil.rmtree(destination)
    shutil.copytree(database, destination)
    runs = root / "benchmarks" / "runs"

    def job_seconds(pattern: str, but: str = "") -> float:
        total = 0.0
        for tsv in runs.glob(pattern):
            lines = tsv.read_text().splitlines()
            total += float(lines[1].split("\t")[0]) if len(lines) > 1 and tsv.name != but else 0.0
        return round(total, 1)

    from opperf import contract
    from opperf.io import read_database_csv

    layouts = sorted((destination / "layouts").glob("*.csv"))
    sources = [source for p in layouts for source in read_database_csv(p)[contract.SOURCE]]
    generated, profiled = sources.count(contract.SOURCE_GENERATED), sources.count(contract.SOURCE_PROFILED)
    check_path = root / "reports" / target / "database_check.json"          # a failed check leaves none
    check = json.loads(check_path.read_text()) if check_path.is_file() else {}
    return {"database": "workflow", "workflow_s": round(seconds, 1), "grid_rows": generated,
            "profiled_rows": profiled, "grid_kernel_types": len(layouts),
            "profile_s": job_seconds(f"workload/{target}.tsv"), "grid_s": job_seconds(f"grid/{target}.tsv"),
            "replay_s": job_seconds(f"replay/{target}/*.tsv", but="phase_replay.tsv"),
            "phase_replay_s": job_seconds(f"replay/{target}/phase_replay.tsv"),
            "database_check_passed": bool(check.get("passed")), "workflow_exit": done.returncode}


def stage_profile(config: Path, work: Path, args) -> dict:
    seconds = 0.0
    common = [sys.executable, "scripts/profile_workload.py", "--backend", args.backend, "--transformers-config",
              str(config), "--num-layers", str(args.num_layers), "--dtype", args.dtype, "--decode-steps", "1",
              "--profile-iterations", str(args.profile_iterations)]
    plans = [("prefill", ["--prefill-lengths", *map(str, args.held_out_prefill), "--decode-steps", "0"])]
    plans += [(f"decode_c{context}", ["--prefill-lengths", "1", "--decode-context", str(context),
                                      "--decode-batch-sizes", *map(str, batches)])
              for context, batches in args.held_out_decode.items()]
    for name, plan in plans:
        seconds += run(common + plan + ["--output", str(work / "held_out" / name)],
                       work / "logs" / f"profile_{name}.log")
    return {"profile_s": round(seconds, 1)}


# --- the ground truth -------------------------------------------------------------------------------------

def _composite(name: str) -> bool:
    """Whether torch decomposes the op before a dispatch mode sees it (a CompositeImplicitAutograd kernel): its
    default overload's, else any functional overload's (`to` has no default; `to.dtype` is composite)."""
    import torch

    packet = getattr(torch.ops.aten, name.removeprefix("aten::"), None)
    if packet is None:
        return False
    overloads = ["default"] if "default" in packet.overloads() else [
        o for o in packet.overloads() if not o.startswith(("prim", "out")) and "name" not in o.lower()]
    for overload in overloads:
        try:
            if torch._C._dispatch_has_kernel_for_dispatch_key(name if overload == "default" else f"{name}.{overload}",
                                                              "CompositeImplicitAutograd"):
                return True
        except RuntimeError:
            continue
    return False


def _key(op: str, args: dict) -> tuple:
    """(op, tensor input shapes, dtypes) as a dispatch-mode query has them: tensors of rank >= 1, list members
    flattened, in argument order; no dtypes for an op with a TensorList (the trace does not record its members')."""
    from opperf.contract import PROFILER_TYPE_TO_TORCH

    shapes, dtypes, listed = [], [], False
    for dims, kind in zip(args.get("Input Dims") or [], args.get("Input type") or []):
        if kind in PROFILER_TYPE_TO_TORCH and dims:
            shapes.append(tuple(dims))
            dtypes.append(PROFILER_TYPE_TO_TORCH[kind])
        elif kind == "TensorList":
            listed = True
            shapes += [tuple(member) for member in dims or [] if isinstance(member, list) and member]
    return (op.removeprefix("aten::"), tuple(shapes), () if listed else tuple(dtypes))


def query_key(recorded) -> tuple:
    query = recorded.query
    listed = "TensorList" in ((recorded.arguments or {}).get("Input type") or [])
    return (query.op_name.split(".")[1], tuple(tuple(t.shape) for t in query.inputs),
            () if listed else tuple(str(t.dtype).removeprefix("torch.") for t in query.inputs))


def measured_steps(trace_path: Path) -> dict[str, dict]:
    """Per step label (`prefill_640`, `decode_b12_0`): `device_us` (Σ device time per pass) and `calls` {key:
    [device time of each call]} over every pass, from a torch.profiler Chrome trace."""
    import bisect

    events = json.loads(trace_path.read_text(encoding="utf-8"))["traceEvents"]
    ops_by_tid: dict = defaultdict(list)
    steps = []
    launches, device = {}, []
    for event in events:
        cat = event.get("cat")
        if cat == "cpu_op" and event.get("name", "").startswith("aten::"):
            ops_by_tid[event.get("tid")].append(event)
        elif cat == "user_annotation" and event.get("name", "").startswith(("prefill_", "decode_")):
            steps.append(event)
        elif cat in ("cuda_runtime", "cuda_driver") and "correlation" in event.get("args", {}):
            launches[event["args"]["correlation"]] = event
        elif cat in DEVICE_KINDS:
            device.append(event)
    for ops in ops_by_tid.values():
        ops.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
    starts = {tid: [e["ts"] for e in ops] for tid, ops in ops_by_tid.items()}
    composite: dict[str, bool] = {}

    def dispatch_op(tid, ts):
        """The outermost op enclosing host time `ts` that torch does not decompose."""
        ops = ops_by_tid.get(tid, [])
        enclosing = [e for e in ops[:bisect.bisect_right(starts.get(tid, []), ts)] if e["ts"] + e.get("dur", 0) >= ts]
        for op in enclosing:                       # outermost first (sorted by start, longer first)
            name = op["name"]
            if name not in composite:
                composite[name] = _composite(name)
            if not composite[name]:
                return op
        return None

    def step_of(tid, ts):
        for step in steps:
            if step.get("tid") == tid and step["ts"] <= ts <= step["ts"] + step.get("dur", 0):
                return step["name"]
        return None

    result: dict[str, dict] = {}
    passes: dict[str, set] = defaultdict(set)
    for step in steps:
        passes[step["name"]].add(step["ts"])
    per_call: dict = defaultdict(float)            # (step, op event id) -> device us
    op_of: dict = {}
    if device:
        for kernel in device:
            launch = launches.get(kernel.get("args", {}).get("correlation"))
            if launch is None:
                continue
            step = step_of(launch.get("tid"), launch["ts"])
            if step is None:
                continue
            result.setdefault(step, {"device_us": 0.0, "calls": defaultdict(list)})
            result[step]["device_us"] += kernel.get("dur", 0.0)
            op = dispatch_op(launch.get("tid"), launch["ts"])
            if op is not None:
                per_call[(step, id(op))] += kernel.get("dur", 0.0)
                op_of[(step, id(op))] = op
    else:                                          # a cpu trace: the dispatch-level ops' own time
        for tid, ops in ops_by_tid.items():
            for op in ops:
                step = step_of(tid, op["ts"])
                if step is None or dispatch_op(tid, op["ts"] + 1e-3) is not op:
                    continue
                result.setdefault(step, {"device_us": 0.0, "calls": defaultdict(list)})
                result[step]["device_us"] += op.get("dur", 0.0)
                per_call[(step, id(op))] += op.get("dur", 0.0)
                op_of[(step, id(op))] = op
    for (step, _), us in per_call.items():
        op = op_of[(step, _)]
        result[step]["calls"][_key(op["name"], op.get("args", {}))].append(us)
    for step, value in result.items():
        value["device_us"] /= max(1, len(passes[step]))
        value["passes"] = len(passes[step])
    return result


def _scenario_of(label: str, batch_size: int):
    """`prefill_640` -> ('prefill', 640); `decode_b12_0` -> ('decode', 12); `decode_0` (a profile of one decode
    batch, the plan's batch_size) -> ('decode', batch_size)."""
    if label.startswith("prefill_"):
        return "prefill", int(label.split("_")[1])
    part = label.split("_")[1]
    return "decode", int(part.removeprefix("b")) if part.startswith("b") else batch_size


# --- predict ------------------------------------------------------------------------------------------------

def stage_predict(config: Path, work: Path, args) -> list[dict]:
    import torch

    from opperf.consumer.model_queries import model_source, scenario_name
    from opperf.consumer.predict import predict
    from opperf.consumer.scenarios import Scenario
    from opperf.consumer.status import PREDICTION_STATUSES

    database_dir = work / "database" / args.device / "torch" / args.version_dir
    source = model_source(str(config), str(ROOT / "config" / "models.yaml"), num_layers=args.num_layers)
    by_scenario: dict = defaultdict(list)           # held-out scenario -> its steps' measurements, every profile's
    for profile in sorted((work / "held_out").iterdir()):
        manifest = json.loads((profile / "workload.json").read_text())
        context = manifest["plan"]["decode_context"]
        for label, value in measured_steps(profile / "trace.json").items():
            phase, size = _scenario_of(label, manifest["plan"]["batch_size"])
            if phase == "prefill" and manifest["plan"]["decode_steps"] == 0:
                by_scenario[Scenario(source.name, 1, "prefill", 1, size)].append(value)
            elif phase == "decode":
                by_scenario[Scenario(source.name, 1, "decode", size, 1, context)].append(value)
    held_out = sorted(by_scenario, key=scenario_name)
    predictions = predict(database_dir, source, held_out, dtype=getattr(torch, args.dtype), attention=args.attention)
    scenarios = []
    for scenario, prediction in zip(held_out, predictions):
        values = by_scenario[scenario]
        measured_us = statistics.mean(v["device_us"] for v in values)
        calls: dict = defaultdict(list)
        for value in values:
            for key, times in value["calls"].items():
                calls[key] += times
        answered = {query_key(r): (latency, status) for r, status, latency, _ in prediction.answers}
        measured_by_status: dict = defaultdict(float)      # the step's measured time, by how its query was answered
        passes = sum(v["passes"] for v in values)
        errors, paired_us, worst = [], 0.0, []
        for key, times in calls.items():
            if key not in answered:
                continue
            predicted_us, status = answered[key]
            mean = sum(times) / len(times)
            paired_us += sum(times) / passes
            measured_by_status[status] += sum(times) / passes
            if mean > 0:
                errors.append(abs(predicted_us / mean - 1))
                worst.append((abs(predicted_us / mean - 1), key, predicted_us, mean, len(times) // passes))
        unpaired = sorted(((sum(t) / passes, k) for k, t in calls.items() if k not in answered), reverse=True)
        errors.sort()
        scenarios.append({
            "name": scenario_name(scenario), "predicted_us": round(prediction.predicted_us, 3),
            "measured_us": round(measured_us, 3),
            "ratio": round(prediction.predicted_us / measured_us, 4) if measured_us else None,
            "status_time_share": {k: round(v, 6) for k, v in prediction.status_time_share.items()},
            "status_measured_share": {k: round(measured_by_status[k] / measured_us, 6) if measured_us else None
                                      for k in PREDICTION_STATUSES},
            "rows": len(errors),
            "row_median_error": round(statistics.median(errors), 4) if errors else None,
            "row_p90_error": round(errors[min(len(errors) - 1, int(0.9 * len(errors)))], 4) if errors else None,
            "paired_time_share": round(paired_us / measured_us, 4) if measured_us else None,
            "worst_rows": [{"op": k[0], "inputs": [list(s) for s in k[1]], "dtypes": list(k[2]),
                            "predicted_us": round(p, 3), "measured_us": round(m, 3), "calls": c}
                           for _, k, p, m, c in sorted(worst, reverse=True)[:5]],
            "unpaired": [{"op": k[0], "inputs": [list(s) for s in k[1]], "measured_us": round(us, 3)}
                         for us, k in unpaired[:5]],
            "by_kernel_type": prediction.as_json()["by_kernel_type"]})
    return scenarios


# --- report -------------------------------------------------------------------------------------------------

def device_facts(backend: str) -> dict:
    import torch

    facts = {"torch": torch.__version__, "python": platform.python_version(), "host": platform.node()}
    if backend == "cuda" and torch.cuda.is_available():
        facts["device"] = torch.cuda.get_device_name(0)
        try:
            facts["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                             capture_output=True, text=True).stdout.strip()
        except OSError:
            pass
    else:
        facts["device"] = platform.processor() or "cpu"
    return facts


def write_report(output: Path, document: dict) -> None:
    from opperf.consumer.status import PREDICTION_STATUSES, AnswerStatus

    output.mkdir(parents=True, exist_ok=True)
    (output / "e2e_prediction.json").write_text(json.dumps(document, indent=1) + "\n")
    lines = [f"# End-to-end prediction ({document['date'][:10]})", "",
             f"{document.get('device', {}).get('device', '?')}; torch {document.get('device', {}).get('torch')}; "
             f"scenario space `{document['scenario_space']}`, {document['num_layers']} layers, {document['dtype']}. "
             f"Produced by `python benchmarks/e2e_prediction.py` (method in its docstring).", "",
             "Status shares are of the predicted time; `MISS meas` is the share of the measured step time whose query "
             "fell to roofline.", "",
             "| workload | scenario | predicted µs | measured µs | pred/meas | EXACT | INTERP | ILLEGAL | MISS | MISS meas "
             "| rows | row median err | row p90 err | paired time |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
             "---:|---:|---:|"]
    for workload in document["workloads"]:
        for s in workload.get("scenarios", []):
            share = s["status_time_share"]
            lines.append(f"| {workload['name']} | {s['name']} | {s['predicted_us']:.1f} | {s['measured_us']:.1f} | "
                         f"{s['ratio']} | " + " | ".join(f"{100 * share[k]:.1f} %" for k in
                                                         PREDICTION_STATUSES)
                         + f" | {100 * s.get('status_measured_share', {}).get(AnswerStatus.MISS, 0):.1f} %"
                         + f" | {s['rows']} | {s['row_median_error']} | {s['row_p90_error']} | "
                         f"{s['paired_time_share']} |")
    lines += ["", "| workload | grid rows | kernel types | replay s | profile s |", "|---|---:|---:|---:|---:|"]
    for workload in document["workloads"]:
        lines.append(f"| {workload['name']} | {workload.get('grid_rows')} | {workload.get('grid_kernel_types')} | "
                     f"{workload.get('replay_s')} | {workload.get('profile_s')} |")
    (output / "README.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--configs", nargs="+", type=Path, required=True, help="transformers config.json files")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/opperf_e2e"))
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "e2e_prediction")
    parser.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES))
    parser.add_argument("--backend", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--device", default="H200", help="device key of config/devices.yaml (default: %(default)s)")
    parser.add_argument("--version-dir", required=True, help="the device host's version directory "
                        "(torch2.11.0_cuda13.0): the rows are generated here and replayed there")
    parser.add_argument("--scenarios", type=Path, default=ROOT / "config" / "scenarios.yaml")
    parser.add_argument("--scenario-space", default="dense")
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--attention", default=None, help="default: the back end's")
    parser.add_argument("--repeat-count", type=int, default=30)
    parser.add_argument("--time-budget-s", type=float, default=0.02)
    parser.add_argument("--profile-iterations", type=int, default=5)
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2, help="the workflow's --cores")
    parser.add_argument("--profile-prefill", type=int, nargs="+", default=[256, 1024, 4096],
                        help="the workflow's profiled prefill lengths (default: %(default)s)")
    parser.add_argument("--profile-decode-batches", type=int, nargs="+", default=[4, 32],
                        help="the workflow's profiled decode batches (default: %(default)s)")
    parser.add_argument("--profile-context", type=int, default=1024,
                        help="the workflow's profiled decode context (default: %(default)s)")
    parser.add_argument("--held-out-prefill", type=int, nargs="+", default=list(HELD_OUT_PREFILL))
    parser.add_argument("--held-out-decode", type=json.loads, default=HELD_OUT_DECODE,
                        help='JSON {context: [batches]} (default: %(default)s)')
    args = parser.parse_args()
    args.attention = args.attention or args.backend
    args.held_out_decode = {int(c): tuple(b) for c, b in args.held_out_decode.items()}
    state_path = args.work_dir / "state.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {"workloads": {}}
    for config in args.configs:
        name = config_model_name(config)
        work = args.work_dir / name
        record = state["workloads"].setdefault(name, {"name": name, "unseen": True, "config": str(config)})
        if "workflow" in args.stages:
            record.update(stage_workflow(config, work, args))
        if "grid" in args.stages:
            record.update(stage_grid(config, work, args))
        if "replay" in args.stages:
            record.update(stage_replay(work, args))
        if "profile" in args.stages:
            record.update(stage_profile(config, work, args))
        if "predict" in args.stages:
            record["scenarios"] = stage_predict(config, work, args)
        args.work_dir.mkdir(parents=True, exist_ok=True)
        state_path.write_text(json.dumps(state, indent=1))
        print(f"{name}: {', '.join(args.stages)} done", flush=True)
    if any(s in args.stages for s in ("workflow", "replay", "profile")):
        state["device"] = device_facts(args.backend)
        state_path.write_text(json.dumps(state, indent=1))
    if "report" in args.stages:
        document = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                    "device": state.get("device", {}), "scenario_space": args.scenario_space,
                    "num_layers": args.num_layers, "dtype": args.dtype,
                    "workloads": [state["workloads"][config_model_name(c)] for c in args.configs]}
        write_report(args.output, document)
        print((args.output / "README.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
