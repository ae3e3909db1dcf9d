#!/usr/bin/env python
"""End to end: a database built for a model's scenario space predicts steps of that model nobody profiled.

For each workload (a transformers config.json; random weights, nothing downloaded; models that are not in
config/models.yaml):

  0. workflow   the database as a user builds it (the device): `snakemake --resources gpu=1` in a copy of the
                workflow, with a config naming the model's config.json as the workload (profiled at --profile-prefill
                and decode --profile-decode-batches x --profile-context: the workflow builds a database for its
                workload, so a queries-only database needs one too; with msmodeling's recorder it runs the step
                msmodeling predicts, paged and a MoE model's experts as its MoE layer, balanced: the power the
                generated rows replay at with --unprofiled-power workload) and as the grid's target, its queries over
                --scenario-space the only generated rows (grid.queries_only), recorded by --recorder (msmodeling:
                its own runner, bfloat16 rows, the way docs/msmodeling.md builds "A database for msmodeling";
                transformers: opperf's recorder, as before), replay with stage 4b, database, check, predictions of
                the held-out scenarios (predict.runner auto: msmodeling's runner on a database of its queries); the
                database lands where the later stages read it. Stages 1-2 are the same without a profile, by hand.
                --check-on-host leaves the check out (a MoE model's, msmodeling at every point, between them and at
                the expert-split token counts, does not fit one device command beside the build).
  0b. check     the workflow's database check (its rule's gates) on the database the device built, here on the host
  1. grid       scripts/generate_shape_grid.py --consumer-models CONFIG --queries-only --scenario-space SPACE
                --consumer-recorder RECORDER: the model's queries over the scenario space (config/scenarios.yaml),
                one row each (host; no device needed)
  2. replay     scripts/replay.py --database-path on those rows (the device), repetitions chosen per row by
                --time-budget-s; then scripts/build_database.py directory (kernel CSVs + op_mapping.yaml) and
                msmodeling-device (the DeviceProfile msmodeling's CLI loads)
  3. profile    scripts/profile_workload.py at the held-out scenarios (the device), twice: `--kv-cache paged` (the
                step msmodeling predicts: a paged KV cache written and read by opperf.consumer.paged_attention's
                kernels, under held_out/paged/) and `--kv-cache dynamic` (the transformers eager step, its
                DynamicCache, under held_out/dynamic/): prefill lengths and decode batches x contexts between the
                space's points, in-workload, --profile-iterations passes. A MoE model's paged step runs its experts
                as msmodeling's MoE layer does (`--experts-implementation tensor_cast`: its graph, an MLP of three
                GEMMs per expert, opperf.workload.tensor_cast_experts), and once more with the model's own
                grouped_mm experts (held_out/paged_grouped_mm/: what msmodeling's graph differs from, op by op),
                every variant `--routing balanced` (each expert an even share of the tokens, as msmodeling splits
                them; --no-balanced-routing: the random model's own router)
  4. predict    each held-out scenario's queries answered from the database by opperf's model of msmodeling's
                runtime (opperf.consumer.predict) against the eager profile (host)
  5. msmodeling msmodeling's own runner on the database (opperf.consumer.msmodeling_predict.runner_predictions: its
                unchanged CLI through the launcher with the database's msmodeling_device.py, at --num-layers, with
                its chrome trace) for each held-out scenario, against both profiles (host)

Measured (the ground truth) is what a performance model predicts: the device time of the step, Σ over its kernels
(and memcpy/memset) launched inside the step's record_function range, mean over the passes. Per row: the
profile's calls grouped as TensorCast sees them — a kernel belongs to the outermost op of its launch's op stack
that torch does not decompose (no CompositeImplicitAutograd kernel: `linear` is `mm`, `to` is `_to_copy`), keyed
by (op, tensor input shapes, dtypes) — against the prediction's answer for the same key; row error |pred/meas - 1|.
`paired_time_share` says how much of the measured step time such pairs cover (the rest: calls whose key the
recording did not issue, e.g. an attention backend other than the one the recorder assumed).

msmodeling's answer per op (its trace's events, grouped by op name without the overload) is paired with the measured
paged step's kernels of the same op (grouped by their dispatch op, or by a record_function range of the step's own
inside it) through OP_PAIRS: TensorCast's attention and cache write against the paged kernels' ops, its GEMMs
against mm/addmm (and a MoE model's grouped GEMMs), its MoE routing ops against the tensor_cast experts' ranges
(grouped_mm experts: transformers' sort/histc/masking), its rotary table lookup against the transformers rotary's
cos/sin; any other op by its own name. What one side has and the other lacks is `graph_differences`, with its
time. msmodeling's trace gives each call's answer in whole µs, so a pair of n calls is known to ±n/2 µs: each pair's
`error_beyond_trace_rounding` is the part of its error that rounding does not explain.

Writes `e2e_prediction.json` and `README.md` in --output: `device`, and `workloads: [{name, unseen: true,
recorder, grid_rows, replay_s, profile_s, held_out_profile_s, scenarios: [{name, measured_paged_us,
measured_eager_us, msmodeling: {predicted_us, m1_hit_rate, misses: [{op, reason}], zero_cost_ops_with_device_work,
...}, msmodeling_vs_paged, per_op: [{op, msmodeling_ops, measured_ops, predicted_us, measured_us, error,
msmodeling_calls, error_beyond_trace_rounding}], per_op_median_error, per_op_median_error_beyond_trace_rounding,
graph_differences: {msmodeling_only, measured_only}, and for a MoE model measured_paged_grouped_mm_us,
msmodeling_vs_paged_grouped_mm, grouped_mm: {per_op, ..., graph_differences}}]}]` (the msmodeling stage's), and the
predict stage's
opperf-model fields in the same scenarios (predicted_us, measured_us: the eager step, status_time_share,
row_median_error, row_p90_error, paired_time_share). Stages run separately (`--stages workflow profile` on the device
machine, `--stages msmodeling report` here, predict too for opperf's model) with one --work-dir.
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
from opperf.replay.methods import DEFAULT_HEATER_MIN_POWER_W  # noqa: E402

STAGES = ("workflow", "check", "grid", "replay", "profile", "predict", "msmodeling", "report")
RECORDERS = ("msmodeling", "transformers")
KV_CACHES = ("paged", "dynamic")             # held_out/<kv cache>/: the step msmodeling predicts, the eager step
# A MoE model's paged step runs its experts as msmodeling's MoE layer does (the step msmodeling predicts), and
# once more with transformers' grouped_mm experts (held_out/paged_grouped_mm/), the model's own step.
GROUPED_MM = "paged_grouped_mm"
PROFILE_OPTIONS = {"paged": ["--kv-cache", "paged"], "dynamic": ["--kv-cache", "dynamic"],
                   GROUPED_MM: ["--kv-cache", "paged", "--experts-implementation", "grouped_mm"]}
MOE_PAGED_EXPERTS = ["--experts-implementation", "tensor_cast"]
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
                   consumer_dtype(args), "--consumer-recorder", args.recorder, "--scenarios", str(args.scenarios),
                   "--scenario-space", args.scenario_space, "--queries-only", "--num-layers", str(args.num_layers)],
                  work / "logs" / "grid.log")
    counts = {p.stem: sum(1 for _ in p.open()) - 1 for p in rows.glob("*.csv")}
    return {"recorder": args.recorder, "grid_rows": sum(counts.values()), "grid_kernel_types": len(counts),
            "grid_s": round(seconds, 1)}


def unprofiled_power(text: str) -> float | str:
    """--unprofiled-power: watts, or `workload` (the workflow's stage only: it has the workload's parsed rows)."""
    return text if text == "workload" else float(text)


def consumer_dtype(args) -> str:
    """The queries' dtype: msmodeling's runner builds in float16, which its runtime reads as bfloat16 rows."""
    return "bfloat16" if args.recorder == "msmodeling" else args.dtype


def replay_power_options(args) -> list[str]:
    if args.unprofiled_power == "workload":
        raise SystemExit("--unprofiled-power workload needs the workflow's stage (--stages workflow): the replay "
                         "stage alone has no workload profile")
    return [] if args.unprofiled_power is None else ["--unprofiled-power", str(args.unprofiled_power)]


def stage_replay(work: Path, args) -> dict:
    rows = database_rows(work, args)
    seconds = run([sys.executable, "scripts/replay.py", "--database-path", str(rows), "--backend", args.backend,
                   "--repeat-count", str(args.repeat_count), "--time-budget-s", str(args.time_budget_s),
                   *replay_power_options(args)],
                  work / "logs" / "replay.log")
    database = work / "database" / args.device / "torch" / args.version_dir
    run([sys.executable, "scripts/build_database.py", "directory", "--rows-dir", str(rows), "--device", args.device,
         "--output", str(database), "--overwrite"], work / "logs" / "build.log")
    from opperf.consumer.msmodeling_predict import DEVICE_PROFILE

    run([sys.executable, "scripts/build_database.py", "msmodeling-device", "--device", args.device, "--output",
         str(database / DEVICE_PROFILE)], work / "logs" / "build_device.log")
    return {"replay_s": round(seconds, 1)}


def workflow_config(config: Path, args) -> dict:
    """The config a user writes to build a database for their model with the workflow: the model's config.json as
    the workload (profiled at --profile-prefill and decode --profile-decode-batches x --profile-context; the
    workflow builds a database for a workload or a registered source, so a queries-only database keeps it) and as
    the grid's one target, its queries over --scenario-space recorded by --recorder the only generated rows,
    replayed with stage 4b, the held-out scenarios predicted (stage 7b; runner auto: msmodeling's own on a database
    of its queries)."""
    model = str(config.resolve())
    held_out = [f"prefill:{t}" for t in args.held_out_prefill] + [
        f"decode:{b}x{c}" for c, batches in args.held_out_decode.items() for b in batches]
    return {"sources": "config/e2e_sources.tsv",
            "workload": {"backend": args.backend, "device": args.device, "model": model, "dtype": args.dtype,
                         "num_layers": args.num_layers, "prefill_lengths": args.profile_prefill, "decode_steps": 1,
                         "decode_context": args.profile_context, "decode_batch_sizes": args.profile_decode_batches,
                         "profile_iterations": args.profile_iterations, **workload_as_consumer(config, args)},
            "grid": {"target_models": [model], "consumer_queries": True, "consumer_dtype": consumer_dtype(args),
                     "consumer_recorder": args.recorder, "scenario_space": args.scenario_space, "queries_only": True},
            "replay": {"backends": [args.backend], "repeat_count": args.repeat_count,
                       "time_budget_s": args.time_budget_s, "unprofiled_power": args.unprofiled_power,
                       "phase": {"enabled": True, "backends": [args.backend]}},
            # With msmodeling's recorder the host's msmodeling stage predicts the held-out steps at the profiled depth
            # (--num-layers); the workflow's own predictions would run its runner at the model's full depth.
            "predict": {"enabled": args.recorder != "msmodeling", "scenarios": held_out, "dtype": args.dtype,
                        "runner": "auto"},
            "comm": {"enabled": False}}


def workload_as_consumer(config: Path, args) -> dict:
    """The workflow's workload runs the step msmodeling predicts, as the held-out paged step does (stage_profile):
    paged KV cache, a MoE model's experts as msmodeling's MoE layer runs them with balanced routing. Its rows are not
    in a queries-only database; its power is what `--unprofiled-power workload` gives the generated rows."""
    if args.recorder != "msmodeling":
        return {}
    moe = {"experts_implementation": "tensor_cast", **({"routing": "balanced"} if args.balanced_routing else {})}
    return {"kv_cache": "paged", **(moe if is_moe(config) else {})}


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
    targets = [f"results/{target}/database_manifest.tsv"]
    if not args.check_on_host:
        targets.append(f"reports/{target}/database_check.json")
    if args.recorder != "msmodeling":
        targets.append(f"reports/{target}/predictions.json")
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if args.recorder == "msmodeling":
        # The copy of the workflow lies elsewhere: it finds the checkout this project finds, not one beside it.
        from opperf.consumer.msmodeling_env import find_msmodeling

        install = find_msmodeling()
        if install is None:
            raise SystemExit("--recorder msmodeling: no msmodeling checkout (set OPPERF_MSMODELING_DIR or lay it in "
                             "../shared/msmodeling)")
        environment["OPPERF_MSMODELING_DIR"] = str(install.directory)
    began = time.perf_counter()
    log_path = work / "logs" / "workflow.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w", encoding="utf-8") as log:
        done = subprocess.run([sys.executable, "-m", "snakemake", "--cores", str(args.cores), "--resources", "gpu=1",
                               "--scheduler", "greedy",
                               "--configfile", "e2e.yaml", "--keep-going", *targets], cwd=root, stdout=log,
                              stderr=subprocess.STDOUT, env=environment)
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
    power = args.unprofiled_power
    if power == "workload":                    # what the replay jobs read (scripts/replay.py --unprofiled-power-from)
        from opperf.replay.cli import workload_power

        power = workload_power(root / "results" / target / "parsed")[0]
    return {"database": "workflow", "recorder": args.recorder, "workflow_s": round(seconds, 1), "grid_rows": generated,
            "replay_unprofiled_power": args.unprofiled_power, "replay_unprofiled_power_w": power,
            "profiled_rows": profiled, "grid_kernel_types": len(layouts),
            "profile_s": job_seconds(f"workload/{target}.tsv"), "grid_s": job_seconds(f"grid/{target}.tsv"),
            "replay_s": job_seconds(f"replay/{target}/*.tsv", but="phase_replay.tsv"),
            "phase_replay_s": job_seconds(f"replay/{target}/phase_replay.tsv"),
            **({} if args.check_on_host else {"database_check_passed": bool(check.get("passed"))}),
            "workflow_exit": done.returncode}


def stage_check(config: Path, work: Path, args) -> dict:
    """The workflow's database check (its rule `database_check`, the same gates) run here on the database the
    device built: msmodeling records and answers on the CPU, and a MoE model's check (msmodeling at every point and
    between) does not fit beside the build in one device command (`--check-on-host` there)."""
    from opperf.consumer.msmodeling_env import find_msmodeling

    install = find_msmodeling()
    if install is None:
        raise SystemExit("check: no msmodeling checkout (set OPPERF_MSMODELING_DIR or lay it in ../shared/msmodeling)")
    model = str(config.resolve())
    database = work / "database" / args.device / "torch" / args.version_dir
    report = work / "check"
    report.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "scripts/check_database.py", str(database), "--json", str(report / "check.json"),
               "--markdown", str(report / "check.md"), "--models", "config/models.yaml", "--grid-config",
               "config/grid.yaml", "--target-models", model, "--consumer-models", model, "--consumer-dtype",
               consumer_dtype(args), "--scenarios", str(args.scenarios), "--scenario-space", args.scenario_space,
               "--consumer-recorder", args.recorder, "--msmodeling", str(install.directory), "--devices",
               "config/devices.yaml"]
    began = time.perf_counter()
    log_path = work / "logs" / "check.log"
    with open(log_path, "w", encoding="utf-8") as log:
        done = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    check = json.loads((report / "check.json").read_text()) if (report / "check.json").is_file() else {}
    return {"database_check_passed": done.returncode == 0 and bool(check.get("passed")),
            "database_check_s": round(time.perf_counter() - began, 1), "database_check_where": "host"}


def is_moe(config: Path) -> bool:
    """Whether the model transformers builds from the config.json has experts (expert_layout, on meta), whatever
    its config calls them."""
    from opperf.workload.transformers_model import expert_layout, read_config

    return expert_layout(read_config(config), config) is not None


def stage_profile(config: Path, work: Path, args) -> dict:
    """Each held-out scenario profiled with each KV cache: the paged step msmodeling predicts, the eager one."""
    moe = is_moe(config)
    variants = [*KV_CACHES, *([GROUPED_MM] if moe else [])]
    # A MoE model's experts get even shares of each step's tokens, as msmodeling's layer splits them and a trained
    # router spreads them (opperf.workload.routing; --no-balanced-routing: the random model's own router's).
    routing = ["--routing", "balanced"] if moe and args.balanced_routing else []
    seconds = {variant: 0.0 for variant in variants}
    common = [sys.executable, "scripts/profile_workload.py", "--backend", args.backend, "--transformers-config",
              str(config), "--num-layers", str(args.num_layers), "--dtype", args.dtype, "--decode-steps", "1",
              "--profile-iterations", str(args.profile_iterations)]
    plans = [("prefill", ["--prefill-lengths", *map(str, args.held_out_prefill), "--decode-steps", "0"])]
    plans += [(f"decode_c{context}", ["--prefill-lengths", "1", "--decode-context", str(context),
                                      "--decode-batch-sizes", *map(str, batches)])
              for context, batches in args.held_out_decode.items()]
    for variant in variants:
        for name, plan in plans:
            experts = MOE_PAGED_EXPERTS if moe and variant == "paged" else []
            seconds[variant] += run(common + plan + [*PROFILE_OPTIONS[variant], *experts, *routing, "--output",
                                                     str(work / "held_out" / variant / name)],
                                    work / "logs" / f"profile_{variant}_{name}.log")
    return {"held_out_profile_s": round(sum(seconds.values()), 1), **({"routing": "balanced"} if routing else {}),
            **{f"profile_{kv_cache}_s": round(value, 1) for kv_cache, value in seconds.items()}}


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
    """Per step label (`prefill_640`, `decode_b12_0`): `device_us` (Σ device time per pass), `calls` {key:
    [device time of each call]} over every pass, and `ops_us` {op: device time per pass}, from a torch.profiler
    Chrome trace. An `ops_us` op is the innermost record_function range of the step's own that the launch lies in
    (the paged step's, where it names its kernels' function), else the dispatch op as `aten.<name>`."""
    import bisect

    events = json.loads(trace_path.read_text(encoding="utf-8"))["traceEvents"]
    ops_by_tid: dict = defaultdict(list)
    steps, ranges = [], defaultdict(list)
    launches, device = {}, []
    for event in events:
        cat = event.get("cat")
        if cat == "cpu_op" and event.get("name", "").startswith("aten::"):
            ops_by_tid[event.get("tid")].append(event)
        elif cat == "user_annotation" and event.get("name", "").startswith(("prefill_", "decode_")):
            steps.append(event)
        elif cat == "user_annotation":
            ranges[event.get("tid")].append(event)
        elif cat in ("cuda_runtime", "cuda_driver") and "correlation" in event.get("args", {}):
            launches[event["args"]["correlation"]] = event
        elif cat in DEVICE_KINDS:
            device.append(event)
    for ops in ops_by_tid.values():
        ops.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
    for tid, named in ranges.items():               # the steps' own ranges, not one around the passes
        ranges[tid] = [r for r in named if any(
            s.get("tid") == tid and s["ts"] <= r["ts"] and r["ts"] + r.get("dur", 0) <= s["ts"] + s.get("dur", 0)
            for s in steps)]
    starts = {tid: [e["ts"] for e in ops] for tid, ops in ops_by_tid.items()}
    parent: dict[int, dict | None] = {}            # each op's innermost enclosing op (ops nest on a thread)
    for ops in ops_by_tid.values():
        stack: list[dict] = []
        for op in ops:
            while stack and stack[-1]["ts"] + stack[-1].get("dur", 0) < op["ts"]:
                stack.pop()
            parent[id(op)] = stack[-1] if stack else None
            stack.append(op)
    composite: dict[str, bool] = {}

    def dispatch_op(tid, ts):
        """The outermost op enclosing host time `ts` that torch does not decompose. The ops enclosing it are the
        last op started by then and its ancestors (a linear scan of every earlier op made a trace of a million
        ops, a MoE step's expert loop, take hours)."""
        ops = ops_by_tid.get(tid, [])
        index = bisect.bisect_right(starts.get(tid, []), ts) - 1
        op = ops[index] if index >= 0 else None
        enclosing = []
        while op is not None:
            if op["ts"] + op.get("dur", 0) >= ts:
                enclosing.append(op)
            op = parent[id(op)]
        for op in reversed(enclosing):             # outermost first
            name = op["name"]
            if name not in composite:
                composite[name] = _composite(name)
            if not composite[name]:
                return op
        return None

    def op_name(tid, ts, op) -> str:
        """The innermost range enclosing host time `ts`, else the dispatch op's name."""
        enclosing = [r for r in ranges.get(tid, []) if r["ts"] <= ts <= r["ts"] + r.get("dur", 0)]
        if enclosing:
            return min(enclosing, key=lambda r: r.get("dur", 0))["name"]
        return "aten." + op["name"].removeprefix("aten::") if op is not None else "(no aten op)"

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
            result.setdefault(step, {"device_us": 0.0, "calls": defaultdict(list), "ops_us": defaultdict(float)})
            result[step]["device_us"] += kernel.get("dur", 0.0)
            op = dispatch_op(launch.get("tid"), launch["ts"])
            result[step]["ops_us"][op_name(launch.get("tid"), launch["ts"], op)] += kernel.get("dur", 0.0)
            if op is not None:
                per_call[(step, id(op))] += kernel.get("dur", 0.0)
                op_of[(step, id(op))] = op
    else:                                          # a cpu trace: the dispatch-level ops' own time
        for tid, ops in ops_by_tid.items():
            for op in ops:
                step = step_of(tid, op["ts"])
                if step is None or dispatch_op(tid, op["ts"] + 1e-3) is not op:
                    continue
                result.setdefault(step, {"device_us": 0.0, "calls": defaultdict(list), "ops_us": defaultdict(float)})
                result[step]["device_us"] += op.get("dur", 0.0)
                result[step]["ops_us"][op_name(tid, op["ts"], op)] += op.get("dur", 0.0)
                per_call[(step, id(op))] += op.get("dur", 0.0)
                op_of[(step, id(op))] = op
    for (step, _), us in per_call.items():
        op = op_of[(step, _)]
        result[step]["calls"][_key(op["name"], op.get("args", {}))].append(us)
    for step, value in result.items():
        value["device_us"] /= max(1, len(passes[step]))
        value["ops_us"] = {name: us / max(1, len(passes[step])) for name, us in value["ops_us"].items()}
        value["passes"] = len(passes[step])
    return result


def _scenario_of(label: str, batch_size: int):
    """`prefill_640` -> ('prefill', 640); `decode_b12_0` -> ('decode', 12); `decode_0` (a profile of one decode
    batch, the plan's batch_size) -> ('decode', batch_size)."""
    if label.startswith("prefill_"):
        return "prefill", int(label.split("_")[1])
    part = label.split("_")[1]
    return "decode", int(part.removeprefix("b")) if part.startswith("b") else batch_size


def held_out_profiles(work: Path, kv_cache: str) -> list[Path]:
    """The held-out profiles of one KV cache (held_out/<kv cache>/*); a work dir of before the paged step holds
    the eager ones directly in held_out/."""
    root = work / "held_out" / kv_cache
    if not root.is_dir() and kv_cache == "dynamic":
        root = work / "held_out"
    return sorted(p for p in root.iterdir() if (p / "workload.json").is_file()) if root.is_dir() else []


def measured_by_scenario(work: Path, kv_cache: str) -> dict[str, list[dict]]:
    """Held-out scenario (`prefill:640`, `decode:12x1024`) -> measured_steps' value of each of its steps (a decode
    profile's one step per batch; a prefill's from the profiles of prefill alone)."""
    by_scenario: dict = defaultdict(list)
    for profile in held_out_profiles(work, kv_cache):
        plan = json.loads((profile / "workload.json").read_text())["plan"]
        for label, value in measured_steps(profile / "trace.json").items():
            phase, size = _scenario_of(label, plan["batch_size"])
            if phase == "prefill" and plan["decode_steps"] == 0:
                by_scenario[f"prefill:{size}"].append(value)
            elif phase == "decode":
                by_scenario[f"decode:{size}x{plan['decode_context']}"].append(value)
    return dict(by_scenario)


# --- predict ------------------------------------------------------------------------------------------------

def stage_predict(config: Path, work: Path, args) -> list[dict]:
    import torch

    from opperf.consumer.model_queries import model_source, scenario_name
    from opperf.consumer.predict import predict
    from opperf.consumer.scenarios import Scenario, parse_scenario_text
    from opperf.consumer.status import PREDICTION_STATUSES

    database_dir = work / "database" / args.device / "torch" / args.version_dir
    source = model_source(str(config), str(ROOT / "config" / "models.yaml"), num_layers=args.num_layers)
    by_scenario: dict = {}                          # held-out scenario -> its steps' measurements, every profile's
    for text, values in measured_by_scenario(work, "dynamic").items():
        given = parse_scenario_text(text)
        by_scenario[Scenario(source.name, 1, given.phase, given.batch, given.tokens, given.context)] = values
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


# --- msmodeling's own runner ----------------------------------------------------------------------------

# TensorCast's op -> the measured paged step's ops that compute it: (msmodeling's ops: its trace's events, the
# overload dropped; the measured step's ranges: a record_function range the paged step puts around the call; the
# measured step's ops where it has no such range: measured_steps' aten.<dispatch op>). Any op not listed pairs with
# the op of its own name on the other side.
OP_PAIRS = {
    # opperf.consumer.paged_attention.paged_attention, which the replay times whole: each call's output buffer
    # (empty_like, then copy_ into it), the blocks gathered with index_select, SDPA
    "tensor_cast.attention": (("tensor_cast.attention",), ("tensor_cast.attention", "paged_attention"), (
        "aten.index_select", "aten._scaled_dot_product_flash_attention", "aten._scaled_dot_product_efficient_attention",
        "aten._scaled_dot_product_cudnn_attention", "aten._scaled_dot_product_flash_attention_for_cpu",
        "aten._flash_attention_forward", "aten._efficient_attention_forward", "aten.empty_like", "aten.copy_")),
    # its reshape_and_cache: one index_copy_ into the slots per half
    "tensor_cast.reshape_and_cache": (("tensor_cast.reshape_and_cache",),
                                      ("tensor_cast.reshape_and_cache", "reshape_and_cache"), ("aten.index_copy_",)),
    # linear layers: mm (addmm with a bias) on both sides; a MoE model's experts: msmodeling's mm per expert,
    # the measured step's grouped GEMMs (transformers' grouped_mm experts)
    "matmul": (("aten.mm", "aten.addmm"), (), ("aten.mm", "aten.addmm", "aten._grouped_mm")),
    # a MoE layer's token routing: TensorCast's permute and unpermute (the tensor_cast experts' ranges around
    # opperf.consumer.moe_routing's kernels); grouped_mm experts: the sort of the expert ids, the per-expert counts
    # and offsets, the masking of the padded rows
    "MoE token routing": (("tensor_cast.init_routing_v2", "tensor_cast.unpermute_tokens"),
                          ("tensor_cast.init_routing_v2", "tensor_cast.unpermute_tokens"), (
        "aten.sort", "aten.histc", "aten.cumsum", "aten.masked_fill", "aten.masked_fill_", "aten.index_put_",
        "aten.floor_divide", "aten.clamp_")),
    # the rotary cos/sin: TensorCast looks them up in its table (index_select), transformers computes them
    "rotary cos/sin": (("aten.index_select",), (), ("aten.cos", "aten.sin")),
}


def _op_group(name: str, side: str, ranged: set[str]) -> str:
    """The OP_PAIRS entry `name` belongs to on `side` (msmodeling, measured), else itself. A measured op counts
    for an entry only where the step has none of the entry's ranges (`ranged`: the entries it has ranges of)."""
    for group, (msmodeling, ranges, fallback) in OP_PAIRS.items():
        if side == "msmodeling" and name in msmodeling:
            return group
        if side == "measured" and (name in ranges or (name in fallback and group not in ranged)):
            return group
    return name


def pair_ops(predicted: dict[str, dict], measured: dict[str, float]) -> dict:
    """msmodeling's answer per op (runner by_op: {op: {us, ...}}) against the measured step's time per op (ops_us):
    the pairs with their error |predicted / measured - 1|, their median, and the ops only one side has, with their
    time (an op neither side spends time on is left out). msmodeling's trace gives each call's answer rounded to
    a whole µs, so a pair of n calls is known to ±n/2 µs: `error_beyond_trace_rounding` is the part of the error
    no rounding explains (the distance from the measured time to that interval, over the measured time)."""
    ranged = {group for group, (_, ranges, _) in OP_PAIRS.items() if set(ranges) & set(measured)}
    groups: dict = defaultdict(lambda: {"msmodeling_ops": set(), "measured_ops": set(), "predicted_us": 0.0,
                                        "measured_us": 0.0, "calls": 0})
    for op, entry in predicted.items():
        name = ".".join(op.split(".")[:2])
        group = groups[_op_group(name, "msmodeling", ranged)]
        group["msmodeling_ops"].add(name)
        group["predicted_us"] += entry["us"]
        group["calls"] += entry.get("calls", 0)
    for name, us in measured.items():
        group = groups[_op_group(name, "measured", ranged)]
        group["measured_ops"].add(name)
        group["measured_us"] += us
    per_op, errors, beyond = [], [], []
    differences = {"msmodeling_only": [], "measured_only": []}
    for name, group in sorted(groups.items(), key=lambda item: -max(item[1]["predicted_us"],
                                                                     item[1]["measured_us"])):
        predicted_us, measured_us = round(group["predicted_us"], 3), round(group["measured_us"], 3)
        if group["msmodeling_ops"] and group["measured_ops"]:
            error = round(abs(predicted_us / measured_us - 1), 4) if measured_us else None
            unexplained = round(max(0.0, abs(predicted_us - measured_us) - group["calls"] / 2) / measured_us,
                                4) if measured_us else None
            if error is not None:
                errors.append(error)
                beyond.append(unexplained)
            per_op.append({"op": name, "msmodeling_ops": sorted(group["msmodeling_ops"]),
                           "measured_ops": sorted(group["measured_ops"]), "predicted_us": predicted_us,
                           "measured_us": measured_us, "error": error, "msmodeling_calls": group["calls"],
                           "error_beyond_trace_rounding": unexplained})
        elif group["msmodeling_ops"] and predicted_us > 0:
            differences["msmodeling_only"].append({"op": name, "msmodeling_ops": sorted(group["msmodeling_ops"]),
                                                   "predicted_us": predicted_us})
        elif group["measured_ops"] and measured_us > 0:
            differences["measured_only"].append({"op": name, "measured_ops": sorted(group["measured_ops"]),
                                                 "measured_us": measured_us})
    return {"per_op": per_op, "per_op_median_error": round(statistics.median(errors), 4) if errors else None,
            "per_op_median_error_beyond_trace_rounding": round(statistics.median(beyond), 4) if beyond else None,
            "graph_differences": differences}


def zero_cost_ops_with_device_work(database: Path, by_op: dict[str, dict]) -> list[dict]:
    """The ops msmodeling answered zero_cost or accepted_miss (its trace's `zero_cost`) whose kernel type's rows in
    the database (the op mapping's kernel type, and the op's own name as one) ran device work: a positive replayed
    duration."""
    from opperf.consumer.runtime import load_op_mapping
    from opperf.contract import REPLAY_AVERAGE
    from opperf.io import read_database_csv

    mappings = load_op_mapping(database).get("operator_mappings") or {}
    found = []
    for op, entry in by_op.items():
        if not entry["zero_cost_calls"]:
            continue
        kernel_types = {(mappings.get(op) or {}).get("kernel_type"), op.split(".")[1]} - {None, ""}
        for kernel_type in sorted(kernel_types):
            path = database / "layouts" / f"{kernel_type}.csv"
            if not path.is_file():
                continue
            durations = [float(d) for d in read_database_csv(path).get(REPLAY_AVERAGE, []) if str(d).strip()]
            positive = [d for d in durations if d > 0]
            if positive:
                found.append({"op": op, "kernel_type": kernel_type, "calls": entry["zero_cost_calls"],
                              "rows_with_duration": len(positive), "median_row_us": statistics.median(positive)})
    return found


def held_out_measured(work: Path, record: dict) -> dict[str, dict[str, list[dict]]]:
    """Variant (`paged`, `dynamic`, `paged_grouped_mm`) -> held-out scenario -> its steps' `device_us`, `ops_us`
    and `passes` (measured_steps'): from the held-out traces where the work dir has them, and then kept in the
    workload's record (state.json, committed with the results), else the record's. A later session rebuilds a
    database against the steps profiled before (same device kind, driver and torch: the record's
    `held_out_profile_date` and `device_run` say when) without profiling them again."""
    measured = {variant: {scenario: [{key: step[key] for key in ("device_us", "ops_us", "passes")} for step in steps]
                          for scenario, steps in measured_by_scenario(work, variant).items()}
                for variant in (*KV_CACHES, GROUPED_MM)}
    if any(measured.values()):
        record["held_out_measured"] = measured
        return measured
    if "held_out_measured" not in record:
        raise SystemExit(f"{work}: no held-out traces (held_out/<variant>/*/trace.json) and no held_out_measured in "
                         "the state's record: run the profile stage first")
    print(f"{record['name']}: the held-out steps as measured on {record.get('held_out_profile_date', '?')} "
          "(state.json's held_out_measured; no traces in the work dir)", flush=True)
    return record["held_out_measured"]


def stage_msmodeling(config: Path, work: Path, args, record: dict) -> list[dict]:
    """Each held-out scenario as msmodeling's own runner predicts it from the database, against the measured paged
    and eager steps, op by op against the paged one."""
    from opperf.consumer.msmodeling_env import find_msmodeling
    from opperf.consumer.msmodeling_predict import runner_predictions

    install = find_msmodeling()
    if install is None:
        raise SystemExit("no msmodeling checkout: set OPPERF_MSMODELING_DIR or lay it in ../shared/msmodeling")
    database = work / "database" / args.device / "torch" / args.version_dir
    measured = held_out_measured(work, record)
    paged, eager, grouped_mm = (measured.get(variant, {}) for variant in ("paged", "dynamic", GROUPED_MM))
    held_out = [f"prefill:{t}" for t in args.held_out_prefill] + [
        f"decode:{b}x{c}" for c, batches in args.held_out_decode.items() for b in batches]
    began = time.perf_counter()
    predictions = runner_predictions(install, database, config, held_out, num_layers=args.num_layers)
    seconds = time.perf_counter() - began
    scenarios = []
    for prediction in predictions:
        paged_steps, eager_steps = paged.get(prediction.scenario, []), eager.get(prediction.scenario, [])
        account = prediction.as_json()
        misses = list({(m["op"], m["reason"]): {"op": m["op"], "reason": m["reason"]}
                       for m in prediction.misses}.values())
        paged_us = statistics.mean(v["device_us"] for v in paged_steps) if paged_steps else None
        eager_us = statistics.mean(v["device_us"] for v in eager_steps) if eager_steps else None
        grouped_steps = grouped_mm.get(prediction.scenario, [])
        grouped_us = statistics.mean(v["device_us"] for v in grouped_steps) if grouped_steps else None
        scenarios.append({
            "name": prediction.scenario,
            "measured_paged_us": round(paged_us, 3) if paged_us is not None else None,
            "measured_eager_us": round(eager_us, 3) if eager_us is not None else None,
            "msmodeling": {"predicted_us": round(prediction.predicted_us, 3),
                           "m1_hit_rate": round(account["m1_hit_rate"], 4), "misses": misses,
                           "zero_cost_ops_with_device_work": zero_cost_ops_with_device_work(
                               database, prediction.by_op),
                           "m1_hit": prediction.m1_hit, "m1_total": prediction.m1_total,
                           "answered_share": round(prediction.answered_share, 4),
                           "trace_us": round(sum(op["us"] for op in prediction.by_op.values()), 3),
                           "msmodeling_commit": install.commit, "msmodeling_args": prediction.arguments},
            "msmodeling_vs_paged": round(prediction.predicted_us / paged_us, 4) if paged_us else None,
            **(pair_ops(prediction.by_op, mean_ops(paged_steps)) if paged_steps else {}),
            **({"measured_paged_grouped_mm_us": round(grouped_us, 3),
                "msmodeling_vs_paged_grouped_mm": round(prediction.predicted_us / grouped_us, 4),
                "grouped_mm": pair_ops(prediction.by_op, mean_ops(grouped_steps))} if grouped_us else {})})
    print(f"msmodeling's runner: {len(predictions)} scenarios in {seconds:.1f} s", flush=True)
    return scenarios


def mean_ops(steps: list[dict]) -> dict[str, float]:
    """measured_steps' ops_us averaged over a scenario's steps."""
    ops: dict = defaultdict(float)
    for value in steps:
        for op, us in value["ops_us"].items():
            ops[op] += us / len(steps)
    return dict(ops)


def merge_scenarios(record: dict, scenarios: list[dict]) -> None:
    """A stage's per-scenario fields into the workload's scenarios of the same name (each stage adds its own)."""
    by_name = {s["name"]: s for s in record.setdefault("scenarios", [])}
    for scenario in scenarios:
        if scenario["name"] in by_name:
            by_name[scenario["name"]].update(scenario)
        else:
            record["scenarios"].append(scenario)
            by_name[scenario["name"]] = scenario


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


def _us(value) -> str:
    return "–" if value is None else f"{value:.1f}"


def msmodeling_lines(document: dict) -> list[str]:
    """The report's table of msmodeling's runner against the measured paged and eager steps, per scenario."""
    lines = ["## msmodeling's own runner against the measured steps", "",
             "msmodeling's predicted step against the measured paged step (the step it models: paged KV cache, "
             "opperf.consumer.paged_attention's kernels) and the transformers eager one; `m1` its own account's "
             "hits; `zero-cost with work` the ops it answered zero_cost/accepted_miss whose database rows ran "
             "device work; per-op error over the ops both have (OP_PAIRS); graph differences: the ops one side "
             "has and the other lacks, with their time; in brackets the median error beyond the whole-µs rounding "
             "of msmodeling's trace. A MoE model's paged step runs its experts as msmodeling's MoE layer does "
             "(opperf.workload.tensor_cast_experts); `paged, grouped_mm` is the same step with the model's own "
             "grouped GEMM experts, against which msmodeling's graph differs (the JSON's `grouped_mm`, op by op).",
             "",
             "| workload | scenario | msmodeling µs | paged µs | eager µs | msm/paged | paged, grouped_mm µs | "
             "msm/that | m1 | misses | zero-cost with work | per-op median err | graph differences |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---|"]
    for workload in document["workloads"]:
        for s in workload.get("scenarios", []):
            runner = s.get("msmodeling")
            if runner is None:
                continue
            differences = s.get("graph_differences", {})
            said = [f"msmodeling only: {d['op']} {d['predicted_us']:.1f} µs" for d in differences.get(
                "msmodeling_only", [])] + [f"measured only: {d['op']} {d['measured_us']:.1f} µs"
                                           for d in differences.get("measured_only", [])]
            misses = ", ".join(f"{m['op']} ({m['reason']})" for m in runner["misses"]) or "none"
            free = ", ".join(f"{z['op']} ({z['kernel_type']})" for z in runner["zero_cost_ops_with_device_work"])
            lines.append(f"| {workload['name']} | {s['name']} | {_us(runner['predicted_us'])} | "
                         f"{_us(s.get('measured_paged_us'))} | {_us(s.get('measured_eager_us'))} | "
                         f"{s.get('msmodeling_vs_paged')} | {_us(s.get('measured_paged_grouped_mm_us'))} | "
                         f"{s.get('msmodeling_vs_paged_grouped_mm', '–')} | {runner['m1_hit_rate']} | {misses} | "
                         f"{free or 'none'} | {s.get('per_op_median_error')} "
                         f"({s.get('per_op_median_error_beyond_trace_rounding', '–')}) | "
                         f"{'; '.join(said) or 'none'} |")
    return lines + [""]


def _generated_power(workload: dict) -> str:
    """How the generated rows' short calls were replayed: the power taken for them (--unprofiled-power), against the
    heater's limit."""
    power = workload.get("replay_unprofiled_power_w")
    if power is None:
        return "none given: heated"
    said = "the workload's" if workload.get("replay_unprofiled_power") == "workload" else "given"
    heated = "heated" if power >= DEFAULT_HEATER_MIN_POWER_W else "no heater"
    return f"{power:.1f} W ({said}): {heated}"


def _check(workload: dict) -> str:
    if "database_check_passed" not in workload:
        return "–"
    where = f" ({workload['database_check_where']}, {workload.get('database_check_s')} s)" if workload.get(
        "database_check_where") else ""
    return ("passed" if workload["database_check_passed"] else "failed") + where


def write_report(output: Path, document: dict) -> None:
    from opperf.consumer.status import PREDICTION_STATUSES, AnswerStatus
    from opperf.io import write_text_atomic

    output.mkdir(parents=True, exist_ok=True)
    write_text_atomic(output / "e2e_prediction.json", json.dumps(document, indent=1) + "\n")
    lines = [f"# End-to-end prediction ({document['date'][:10]})", "",
             f"{document.get('device', {}).get('device', '?')}; torch {document.get('device', {}).get('torch')}; "
             f"scenario space `{document['scenario_space']}`, {document['num_layers']} layers, {document['dtype']}. "
             f"Produced by `python benchmarks/e2e_prediction.py` (method in its docstring).", ""]
    lines += msmodeling_lines(document)
    predicted = [(w, s) for w in document["workloads"] for s in w.get("scenarios", []) if "predicted_us" in s]
    if predicted:
        lines += ["## opperf's model of msmodeling's runtime against the eager step", "",
                  "Status shares are of the predicted time; `MISS meas` is the share of the measured step time whose "
                  "query fell to roofline.", "",
                  "| workload | scenario | predicted µs | measured µs | pred/meas | EXACT | INTERP | ILLEGAL | MISS | "
                  "MISS meas | rows | row median err | row p90 err | paired time |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for workload, s in predicted:
        share = s["status_time_share"]
        lines.append(f"| {workload['name']} | {s['name']} | {s['predicted_us']:.1f} | {s['measured_us']:.1f} | "
                     f"{s['ratio']} | " + " | ".join(f"{100 * share[k]:.1f} %" for k in PREDICTION_STATUSES)
                     + f" | {100 * s.get('status_measured_share', {}).get(AnswerStatus.MISS, 0):.1f} %"
                     + f" | {s['rows']} | {s['row_median_error']} | {s['row_p90_error']} | "
                     f"{s['paired_time_share']} |")
    lines += ["", "| workload | recorder | grid rows | kernel types | workflow s | replay s | generated rows' power "
              "| database check | profile s (held out, every variant) |", "|---|---|---:|---:|---:|---:|---|---|---:|"]
    for workload in document["workloads"]:
        lines.append(f"| {workload['name']} | {workload.get('recorder', 'transformers')} | "
                     f"{workload.get('grid_rows')} | {workload.get('grid_kernel_types')} | {workload.get('workflow_s')} "
                     f"| {workload.get('replay_s')} | {_generated_power(workload)} | {_check(workload)} | "
                     f"{workload.get('held_out_profile_s')} |")
    write_text_atomic(output / "README.md", "\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--configs", nargs="+", type=Path, required=True, help="transformers config.json files")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/opperf_e2e"))
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "e2e_prediction")
    parser.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES))
    parser.add_argument("--recorder", choices=RECORDERS, default="msmodeling",
                        help="who records the model's queries for the database: msmodeling's own runner (bfloat16 "
                             "rows) or opperf's transformers recorder, as before (default: %(default)s)")
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
    parser.add_argument("--unprofiled-power", type=unprofiled_power, default=None, metavar="W|workload",
                        help="the replay's power for the generated rows (the workflow's replay.unprofiled_power): "
                             "under 180 W they replay without the heater GEMM; workload: the median power of the "
                             "workflow's own workload profile (default: none, they get the heater)")
    parser.add_argument("--profile-iterations", type=int, default=5)
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2, help="the workflow's --cores")
    parser.add_argument("--profile-prefill", type=int, nargs="+", default=[256, 1024, 4096],
                        help="the workflow's profiled prefill lengths (default: %(default)s)")
    parser.add_argument("--profile-decode-batches", type=int, nargs="+", default=[4, 32],
                        help="the workflow's profiled decode batches (default: %(default)s)")
    parser.add_argument("--profile-context", type=int, default=1024,
                        help="the workflow's profiled decode context (default: %(default)s)")
    parser.add_argument("--no-balanced-routing", dest="balanced_routing", action="store_false",
                        help="profile a MoE model's held-out steps with its random router's expert ids (which pile "
                             "the tokens onto a few experts) instead of balanced ones")
    parser.add_argument("--check-on-host", action="store_true",
                        help="leave the database check out of the workflow stage (run the `check` stage here later)")
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
        if "check" in args.stages:
            record.update(stage_check(config, work, args))
        if "grid" in args.stages:
            record.update(stage_grid(config, work, args))
        if "replay" in args.stages:
            record.update(stage_replay(work, args))
        if "profile" in args.stages:
            record.update(stage_profile(config, work, args))
        if "predict" in args.stages:
            merge_scenarios(record, stage_predict(config, work, args))
        if "msmodeling" in args.stages:
            merge_scenarios(record, stage_msmodeling(config, work, args, record))
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
