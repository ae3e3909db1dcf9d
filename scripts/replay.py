#!/usr/bin/env python
"""Stage 4: re-measure database rows on the device and write the results back by signature.

Two forms:

  workflow (one kernel type, what rules/replay.smk runs):
    replay.py --rows IN.csv --kernel mm --backend cpu --version-dir torch2.13.0_cpu --output OUT.csv

  database (the seed's start_microbench: every kernel CSV of a database directory, updated in place):
    replay.py --database-path data/CPU/torch/torch2.13.0_cpu [--op mm add] [--update-mode missing-only]
    replay.py --database-path out/ --version-dir torch2.13.0_cpu    (any directory, e.g. parse_kernel_details.py's)
    replay.py --device A3 --vllm-version 0.18.0 --torch-version 2.9.0 --cann-version 8.5
    replay.py --database-path DIR --prof-path PROF_000001_...   (NPU: write back an existing msprof profile)

How it measures (one method each, the one the measurements chose; docs/replay.md):
  cuda/npu cache state insitu: flushed, then the activation inputs made resident, weights cold
    (benchmarks/results/cuda_replay/: H100 median / p90 / time-weighted gap 2.3 / 9.8 / 4.3 %, flush 10.1 / 40.5 /
    5.2 %, none 7.9 / 24.8 / 6.7 %; benchmarks/results/insitu_copy/: warm inputs rewritten from a twin)
  cuda power state after-gemm: idle after a call of 0.2 ms or more as long as it took, a heater GEMM before each
    shorter one (benchmarks/results/cuda_replay_transformers/after_gemm/: median gap 4.4 -> 3.2 % (Mistral),
    4.2 -> 3.6 % (Qwen2-MoE, unseen), 3.3 -> 2.9 % (OLMoE, unseen) against cooldown)
  cuda timing: CUPTI device-kernel time per call, rows timed in profiler sessions of 128
  cpu timing: the op's torch.profiler time, as the profile timed it
    (benchmarks/results/cpu_replay/: median gap 27.5 %, wall clock 40.0 %)
  cpu cache state: an input the profile saw reused D MiB later takes turns over 1 + D/size copies (a first use,
    or a profile without distances: the definition's cold inputs over twice the last-level cache), the rest warm
    (benchmarks/results/cpu_replay/: idle Xeon mm 1.06-1.16 of profiled, 1.18 always cold; EPYC VM 0.66 warm)
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opperf.cli import EXIT_BAD_INPUT, add_logging_args, run_cli  # noqa: E402
from opperf.errors import OpperfError  # noqa: E402
from opperf.replay.engine import UPDATE_MODES  # noqa: E402
from opperf.replay.methods import DEFAULT_HEATER_MIN_POWER_W  # noqa: E402
from opperf.replay.slots import DEFAULT_SLOTS_DIR  # noqa: E402
from opperf.workflow_defaults import WORKFLOW_CONFIG, workflow_defaults  # noqa: E402

WORKFLOW = f"{Path(WORKFLOW_CONFIG).parent.name}/{Path(WORKFLOW_CONFIG).name}"


def build_parser() -> argparse.ArgumentParser:
    # By hand as in the workflow: the options that config/config.yaml's replay section sets default to its values.
    try:
        workflow = workflow_defaults("replay")
    except OpperfError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_argument_group("which rows (workflow form)")
    where.add_argument("--rows", help="a kernel type's CSV (the grid or parse stage's output)")
    where.add_argument("--kernel", help="the kernel type of --rows (the profiler's Type)")
    where.add_argument("--output", help="where the replayed CSV goes (written atomically)")
    where.add_argument("--version-dir", help="the stack the rows were profiled on (torch2.13.0_cpu, "
                                             "vllm0.18.0_torch2.9.0_cann8.5); replay refuses to measure on another. "
                                             "Database form: defaults to --database-path's directory name, so a "
                                             "directory not named after its stack (out/) needs it")
    where.add_argument("--trace-dir", help="traces/{device}/{stack}/{version_dir}: REPLAY/VERIFY/BACKFILL traces "
                                           "and the reproducer go under <trace-dir>/<kernel>/")
    db = parser.add_argument_group("which rows (database form, as the seed's start_microbench)")
    db.add_argument("--database-path", help="database directory to update in place")
    db.add_argument("--device", help="device key or full name (e.g. A3, ATLAS_800_A3_752T_128G_DIE, CPU), to derive "
                                     "data/{device}/{stack}/{version_dir} without --database-path")
    db.add_argument("--vllm-version", default="")
    db.add_argument("--torch-version", default="")
    db.add_argument("--cann-version", default="")
    db.add_argument("--data-root", default="data", help="root of the databases (default: %(default)s)")
    db.add_argument("--op", "--kernel-list", dest="ops", nargs="+", metavar="TYPE",
                    help="kernel types to replay (default: every CSV of the database)")
    db.add_argument("--prof-path", help="NPU: an existing PROF_* directory to write back instead of replaying")
    db.add_argument("--reports-dir", help="where the database form writes its report "
                                          "(default: <database>/reports)")
    how = parser.add_argument_group("how")
    how.add_argument("--backend", choices=["cpu", "cuda", "npu"],
                     help="back end to replay on (default: the device's back end, else cpu)")
    how.add_argument("--definitions", default="config/kernels", help="kernel definitions root (default: %(default)s)")
    how.add_argument("--definition", help="workflow form: the one definition file of --kernel ('' = none exists: "
                                          "every row is recorded no_definition); overrides --definitions")
    how.add_argument("--repeat-count", type=int, default=workflow["repeat_count"],
                     help=f"timed calls per row after the warm-up (default: %(default)s, {WORKFLOW} "
                          "replay.repeat_count; benchmarks/results/cuda_replay/: two H100 replays at 30 differ by "
                          "0.3 %% at the median, 1.1 %% at p90)")
    how.add_argument("--time-budget-s", type=float, metavar="S", default=workflow["time_budget_s"],
                     help="time per row: after --min-repeat-count timed calls, a row stops once its calls took S "
                          "seconds, and at --repeat-count calls at the latest (cpu: decided after each call; cuda: "
                          "the count is set from the warm-up's time per call). Recorded per row in Replay Timing "
                          f"Method. Default: {WORKFLOW} replay.time_budget_s, "
                          + (f"{workflow['time_budget_s']} s" if workflow["time_budget_s"] else
                             "off (every row gets --repeat-count calls)")
                          + " (benchmarks/results/e2e_prediction/: the H200 query databases, 0.02 s, at most 30 "
                          "calls)")
    how.add_argument("--min-repeat-count", type=int, default=workflow["min_repeat_count"],
                     help=f"with --time-budget-s: the fewest timed calls a row gets (default: %(default)s, {WORKFLOW} "
                          "replay.min_repeat_count; benchmarks/results/e2e_prediction/)")
    how.add_argument("--warmup-count", type=int, default=workflow["warmup_count"],
                     help=f"untimed calls first, the first of them verified (default: %(default)s, {WORKFLOW} "
                          "replay.warmup_count; benchmarks/results/cuda_replay/: the H100 accuracy, 2.3 / 9.8 / "
                          "4.3 %%, measured with 3)")
    how.add_argument("--update-mode", choices=UPDATE_MODES, default=workflow["update_mode"],
                     help="all: replay every row; missing-only: only rows without an Average Duration(us) "
                          f"(default: %(default)s, {WORKFLOW} replay.update_mode)")
    how.add_argument("--timeout-s", type=float, default=float(workflow["timeout_s"]),
                     help="a row running longer is killed and recorded failed_timeout (default: %(default)s, "
                          f"{WORKFLOW} replay.timeout_s)")
    how.add_argument("--max-restarts", type=int, default=workflow["max_restarts"],
                     help="fresh replay processes after crashes/timeouts before the rest is not_run "
                          f"(default: %(default)s, {WORKFLOW} replay.max_restarts)")
    how.add_argument("--fail-fast", action="store_true", help="stop at the first failed row, exit 2, write nothing")
    how.add_argument("--prune-invalid-rows", action="store_true",
                     help="drop rows that could not be built, run or verified (listed in the BACKFILL trace)")
    how.add_argument("--prune-empty-duration-rows", action="store_true",
                     help="drop rows with neither a replay nor a profiling duration after write-back")
    how.add_argument("--heater-min-power", type=float, default=DEFAULT_HEATER_MIN_POWER_W, metavar="W",
                     help="cuda: no heater GEMM before a short call the workload ran while the GPU drew less than W "
                          "watts (Profiling Average Power(W)): a nearly idle GPU, as in a loop of tiny expert kernels "
                          f"(benchmarks/results/heater_ab/: the reference MoE's expert silu/mul 1.09x with the heater, "
                          f"0.99x without; every other workload's short rows ran at 189 W or more). Default "
                          f"{DEFAULT_HEATER_MIN_POWER_W:.0f}; 0: every short call gets one")
    # replay.unprofiled_power: a number, null, or `workload` (the rule passes --unprofiled-power-from instead).
    unprofiled = workflow["unprofiled_power"] if workflow["unprofiled_power"] != "workload" else None
    how.add_argument("--unprofiled-power", type=float, metavar="W", default=unprofiled,
                     help="cuda: the power to take for rows without a profiled one (rows generated from shape "
                          "grids or a consumer's queries), as --heater-min-power reads it: under its W they get no "
                          "heater. A MoE step of msmodeling's expert loop ran at 124-181 W on the H200 "
                          "(benchmarks/results/e2e_prediction/msmodeling/gemm_row_vs_step/). Default: "
                          f"{WORKFLOW} replay.unprofiled_power, "
                          + (f"{unprofiled} W" if unprofiled is not None else "none: such rows are heated"))
    how.add_argument("--unprofiled-power-from", metavar="DIR",
                     help="cuda: take --unprofiled-power from the workload's profile, the call-weighted median of "
                          "Profiling Average Power(W) over the rows of its parsed directory DIR (the workflow passes "
                          "it for replay.unprofiled_power: workload)")
    how.add_argument("--seed", type=int, default=0,
                     help="random inputs of row i come from seed + i (default: %(default)s); another seed is an "
                          "independent replay")
    how.add_argument("--persistent-worker", action=argparse.BooleanOptionalAction, default=None,
                     help="replay in the device slot's long-lived replay process, which keeps torch imported and "
                          "the profiler started between jobs (default: on for cuda, off for cpu; never under msprof)")
    how.add_argument("--cpu-threads", type=int, default=workflow["cpu_threads"],
                     help=f"cpu: torch intra-op threads per replay (default: %(default)s, {WORKFLOW} "
                          "replay.cpu_threads; recorded in Replay Timing Method)")
    how.add_argument("--memory-fraction", type=float, default=workflow["memory_fraction"],
                     help="rows whose tensors exceed this fraction of device memory are skipped (default: "
                          f"%(default)s, {WORKFLOW} replay.memory_fraction)")
    how.add_argument("--device-ids", help="devices concurrent jobs share, e.g. 0,1,2,3 (default: all visible)")
    how.add_argument("--slots-dir", default=str(DEFAULT_SLOTS_DIR), help="device-slot lock files (default: %(default)s)")
    how.add_argument("--devices-catalog", default="config/devices.yaml")
    how.add_argument("--task-id", help="trace task id (default: $OPPERF_TASK_ID or a timestamp)")
    npu = parser.add_argument_group("npu (msprof; DispatchFFNCombine under torchrun)")
    npu.add_argument("--msprof", default="msprof", help="msprof executable")
    npu.add_argument("--aic-metrics", help="msprof --aic-metrics set (e.g. PipeUtilization)")
    npu.add_argument("--dispatch-ffn-combine-ep-size", type=int, default=16)
    npu.add_argument("--dispatch-ffn-combine-nproc-per-node", type=int)
    npu.add_argument("--dispatch-ffn-combine-nnodes", type=int, default=1)
    npu.add_argument("--dispatch-ffn-combine-node-rank", type=int, default=0)
    npu.add_argument("--dispatch-ffn-combine-master-addr", default="127.0.0.1")
    npu.add_argument("--dispatch-ffn-combine-master-port", type=int, default=29500)
    add_logging_args(parser)
    return parser


def main(args: argparse.Namespace) -> int:
    from opperf.replay.cli import run_replay_command

    return run_replay_command(args)


if __name__ == "__main__":
    sys.exit(run_cli(build_parser(), main))
