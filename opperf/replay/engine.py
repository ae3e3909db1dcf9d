"""Replay one row: memory check, build, first call + verify, warm-up, timed calls, statistics.

A row's outcome is a status and the columns it fills. Only a verified call's samples become
numbers; every failure keeps the row with its status and error (write-back decides, never this).
Rows with equal signature (and equal recorded scalars) are replayed once: they are the same call.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from opperf import contract
from opperf.errors import OpperfError
from opperf.log import get_logger
from opperf.replay.definitions import SCHEMA_BACKENDS, KernelDefinition, schema_definition
from opperf.replay.methods import RepeatBudget, Timer, TimingResult
from opperf.stats import INTERRUPTED_FACTOR, duration_stats, format_number, split_interrupted

if TYPE_CHECKING:      # torch-importing modules: the job's parent process plans and writes back without torch
    from opperf.replay.inputs import FormatCast, ReplayCase

log = get_logger("replay.engine")

STATUS_OK = "ok"
STATUS_EXECUTED = "executed"                  # ran and verified; durations come from a profiler session (npu)
STATUS_FAILED_BUILD = "failed_build"
STATUS_FAILED_RUN = "failed_run"
STATUS_FAILED_VERIFY = "failed_verify"
STATUS_FAILED_CRASH = "failed_crash"          # the replay process died on this row (abort, segfault, OOM kill)
STATUS_FAILED_TIMEOUT = "failed_timeout"      # the row ran past the timeout; its process was killed
STATUS_FAILED_NO_SAMPLES = "failed_no_samples"  # the timer saw no kernel of the call (npu: with this signature)
STATUS_NOT_RUN = "not_run"                    # never reached: the replay process kept dying (see error)
STATUS_SKIPPED_MEMORY = "skipped_memory"
STATUS_NO_DEFINITION = "no_definition"
STATUS_UNSUPPORTED_BACKEND = "unsupported_backend"

FAILED_STATUSES = frozenset({STATUS_FAILED_BUILD, STATUS_FAILED_RUN, STATUS_FAILED_VERIFY, STATUS_FAILED_CRASH,
                             STATUS_FAILED_TIMEOUT, STATUS_FAILED_NO_SAMPLES})
UPDATE_MODES = ("all", "missing-only")
DEFAULT_REPEAT_COUNT = 30
DEFAULT_WARMUP_COUNT = 3


@dataclass
class RowOutcome:
    """What replaying one row gave: a status, the result columns (only when ok), and what to trace."""

    status: str
    columns: dict[str, str] = field(default_factory=dict)
    error: str = ""
    call: str = ""                 # the call as built, e.g. torch.ops.aten.mm(Tensor(16, 256):float32, ...)
    expected_outputs: str = ""
    produced_outputs: str = ""
    other_samples: dict[str, list[float]] = field(default_factory=dict)
    recipe: str = ""               # Replay Recipe: the definition file, or the schema overload the call came from

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping) -> RowOutcome:
        return cls(**data)


@dataclass(frozen=True)
class WorkItem:
    """One distinct call to replay: the first row (0-based index, 1-based file line) standing for its group."""

    index: int
    line: int
    key: tuple[str, ...]


def replay_key(row: Mapping[str, str], kernel_type: str) -> tuple[str, ...]:
    """Rows that are the same call: the row signature plus the recorded scalars (aten ops' dim, alpha, ...)."""
    return contract.row_signature(row, kernel_type) + (contract.strip_profiler_quotes(row.get(contract.INPUT_SCALARS, "")),)


def duration_value(value: object) -> float | None:
    """A duration (or clock) cell's usable measurement (a finite number > 0), else None."""
    try:
        number = float(contract.strip_profiler_quotes(value))
    except ValueError:
        return None
    return number if math.isfinite(number) and number > 0 else None


def has_valid_duration(value: str) -> bool:
    return duration_value(value) is not None


def plan_work(rows: Sequence[Mapping[str, str]], kernel_type: str, update_mode: str) -> list[WorkItem]:
    """The distinct calls to replay. `missing-only` leaves rows whose `Average Duration(us)` is filled."""
    if update_mode not in UPDATE_MODES:
        raise OpperfError(f"update mode {update_mode!r} is not one of {UPDATE_MODES}", field="--update-mode")
    items: dict[tuple[str, ...], WorkItem] = {}
    for index, row in enumerate(rows):
        if update_mode == "missing-only" and has_valid_duration(row.get(contract.REPLAY_AVERAGE, "")):
            continue
        key = replay_key(row, kernel_type)
        if key not in items:
            items[key] = WorkItem(index=index, line=index + 2, key=key)
    return list(items.values())


def sample_columns(samples_us: Sequence[float], method: str, l2_policy: str,
                   power_state: tuple[float, float] | None = None) -> dict[str, str]:
    """`Average Duration(us)` (the mean, as the name says) and our statistics beside it; the SM clock and
    power the calls ran at where the timer sampled them. Interrupted calls (opperf.stats.split_interrupted) are
    left out of every statistic, and the measurement's description says how many and how long they took."""
    kept, interrupted, median = split_interrupted(samples_us)
    stats = duration_stats(kept)
    if interrupted:
        l2_policy += (f"; {len(interrupted)} of {len(samples_us)} timed calls left out as interrupted ("
                      f"{', '.join(f'{d:.0f}' for d in sorted(interrupted)[:5])} us, over {INTERRUPTED_FACTOR:g}x "
                      f"the median of all {median:.3g} us)")
    power = {} if power_state is None else {contract.REPLAY_SM_CLOCK: format_number(power_state[0]),
                                            contract.REPLAY_POWER: format_number(power_state[1])}
    return {**power,
        contract.REPLAY_AVERAGE: format_number(stats.mean_us),
        contract.REPLAY_MEDIAN: format_number(stats.median_us),
        contract.REPLAY_P10: format_number(stats.p10_us),
        contract.REPLAY_P90: format_number(stats.p90_us),
        contract.REPLAY_CV: format_number(stats.cv),
        contract.REPLAY_SAMPLE_COUNT: str(stats.sample_count),
        contract.REPLAY_TIMING_METHOD: method,
        contract.REPLAY_L2_POLICY: l2_policy,
    }


def _error_text(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:500]


def row_reason(exc: BaseException) -> str:
    """What went wrong with a row, in words its own database row can keep: an OpperfError's field and reason
    without the file and line (the rows file is the job's input, named by its absolute path in the replay
    process: the row is this row, and a database never holds the builder's directories), else the exception's
    type and first line, whole."""
    if isinstance(exc, OpperfError):
        return f"field {exc.field!r}: {exc.reason}" if exc.field else exc.reason
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


@dataclass
class PreparedRow:
    """A row whose call was built, run once and verified: ready to time (the case), with what to trace."""

    case: "ReplayCase | None"
    call: str
    expected_outputs: str
    produced_outputs: str
    recipe: str = ""

    def outcome(self, timing: TimingResult | None, error: str = "") -> RowOutcome:
        """The row's outcome once its timed calls are collected (None: the timer had no samples for it)."""
        traced = {"call": self.call, "expected_outputs": self.expected_outputs,
                  "produced_outputs": self.produced_outputs, "recipe": self.recipe}
        if timing is None:
            return RowOutcome(STATUS_FAILED_RUN, error=error or "the timer returned no samples for this call",
                              **traced)
        if not timing.samples_us:
            return RowOutcome(STATUS_EXECUTED, columns={contract.REPLAY_TIMING_METHOD: timing.method,
                                                        contract.REPLAY_L2_POLICY: timing.l2_policy}, **traced)
        if not any(sample > 0 for sample in timing.samples_us):
            # A call whose every sample is 0 launched no device work that the timer saw: a duration of 0
            # would read as "free" to the performance model. The row fails, naming why.
            return RowOutcome(STATUS_FAILED_NO_SAMPLES, error=f"{timing.method}: every one of the "
                              f"{len(timing.samples_us)} timed calls measured 0 us (no device activity "
                              "attributed to the call)", **traced)
        # A budget's choice of the count is part of how the row was measured (Replay Sample Count: the calls kept).
        method = "; ".join(filter(None, (timing.method, timing.repetitions)))
        return RowOutcome(STATUS_OK, columns=sample_columns(timing.samples_us, method, timing.l2_policy,
                                                            timing.power_state),
                          other_samples=timing.other_samples_us, **traced)


def prepare_row(definition: KernelDefinition, row: Mapping[str, str], *, backend: str, device: str,
                timer: Timer, memory_budget_bytes: int | None = None, format_cast: "FormatCast | None" = None,
                path=None, line: int | None = None, seed: int = 0) -> PreparedRow | RowOutcome:
    """Memory check, build, first call, verify: a PreparedRow to time, or the RowOutcome that ends the row."""
    from opperf.replay.inputs import build_case, parse_row_slots, row_tensor_bytes
    from opperf.replay.residency import row_reuse, slot_reuse
    from opperf.replay.verify import verify_outputs

    recipe = definition.recipe
    if not definition.supports(backend):
        return RowOutcome(STATUS_UNSUPPORTED_BACKEND, recipe=recipe,
                          error=f"{definition.source} lists back ends {list(definition.backends)}, not {backend}")
    try:
        slots = parse_row_slots(row, path=path, line=line)
    except OpperfError as exc:
        return RowOutcome(STATUS_FAILED_BUILD, error=row_reason(exc), recipe=recipe)
    needed = row_tensor_bytes(slots)
    if memory_budget_bytes is not None and needed > memory_budget_bytes:
        return RowOutcome(STATUS_SKIPPED_MEMORY, recipe=recipe,
                          error=f"inputs+outputs need {needed / 2**30:.2f} GiB, over the device memory budget of "
                                f"{memory_budget_bytes / 2**30:.2f} GiB (skipped before any allocation)")
    try:
        case = build_case(definition, row, device, format_cast=format_cast, path=path, line=line, seed=seed)
    except Exception as exc:            # a recipe that cannot be built for this row: record it, keep the row
        log.debug("build failed for line %s: %s", line, traceback.format_exc())
        fallback = schema_refinement_fallback(definition, backend)
        try:
            if fallback is None:
                raise exc
            case = build_case(fallback, row, device, format_cast=format_cast, path=path, line=line, seed=seed)
        except Exception as final:      # the definition's own failure is the news, unless there was none
            no_recipe = fallback is None and type(final).__name__ == "NoSchemaError"
            return RowOutcome(STATUS_NO_DEFINITION if no_recipe else STATUS_FAILED_BUILD,
                              error=str(final) if no_recipe else row_reason(exc), recipe=recipe)
        # The definition refines the common case (an out= variant, another overload did not fit): the schema
        # builds this row; the recipe says so, whole.
        case.recipe = f"{case.recipe} ({definition.recipe} does not fit this row: {row_reason(exc)})"
        definition = fallback
    recipe = case.recipe or recipe
    if case.value_variants:
        recipe += (f"; {len(case.value_variants)} input(s) with the workload's recorded values, "
                   f"{max(len(v) for _, v in case.value_variants)} call(s) cycled")
    # The GPU's power around the call in the workload (a profile taken with the NVML sampler) and its device time:
    # the power state (heater or idle) the cuda timer puts the call in.
    case.profiled_power_w = duration_value(row.get(contract.PROFILED_POWER))
    case.profiled_us = duration_value(row.get(contract.PROFILING_AVERAGE))
    try:
        distances = row_reuse(row, path=path, line=line)
    except OpperfError as exc:
        return RowOutcome(STATUS_FAILED_BUILD, error=row_reason(exc), recipe=recipe)
    if distances:
        case.reuse = slot_reuse(case.tensors(), slots, distances)
    try:
        result = case.run()
        timer.synchronize()
    except Exception as exc:
        log.debug("first call failed for line %s: %s", line, traceback.format_exc())
        return RowOutcome(STATUS_FAILED_RUN, error=_error_text(exc), call=case.description, recipe=recipe)
    verdict = verify_outputs(row, slots, result, definition.outputs)
    del result
    if not verdict.ok:
        return RowOutcome(STATUS_FAILED_VERIFY, error=verdict.message, call=case.description,
                          expected_outputs=verdict.expected, produced_outputs=verdict.produced, recipe=recipe)
    return PreparedRow(case, case.description, verdict.expected, verdict.produced, recipe)


def schema_refinement_fallback(definition: KernelDefinition, backend: str) -> KernelDefinition | None:
    """The op's schema recipe, for a row its definition cannot build, on back ends whose Types are op names."""
    if definition.schema_op or backend not in SCHEMA_BACKENDS:
        return None
    return schema_definition(definition.type, (backend,))


def measure_prepared(prepared: PreparedRow, timer: Timer, key, *, repeat_count: int, warmup_count: int,
                     budget: RepeatBudget | None = None) -> RowOutcome | None:
    """Run the row's warm-up and timed calls (the first call, already run, counts as warm-up; `budget`: at most
    `repeat_count` timed calls, the budget chooses how many); the case's tensors are released afterwards. A
    RowOutcome if the calls failed, else None (samples come at collect)."""
    try:
        if budget is None:
            timer.measure(prepared.case, max(warmup_count - 1, 0), repeat_count, key)
        else:
            timer.measure(prepared.case, max(warmup_count - 1, 0), repeat_count, key, budget=budget)
    except Exception as exc:
        return prepared.outcome(None, error=_error_text(exc))
    finally:
        prepared.case = None
    return None


def replay_row(definition: KernelDefinition, row: Mapping[str, str], *, backend: str, device: str, timer: Timer,
               repeat_count: int = DEFAULT_REPEAT_COUNT, warmup_count: int = DEFAULT_WARMUP_COUNT,
               memory_budget_bytes: int | None = None, format_cast: "FormatCast | None" = None,
               path=None, line: int | None = None, seed: int = 0, budget: RepeatBudget | None = None) -> RowOutcome:
    """Replay one row and say what happened (never raises for a row-level problem); one row per timer batch."""
    prepared = prepare_row(definition, row, backend=backend, device=device, timer=timer,
                           memory_budget_bytes=memory_budget_bytes, format_cast=format_cast, path=path, line=line,
                           seed=seed)
    if isinstance(prepared, RowOutcome):
        return prepared
    failed = measure_prepared(prepared, timer, line, repeat_count=repeat_count, warmup_count=warmup_count,
                              budget=budget)
    if failed is not None:
        return failed
    try:
        timings = timer.collect()
    except Exception as exc:
        return prepared.outcome(None, error=_error_text(exc))
    return prepared.outcome(timings.get(line))
