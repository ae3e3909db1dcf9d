"""What scripts/replay.py does with its arguments: the workflow form (one kernel CSV) or the database form."""

from __future__ import annotations

import argparse
import bisect
import tempfile
from itertools import accumulate
from pathlib import Path

from opperf import contract
from opperf.devices import Device, load_catalog, resolve_device
from opperf.errors import OpperfError
from opperf.log import get_logger
from opperf.replay.job import KernelJobResult, ReplaySettings, find_definition, memory_budget_for, replay_kernel_csv
from opperf.replay.slots import default_device_ids, parse_device_ids
from opperf.versions import StackVersions, npu_version_dir, parse_version_dir, running_stack

log = get_logger("replay.cli")


def _device(args: argparse.Namespace, database_dir: Path | None) -> Device | None:
    catalog = load_catalog(args.devices_catalog)
    if args.device:
        return resolve_device(args.device, catalog)
    if database_dir is not None and len(database_dir.parts) >= 3 and database_dir.parts[-3] in catalog:
        return catalog[database_dir.parts[-3]]    # data/{device}/{stack}/{version_dir}
    return None


def settings_from_args(args: argparse.Namespace, device: Device | None) -> ReplaySettings:
    backend = args.backend or (device.backend if device else "cpu")
    if not 0 < args.memory_fraction <= 1:
        raise OpperfError(f"must be in (0, 1], got {args.memory_fraction}", field="--memory-fraction")
    # Without a catalog device the budget is the host's RAM share on cpu, and unknown (no check) elsewhere.
    if device is not None:
        budget = memory_budget_for(device.memory_gb, backend, args.memory_fraction)
    else:
        budget = memory_budget_for(float("inf"), backend, args.memory_fraction) if backend == "cpu" else None
    device_ids = parse_device_ids(args.device_ids) if args.device_ids else default_device_ids(backend)
    unprofiled_power = args.unprofiled_power
    if getattr(args, "unprofiled_power_from", None) and backend == "cuda":     # the heater is cuda's
        if unprofiled_power is not None:
            raise OpperfError("give --unprofiled-power or --unprofiled-power-from, not both",
                              field="--unprofiled-power-from")
        unprofiled_power, calls = workload_power(Path(args.unprofiled_power_from))
        log.info("rows without a profiled power taken at %.1f W: the median power of the workload's %d profiled "
                 "calls in %s", unprofiled_power, calls, args.unprofiled_power_from)
    settings = ReplaySettings(
        backend=backend, repeat_count=args.repeat_count, warmup_count=args.warmup_count,
        update_mode=args.update_mode, timeout_s=args.timeout_s, max_restarts=args.max_restarts,
        prune_invalid_rows=args.prune_invalid_rows, prune_empty_duration_rows=args.prune_empty_duration_rows,
        fail_fast=args.fail_fast, heater_min_power_w=args.heater_min_power,
        unprofiled_power_w=unprofiled_power, seed=args.seed,
        persistent_worker=args.persistent_worker, memory_budget_bytes=budget, device_ids=device_ids,
        slots_dir=args.slots_dir, cpu_threads=args.cpu_threads, time_budget_s=args.time_budget_s,
        min_repeat_count=args.min_repeat_count)
    settings.validate()
    return settings


def workload_power(rows_dir: Path) -> tuple[float, int]:
    """The power the workload's own calls ran at: the call-weighted median of `Profiling Average Power(W)` (NVML,
    beside the profile) over every row of a parsed directory, and the number of calls. A generated row has no
    profiled power; on the device that profiled the workload, its calls ran at the workload's power, and the heater
    limit (--heater-min-power) reads it so (msmodeling's MoE steps on the H200: 124-181 W, where heated expert GEMM
    rows replayed 4-6 % slow, benchmarks/results/e2e_prediction/msmodeling/gemm_row_vs_step/)."""
    import csv

    files = sorted(rows_dir.glob("*.csv"))
    if not files:
        raise OpperfError("no kernel CSV in the workload's parsed directory", path=rows_dir,
                          field="--unprofiled-power-from")
    weighted: list[tuple[float, int]] = []
    for path in files:
        with open(path, newline="", encoding="utf-8") as handle:
            for line, row in enumerate(csv.DictReader(handle), start=2):
                power = (row.get(contract.PROFILED_POWER) or "").strip()
                if not power:
                    continue
                try:
                    weighted.append((float(power), int(float(row.get(contract.PROFILING_SAMPLE_COUNT) or 1))))
                except ValueError:
                    raise OpperfError(f"not a number: {power!r}", path=path, row=line,
                                      field=contract.PROFILED_POWER) from None
    if not weighted:
        raise OpperfError(f"no row has a {contract.PROFILED_POWER} (NVML beside a cuda profile): the workload's "
                          "power is unknown; give --unprofiled-power W (config replay.unprofiled_power) instead",
                          path=rows_dir, field="--unprofiled-power-from")
    weighted.sort()
    cumulative = list(accumulate(count for _, count in weighted))
    return weighted[bisect.bisect_left(cumulative, cumulative[-1] / 2)][0], cumulative[-1]


def _definition_source(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(definitions directory, definition file): --definition FILE, or '' for "none exists", overrides --definitions."""
    if args.definition is None:
        return args.definitions, None
    return None, args.definition or None


def npu_session(args: argparse.Namespace, kernel_type: str, scratch: Path):
    """The msprof session of an NPU job, after checking msprof, the device and the custom OPP it needs."""
    from opperf.replay.npu import environment, msprof
    from opperf.replay.npu.session import MsprofSession

    environment.check_msprof(args.msprof)
    definition = find_definition(kernel_type, "npu", *_definition_source(args))
    if definition is not None and definition.requires_custom_opp:
        environment.check_custom_opp([definition.type])
    torchrun = None
    if kernel_type == "DispatchFFNCombine":
        torchrun = msprof.TorchrunOptions(
            ep_size=args.dispatch_ffn_combine_ep_size, nproc_per_node=args.dispatch_ffn_combine_nproc_per_node,
            nnodes=args.dispatch_ffn_combine_nnodes, node_rank=args.dispatch_ffn_combine_node_rank,
            master_addr=args.dispatch_ffn_combine_master_addr, master_port=args.dispatch_ffn_combine_master_port)
        torchrun.validate()
    return MsprofSession(output_root=scratch / kernel_type, msprof_executable=args.msprof,
                         aic_metrics=args.aic_metrics, torchrun=torchrun)


def _replay_one(args, settings: ReplaySettings, rows: Path, kernel_type: str, output: Path, version_dir: str | None,
                trace_dir: str | None, scratch: Path) -> KernelJobResult:
    session = npu_session(args, kernel_type, scratch) if settings.backend == "npu" else None
    definitions_dir, definition_path = _definition_source(args)
    return replay_kernel_csv(rows, kernel_type, definitions_dir, output, settings, version_dir=version_dir,
                             trace_dir=trace_dir, session=session, task_id=args.task_id,
                             definition_path=definition_path)


def database_dir_from_args(args: argparse.Namespace, device: Device | None) -> Path:
    if args.database_path:
        return Path(args.database_path)
    if device is None:
        raise OpperfError("give --database-path, or --device with the versions (see --help)", field="--device")
    if device.backend == "npu":
        return Path(args.data_root) / device.name / "vllm_ascend" / npu_version_dir(
            args.vllm_version, args.torch_version, args.cann_version)
    if not args.torch_version:
        raise OpperfError("give --database-path, or --torch-version with --device", field="--torch-version")
    runtime = "cpu" if device.backend == "cpu" else "cuda"
    versions = StackVersions(torch=args.torch_version, runtime=runtime, runtime_version=args.cann_version,
                             vllm=args.vllm_version)
    return Path(args.data_root) / device.name / ("vllm" if args.vllm_version else "torch") / versions.version_dir


def database_version_dir(args: argparse.Namespace, database_dir: Path) -> str:
    """The stack a database directory's rows are for: --version-dir, else the directory's own name
    (data/{device}/{stack}/{version_dir}); replay refuses to measure on another stack."""
    if args.version_dir:
        return args.version_dir
    try:
        parse_version_dir(database_dir.name)
    except OpperfError as exc:
        raise OpperfError(f"{exc}; a directory not named after its stack needs --version-dir, the stack its rows "
                          f"were profiled on{_this_host_stack(args.backend or 'cpu')}",
                          path=database_dir, field="--version-dir") from None
    return database_dir.name


def _this_host_stack(backend: str) -> str:
    """', e.g. this host's: torch2.13.0_cpu' (nothing where this host lacks the back end's toolchain)."""
    try:
        return f", e.g. this host's: {running_stack(backend).version_dir}"
    except Exception:      # noqa: BLE001 - only a hint
        return ""


def run_replay_command(args: argparse.Namespace) -> int:
    if args.rows:
        missing = [flag for flag, value in (("--kernel", args.kernel), ("--output", args.output)) if not value]
        if missing:
            raise OpperfError(f"the workflow form (--rows) also needs {', '.join(missing)}", field=missing[0])
        device = _device(args, None)
        settings = settings_from_args(args, device)
        with tempfile.TemporaryDirectory(prefix="opperf-msprof-") as scratch:
            # replay_kernel_csv logs the job's summary line (rows in/out, statuses): not printed a second time.
            _replay_one(args, settings, Path(args.rows), args.kernel, Path(args.output), args.version_dir,
                        args.trace_dir, Path(scratch))
        return 0
    return run_database_form(args)


def run_database_form(args: argparse.Namespace) -> int:
    """Every (or each --op) kernel CSV of a database directory, replayed and updated in place."""
    device = _device(args, Path(args.database_path) if args.database_path else None)
    database_dir = database_dir_from_args(args, device)
    if not database_dir.is_dir():
        raise OpperfError("database directory not found", path=database_dir)
    if args.prof_path:
        from opperf.replay.npu.session import backfill_database

        result = backfill_database(database_dir, args.prof_path, kernel_types=args.ops, update_mode=args.update_mode,
                                   prune_empty_duration_rows=args.prune_empty_duration_rows,
                                   ep_size=args.dispatch_ffn_combine_ep_size, msprof_executable=args.msprof)
        for kernel_type, report in result.files.items():
            print(f"{kernel_type}: {report.summary()}")
        return 0
    version_dir = database_version_dir(args, database_dir)
    settings = settings_from_args(args, device)
    available = sorted(p.stem for p in database_dir.glob("*.csv"))
    kernels = args.ops or available
    unknown = [k for k in kernels if k not in available]
    if unknown:
        raise OpperfError(f"no CSV for kernel type(s) {unknown} in the database (has: {', '.join(available)})",
                          path=database_dir, field="--op")
    trace_dir = _trace_dir_for(database_dir)
    with tempfile.TemporaryDirectory(prefix="opperf-msprof-") as scratch:
        for kernel_type in kernels:
            contract.check_kernel_type(kernel_type, path=database_dir, field="--op")
            csv_path = database_dir / f"{kernel_type}.csv"
            _replay_one(args, settings, csv_path, kernel_type, csv_path, version_dir, str(trace_dir), Path(scratch))
    from opperf.report.build import write_database_report

    reports_dir = Path(args.reports_dir) if args.reports_dir else database_dir / "reports"
    written = write_database_report(database_dir, reports_dir, kernels=kernels, backend=settings.backend)
    print(f"report: {', '.join(str(p) for p in written)}")
    return 0


def _trace_dir_for(database_dir: Path) -> Path:
    """traces/{device}/{stack}/{version_dir} for a data/{device}/{stack}/{version_dir} database, else <db>/traces."""
    parts = database_dir.resolve().parts
    if len(parts) >= 4 and parts[-4] == "data":
        return Path(*parts[:-4]) / "traces" / parts[-3] / parts[-2] / parts[-1]
    return database_dir / "traces"
