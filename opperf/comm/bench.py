"""The collective benchmark driver: plans groups and sizes, and (under torchrun) runs, checks, times and
writes them.

Every rank runs the same plan. For each op and group, each size is set up with a known input pattern,
run once and checked on every rank, warmed up, given an iteration count from its warm-up time (bounded
by --min-iters/--max-iters; large messages get fewer calls, each still timed and checked), timed, and
checked again. Rank 0 writes the CSVs atomically at the end.
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from opperf.comm.collectives import (CollectiveCase, check_backend, collective, collective_file_name,
                                     comm_version_dir)
from opperf.comm.results import per_call_durations, result_row, write_comm_csv
from opperf.comm.sizes import CommDtype, format_size
from opperf.comm.timing import TimedCase, device_synchronizer, make_timer
from opperf.comm.topology import build_group, default_tier, format_grid_shape
from opperf.errors import OpperfError
from opperf.log import LOGGER_NAME, Progress, get_logger, span

log = get_logger("comm")

# Words in a back end's error that mean "this op is not implemented here", as opposed to a failure.
_UNSUPPORTED_WORDS = ("not supported", "unsupported", "does not support", "not implemented")


@dataclass(frozen=True)
class GroupPlan:
    num_devices: int
    tier: int
    ranks: tuple[int, ...]


@dataclass
class BenchRequest:
    """Everything one benchmark run needs; built by scripts/generate_comm_microbench.py."""
    ops: Sequence[str]
    num_devices: Sequence[int]
    grid_shape: tuple[int, ...]
    dtype: CommDtype
    bytes_grid: Sequence[int]
    bench_mode: str = "event"
    backend: str = "auto"                  # auto | gloo | nccl | hccl
    topology_tiers: Sequence[int] | None = None
    device: str = ""                       # device catalog key for the `device` column ("" = detect)
    warmup_iters: int = 5
    min_iters: int = 10
    max_iters: int = 200
    target_seconds: float = 0.2            # timed wall time aimed at per point, before the bounds
    output_dir: Path | None = None
    output_csv: Path | None = None
    version_dir: str | None = None         # refuse to run unless this environment's comm version matches

    def __post_init__(self):
        for op in self.ops:
            collective(op)
        if self.output_csv and len(self.ops) != 1:
            raise OpperfError(f"--output-csv holds one collective, {len(self.ops)} were asked for "
                              f"({', '.join(self.ops)}); use --output-dir for several", field="--output-csv")
        if not 1 <= self.min_iters <= self.max_iters:
            raise OpperfError(f"need 1 <= --min-iters ({self.min_iters}) <= --max-iters ({self.max_iters})",
                              field="--min-iters")
        if self.warmup_iters < 1:
            raise OpperfError("--warmup-iters must be at least 1", field="--warmup-iters")
        if self.target_seconds <= 0:
            raise OpperfError("--target-seconds must be positive", field="--target-seconds")


def plan_groups(num_devices: Sequence[int], tiers: Sequence[int] | None,
                grid_shape: Sequence[int]) -> list[GroupPlan]:
    """One group per (device count, tier); the tier of contiguous ranks when no tier is asked for."""
    plans = []
    for count in dict.fromkeys(num_devices):
        for tier in (dict.fromkeys(tiers) if tiers else [default_tier(count, grid_shape)]):
            plans.append(GroupPlan(count, tier, tuple(build_group(count, tier, grid_shape))))
    return plans


def world_size_needed(groups: Sequence[GroupPlan]) -> int:
    return max(max(g.ranks) for g in groups) + 1


def output_path(request: BenchRequest, backend: str, op: str) -> Path:
    if request.output_csv:
        return Path(request.output_csv)
    if request.output_dir is None:
        raise OpperfError("give --output-dir (one CSV per collective) or --output-csv (one collective)",
                          field="--output-dir")
    return Path(request.output_dir) / collective_file_name(backend, op)


def torchrun_commands(world_size: int, script: str, script_args: Sequence[str]) -> list[str]:
    """The launch lines for this plan: one node, and several nodes (run the second on every node)."""
    args = " ".join(shlex.quote(a) for a in script_args)
    return [
        f"torchrun --standalone --nproc-per-node {world_size} {script} --do-run {args}",
        f"torchrun --nnodes $NNODES --nproc-per-node $GPUS_PER_NODE --node-rank $NODE_RANK "
        f"--master-addr $MASTER_ADDR --master-port 29500 {script} --do-run {args}"
        f"   # NNODES x GPUS_PER_NODE >= {world_size}",
    ]


def plan_text(request: BenchRequest, script: str, script_args: Sequence[str]) -> str:
    """What --do-run would measure, and how to launch it (printed when --do-run is absent)."""
    groups = plan_groups(request.num_devices, request.topology_tiers, request.grid_shape)
    sizes = request.bytes_grid
    lines = [f"grid {format_grid_shape(request.grid_shape)}, dtype {request.dtype.csv_name}, bench mode "
             f"{request.bench_mode}, {len(sizes)} sizes {format_size(sizes[0])}..{format_size(sizes[-1])}"]
    for op in request.ops:
        for group in groups:
            lines.append(f"  {op:<15} {group.num_devices:>4} devices  tier {group.tier}  ranks "
                         f"{_short_ranks(group.ranks)}")
    lines.append(f"points: {len(request.ops) * len(groups) * len(sizes)}; processes needed: "
                 f"{world_size_needed(groups)}")
    lines.append("launch (one node, then several):")
    lines += ["  " + c for c in torchrun_commands(world_size_needed(groups), script, script_args)]
    return "\n".join(lines)


def _short_ranks(ranks: Sequence[int]) -> str:
    return str(list(ranks)) if len(ranks) <= 8 else f"[{ranks[0]}, {ranks[1]}, ..., {ranks[-1]}] ({len(ranks)})"


# --- under torchrun ---------------------------------------------------------------------------------

def resolve_backend(requested: str) -> str:
    """auto → hccl where torch_npu sees an NPU, nccl where torch sees CUDA, else gloo."""
    if requested != "auto":
        return check_backend(requested)
    try:
        import torch
        import torch_npu  # noqa: F401

        if torch.npu.is_available():
            return "hccl"
    except ImportError:
        pass
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def _launch_environment() -> tuple[int, int, int]:
    missing = [v for v in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise OpperfError(f"--do-run must be launched by torchrun (missing {', '.join(missing)}); e.g. "
                          "torchrun --standalone --nproc-per-node 2 scripts/generate_comm_microbench.py --do-run ...")
    return int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])


def _bind_device(backend: str, local_rank: int) -> str:
    import torch

    if backend == "gloo":
        return "cpu"
    if backend == "nccl":
        if not torch.cuda.is_available() or local_rank >= torch.cuda.device_count():
            raise OpperfError(f"nccl needs CUDA device {local_rank}, torch sees "
                              f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}")
        torch.cuda.set_device(local_rank)
        return f"cuda:{local_rank}"
    import torch_npu  # noqa: F401

    torch.npu.set_device(local_rank)
    return f"npu:{local_rank}"


def _device_label(request: BenchRequest, backend: str) -> str:
    if request.device:
        return request.device
    if backend == "gloo":
        return "CPU"
    import torch

    return torch.cuda.get_device_name() if backend == "nccl" else torch.npu.get_device_name()


class _GroupContext:
    """One benchmark group on this rank: its process group (the back end) and a gloo twin for host-side
    barriers and result exchange, which launch no device kernels inside a profiled session."""

    def __init__(self, plan: GroupPlan, group, coordination, rank: int):
        self.plan = plan
        self.group = group
        self.coordination = coordination
        self.index = plan.ranks.index(rank)

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(group=self.coordination)

    def gather(self, value) -> list:
        import torch.distributed as dist

        gathered = [None] * self.plan.num_devices
        dist.all_gather_object(gathered, value, group=self.coordination)
        return gathered


def _check_everywhere(context: _GroupContext, case: CollectiveCase, synchronize, when: str) -> None:
    """Fill, run once, check on every rank; any rank's mismatch stops the run on all of them."""
    case.fill()
    case.run()
    synchronize()
    problems = [p for p in context.gather(case.check()) if p]
    if problems:
        raise OpperfError(f"wrong result {when} (not recorded): " + "; ".join(problems))


def _iterations(context: _GroupContext, case: CollectiveCase, synchronize, request: BenchRequest) -> int:
    """Warm up, then choose the call count from the slowest rank's warm-up time per call."""
    synchronize()
    context.barrier()
    start = time.perf_counter()
    for _ in range(request.warmup_iters):
        case.run()
    synchronize()
    per_call_s = max(context.gather((time.perf_counter() - start) / request.warmup_iters))
    wanted = math.ceil(request.target_seconds / max(per_call_s, 1e-9))
    return max(request.min_iters, min(request.max_iters, wanted))


def _bench_group(request: BenchRequest, backend: str, op: str, context: _GroupContext, device: str,
                 device_label: str) -> list[dict]:
    synchronize = device_synchronizer(backend)
    timer = make_timer(backend, request.bench_mode, op, context.barrier)
    plan = context.plan
    # kernel mode: one profiler session over all sizes (CANN cannot restart its profiler in a process)
    batches = [list(request.bytes_grid)] if request.bench_mode == "kernel" else [[s] for s in request.bytes_grid]
    rows = []
    for batch in batches:
        prepared = []
        for message_bytes in batch:
            case = CollectiveCase(op, message_bytes, request.dtype, context.group, list(plan.ranks),
                                  context.index, device)
            _check_everywhere(context, case, synchronize, "before timing")
            prepared.append(TimedCase(case, _iterations(context, case, synchronize, request)))
        samples = timer.time_cases(prepared)
        for timed in prepared:
            _check_everywhere(context, timed.case, synchronize, "after timing")
        gathered = context.gather(samples)
        if context.index == 0:
            for position, timed in enumerate(prepared):
                per_call = per_call_durations([rank_samples[position] for rank_samples in gathered],
                                              request.bench_mode)
                row = result_row(op=op, message_bytes=timed.case.message_bytes, num_devices=plan.num_devices,
                                 dtype_csv=request.dtype.csv_name, topology_tier=plan.tier, samples_us=per_call,
                                 backend=backend, bench_mode=request.bench_mode, timing_method=timer.timing_method,
                                 group_ranks=plan.ranks, grid_shape=format_grid_shape(request.grid_shape),
                                 device=device_label)
                log.info("%s %s x%d tier %d: median %s us (p10 %s, p90 %s, n=%s), busbw %s GB/s", op,
                         format_size(timed.case.message_bytes), plan.num_devices, plan.tier, row["Duration(us)"],
                         row["Duration P10(us)"], row["Duration P90(us)"], row["sample_count"], row["busbw_gbps"])
                rows.append(row)
        for timed in prepared:
            timed.case.release()
    return rows


def _unsupported_reason(context: _GroupContext, op: str, request: BenchRequest, device: str,
                        synchronize) -> str | None:
    """Probe the op once on the smallest size; a back end's 'not supported' is returned, not raised."""
    error = None
    try:
        probe = CollectiveCase(op, request.bytes_grid[0], request.dtype, context.group, list(context.plan.ranks),
                               context.index, device)
        probe.fill()
        probe.run()
        synchronize()
        probe.release()
    except OpperfError:
        raise
    except Exception as exc:  # the back end's own exception types differ (RuntimeError, NotImplementedError…)
        error = f"{type(exc).__name__}: {exc}"
    return unsupported_reason(op, context.gather(error))


def unsupported_reason(op: str, errors_per_rank: Sequence[str | None]) -> str | None:
    """From every rank's first-call error: None (it ran), the back end's 'not supported' reason (every
    failing rank says so: recorded, not raised), or an OpperfError for any other failure."""
    errors = [e for e in errors_per_rank if e]
    if not errors:
        return None
    if all(any(word in e.lower() for word in _UNSUPPORTED_WORDS) for e in errors):
        return errors[0].splitlines()[0]
    raise OpperfError(f"{op} failed on the first call: {errors[0]}")


def run_benchmarks(request: BenchRequest) -> dict[str, Path]:
    """Run the plan in this torchrun process; rank 0 writes one CSV per op. Returns {op: path} on rank 0."""
    import torch.distributed as dist

    rank, local_rank, world_size = _launch_environment()
    if rank != 0:       # one copy of the progress log, not one per rank
        logging.getLogger(LOGGER_NAME).setLevel(logging.WARNING)
    backend = resolve_backend(request.backend)
    make_timer(backend, request.bench_mode, request.ops[0], lambda: None)   # refuse an impossible mode early
    if request.version_dir is not None and request.version_dir != comm_version_dir(backend):
        raise OpperfError(f"refusing to write {backend} numbers of {comm_version_dir(backend)} into version "
                          f"directory {request.version_dir!r} (wrong-stack numbers would corrupt the database)",
                          field="--version-dir")
    groups = plan_groups(request.num_devices, request.topology_tiers, request.grid_shape)
    if world_size_needed(groups) > world_size:
        raise OpperfError(f"the groups need ranks 0..{world_size_needed(groups) - 1}, but torchrun started "
                          f"{world_size} processes (raise --nproc-per-node or lower --num-devices)",
                          field="--num-devices")
    paths = {op: output_path(request, backend, op) for op in request.ops}
    device = _bind_device(backend, local_rank)
    dist.init_process_group(backend=backend)
    try:
        world_coordination = dist.new_group(backend="gloo")
        contexts = []
        for plan in groups:      # every rank creates every group, in the same order
            group = dist.new_group(ranks=list(plan.ranks))
            coordination = dist.new_group(ranks=list(plan.ranks), backend="gloo")
            if rank in plan.ranks:
                contexts.append(_GroupContext(plan, group, coordination, rank))
        device_label = _device_label(request, backend)
        rows: dict[str, list[dict]] = {op: [] for op in request.ops}
        unsupported: dict[str, str] = {}       # op → the back end's reason
        progress = Progress(log, f"collectives (rank {rank})", len(request.ops) * len(contexts),
                            unit="(collective, group) pairs")
        done = 0
        for op in request.ops:
            for context in contexts:
                progress.update(done)
                done += 1
                with span(f"comm.{op}", log, devices=context.plan.num_devices, tier=context.plan.tier):
                    reason = _unsupported_reason(context, op, request, device, device_synchronizer(backend))
                    if reason:
                        unsupported[op] = reason
                        if context.index == 0:
                            log.warning("%s is not supported by %s here, recorded as a header-only CSV: %s",
                                        op, backend, reason)
                        continue
                    rows[op] += _bench_group(request, backend, op, context, device, device_label)
            dist.barrier(group=world_coordination)
        progress.finish(done)
        if rank == 0:
            for op, path in paths.items():
                write_comm_csv(path, rows[op])
                log.info("wrote %s (%d rows)%s", path, len(rows[op]),
                         f" — {op} UNSUPPORTED by {backend}" if op in unsupported else "")
        dist.barrier(group=world_coordination)
    finally:
        dist.destroy_process_group()
    return paths if rank == 0 else {}

