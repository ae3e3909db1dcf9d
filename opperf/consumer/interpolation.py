"""What msmodeling's runtime makes of a lookup that finds no exact row: a model of its interpolation step.

The runtime (`InterpolatingDataSource` around `ProfilingDataSource`, msmodeling
`tensor_cast/performance_model/profiling_database/`) answers a query its exact lookup missed by
interpolating between rows of the same kernel CSV. Which rows it may combine, along which axis and how,
decides whether a database is usable, so `scripts/check_database.py` asks this model rather than guessing.
The rules below are the runtime's (read from its source at msmodeling 84fec85); the code is ours.

Paths (chosen from the query's op_mapping entry):
- **matmul** (kernel type in the runtime's MatMul set): axes M, K, N from the first two inputs; rows grouped
  by kernel type, input count, input dtypes, leading batch dims and input formats; axis groups tried in the
  order M, K, N, (M,K), (M,N), (K,N), (M,K,N) unless `interpolation_policy` caps the dimension.
- **generic compute** (any other kernel type without a query_mode): one axis, the first input's leading dim
  after a leading 1 is dropped from every shape (so an M=1 row `1,256` is filed under axis 256 with a
  different signature); rows grouped by every other input dim. Policy `generic_compute.axis: output_numel`
  interpolates the output's element count instead, grouped by the output's trailing dims.
- **elementwise** (`query_mode: elementwise`): one axis, elements read plus written; grouped by output rank,
  input count, output dtype and broadcast pattern only, so rows of other hidden sizes share a group.
- **attention** (`query_mode: attention_special`): axes seq (the row's avg_seq_len), batch, heads, head_dim,
  q_tokens matched with the runtime's block-padding tolerance; optional sqrt(seq) transform by policy.

1-D interpolation is linear between the nearest lower and upper measured coordinates (duplicates at one
coordinate are replaced by their median); 2-D/3-D is scipy's Delaunay-linear interpolation. The runtime
never extrapolates and never mixes a replayed latency with a profiled one (the preferred latency column's
rows are tried apart from the rest).

Legality (the density standard V1: "legal interpolation only inside a bucket and range"): an answer is
INTERPOLATED when exactly one axis varies between the query and the rows used and every other field the
runtime ignores (formats, layout, dtypes, other dims) agrees; ILLEGAL when the runtime would still return a
number but combined rows from different buckets or varied several axes at once; MISS when the runtime returns
nothing (a roofline fallback); RAISES when reading the CSV would raise inside the runtime; UNMODELLED for the
runtime paths this model does not follow (composite, moe_fused, scatter_nd_update_mla, compute_scale,
quantized_matmul).
"""

from __future__ import annotations

import io
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import yaml

from opperf.contract import (TORCH_TO_PROFILER_DTYPE, dtype_bytes, is_contiguous, is_known_dtype, parse_strides,
                             split_slots)
from opperf.consumer.runtime import RUNTIME_QUERY_DTYPE, _logical, broadcast_pattern, is_block_padded, strip_batch
from opperf.consumer.status import AnswerStatus
from opperf.errors import OpperfError

if TYPE_CHECKING:
    import pandas as pd
    import torch

# --- the runtime's facts --------------------------------------------------------------------------

# torch dtype name -> the runtime's dtype spelling (float16 shares BF16's spelling; float64 has none). By name, so
# that a database check does not import torch (2.5 s a job) for a table of spellings.
_RUNTIME_DTYPE_BY_NAME = {name: RUNTIME_QUERY_DTYPE[profiler] for name, profiler in TORCH_TO_PROFILER_DTYPE.items()
                          if profiler in RUNTIME_QUERY_DTYPE}


def query_dtype(dtype: Any, default: str | None = None) -> str | None:
    """The runtime's spelling of a torch dtype (`torch.bfloat16`, or its name), else `default`."""
    return _RUNTIME_DTYPE_BY_NAME.get(str(dtype).removeprefix("torch."), default)


# The kernel types the interpolation step treats as MatMul (the exact path's set plus BatchMatMulNd).
INTERPOLATION_MATMUL_KERNELS = frozenset({
    "MatMulV2", "MatMulV3", "MatMulCommon", "MatMul", "QuantBatchMatmulV3", "BatchMatMulV2", "TransposeBatchMatMul",
    "GroupedMatmul", "GroupedMatmulSwigluQuant", "BatchMatMulNd"})
# Kernels whose shapes keep their leading dims (no batch-1 stripping) on the matmul path.
BATCHED_MATMUL_KERNELS = frozenset({"BatchMatMulV2", "BatchMatMulNd", "TransposeBatchMatMul", "QuantBatchMatmulV3"})
# Kernels for which FLOAT and DT_BF16 count as one dtype.
DTYPE_RELAXED_KERNELS = frozenset({"MatMulV2", "PadV3", "PadV3AiCore", "ApplyRotaryPosEmb", "_triton_rope",
                                   "split_qkv_rmsnorm_rope_kernel", "MoeGatingTopK"})
_DTYPE_GROUP = {"DT_BF16": "FLOAT_GROUP", "FLOAT": "FLOAT_GROUP"}
# The column whose presence makes it the preferred latency (replayed first, then the profile's).
PREFERRED_LATENCY_COLUMNS = ("Average Duration(us)", "Profiling Average Duration(us)", "Duration(us)")
# Per row, after the preferred column: the first finite positive value of these is the row's latency.
_FALLBACK_LATENCY_COLUMNS = ("Profiling Average Duration(us)", "Profiling Median Duration(us)",
                             "Average Duration(us)", "Median Duration(us)", "Duration(us)")

MATMUL_AXIS_GROUPS = (("M",), ("K",), ("N",), ("M", "K"), ("M", "N"), ("K", "N"), ("M", "K", "N"))
ATTENTION_AXES = ("seq", "batch", "heads", "head_dim")
ATTENTION_AXIS_GROUPS = tuple(group for size in (1, 2, 3) for group in combinations(ATTENTION_AXES, size))
# The axes along which the density standard grids attention (ATTN_SEQ_GRID, ATTN_BATCH_GRID).
_ATTENTION_GRID_AXES = frozenset({"seq", "batch"})
_UNKNOWN = -1


# --- queries and answers -----------------------------------------------------------------------------

class TensorSpec(NamedTuple):
    """One tensor argument as the runtime sees it: shape and torch dtype (a (shape, dtype) pair)."""

    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class AttentionArgs:
    """What the runtime reads from a `tensor_cast.attention`-style call (args 0, 1, 6, 7)."""

    query: TensorSpec
    key: TensorSpec
    seq_lens: tuple[int, ...] | None     # args[6] values; None: not a real tensor (meta), the target fails
    has_query_lens: bool = False         # args[7] is not None
    quant_mode: str | None = None        # kwargs["quant_mode"]


@dataclass(frozen=True)
class Query:
    """One lookup: the framework op (`aten.mm.default`), its tensor inputs with ndim > 0 in argument order
    (lists flattened, as the runtime extracts them) and its output tensors."""

    op_name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...] = ()
    attention: AttentionArgs | None = None

    @property
    def output(self) -> TensorSpec | None:
        return self.outputs[0] if self.outputs else None


@dataclass(frozen=True)
class Interpolation:
    """The runtime's answer to a query its exact lookup missed, and whether the standard allows it."""

    status: AnswerStatus                  # INTERPOLATED, ILLEGAL, MISS, RAISES or UNMODELLED
    latency_us: float | None
    reason: str
    kernel_type: str | None = None
    method: str = ""                      # linear_1d / griddata_linear
    axes: tuple[str, ...] = ()
    lines: tuple[int, ...] = ()           # CSV lines (header = 1) of the rows the answer used


class RuntimeWouldRaise(Exception):
    """A cell the runtime's parser raises on (the model run stops, not only this query)."""


# --- reading cells as the runtime does ---------------------------------------------------------------

def as_runtime_reads(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame as `pandas.read_csv` with default type inference gives it to the runtime.

    opperf reads every cell as text; the runtime lets pandas guess, so an empty cell becomes NaN (str: 'nan')
    and a numeric-looking column becomes numbers. Writing the text back out and reading it the runtime's
    way reproduces both."""
    import pandas as pd

    return pd.read_csv(io.StringIO(frame.to_csv(index=False)))


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def parse_runtime_shapes(text: str) -> list[tuple[int, ...]]:
    """A shape cell as the runtime parses it: outer quotes stripped, empty slots skipped, '()' a scalar."""
    shapes = []
    for part in text.strip().strip('"').split(";"):
        part = part.strip()
        if not part:
            continue
        if part == "()":
            shapes.append(())
            continue
        try:
            shapes.append(tuple(int(x) for x in part.split(",")))
        except ValueError as exc:
            raise RuntimeWouldRaise(f"shape text {text!r} is not integers ({exc})") from exc
    return shapes


def parse_runtime_names(text: str) -> list[str]:
    """A dtype or format cell as the runtime parses it (empty slots skipped)."""
    return [x.strip() for x in text.strip().strip('"').split(";") if x.strip()]


def _finite_positive(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) and number > 0 else None


def _int_cell(value: Any) -> int | None:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if not math.isfinite(number) or not number.is_integer():
        return None
    return int(number)


def _optional_text(value: Any) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    text = str(value).strip()
    return text or None


def preferred_latency_column(columns: Iterable[str]) -> str:
    columns = set(columns)
    return next((c for c in PREFERRED_LATENCY_COLUMNS if c in columns), PREFERRED_LATENCY_COLUMNS[-1])


def row_latency(row: Mapping[str, Any], preferred: str) -> tuple[float, str] | None:
    """The row's latency and the column it came from, in the runtime's order of columns."""
    for column in dict.fromkeys((preferred, *_FALLBACK_LATENCY_COLUMNS)):
        if column in row:
            value = _finite_positive(row[column])
            if value is not None:
                return value, column
    return None


def _dtype_key(kernel_type: str, dtype: str) -> str:
    return _DTYPE_GROUP.get(dtype, dtype) if kernel_type in DTYPE_RELAXED_KERNELS else dtype


def _numel(shape: Sequence[int]) -> int | None:
    total = 1
    for dim in shape:
        if dim < 0:
            return None
        total *= int(dim)
    return total


# --- candidate points and the runtime's 1-D/N-D step ---------------------------------------------------

@dataclass
class Point:
    """One CSV row as an interpolation candidate: its axes, latency and the group it may be combined in."""

    kernel_type: str
    line: int
    axes: dict[str, float]
    latency_us: float
    latency_column: str
    preferred: bool                       # latency from the preferred column (interpolated apart from the rest)
    regime: tuple                         # the runtime's group key, as ordered (field, value) pairs
    bucket: tuple = ()                    # what the standard also holds fixed (formats, layout, raw dtypes…)
    shapes: tuple = ()                    # shapes the single-axis legality test compares
    lines: tuple[int, ...] = ()           # after duplicate merging: every row folded into this point

    def __post_init__(self):
        if not self.lines:
            self.lines = (self.line,)


def _find_boundary(values: Iterable[float], target: float) -> tuple[float, float] | None:
    finite = sorted({float(v) for v in values if math.isfinite(float(v))})
    if not finite or not math.isfinite(target):
        return None
    below = [v for v in finite if v <= target]
    above = [v for v in finite if v >= target]
    if not below or not above:
        return None
    return max(below), min(above)


def _merge_duplicates(points: Sequence[Point], axes: Sequence[str]) -> dict[tuple[float, ...], Point]:
    """One point per coordinate; rows sharing a coordinate give their median latency (the runtime's rule)."""
    grouped: dict[tuple[float, ...], list[Point]] = {}
    for point in points:
        grouped.setdefault(tuple(float(point.axes[a]) for a in axes), []).append(point)
    merged = {}
    for coord, same in grouped.items():
        if len(same) == 1:
            merged[coord] = same[0]
        else:
            merged[coord] = replace(same[0], latency_us=float(statistics.median(p.latency_us for p in same)),
                                    lines=tuple(line for p in same for line in p.lines))
    return merged


@dataclass
class _Step:
    latency_us: float
    method: str
    axes: tuple[str, ...]
    used: list[Point]


def _griddata(points: dict[tuple[float, ...], Point], target: tuple[float, ...]) -> tuple[float, list[Point]] | str:
    """scipy's Delaunay-linear interpolation over the merged points, with the runtime's rejections."""
    import numpy as np

    try:
        from scipy.interpolate import LinearNDInterpolator
    except ImportError:
        return "scipy_unavailable"
    coords = np.asarray(list(points), dtype=float)
    values = np.asarray([p.latency_us for p in points.values()], dtype=float)
    goal = np.asarray(target, dtype=float)
    dim = coords.shape[1]
    if dim not in (2, 3) or len(coords) < dim + 1:
        return "insufficient_points"
    if not (np.isfinite(coords).all() and np.isfinite(values).all() and np.isfinite(goal).all()):
        return "non_finite_input"
    if np.linalg.matrix_rank(coords - coords[0]) < dim:
        return "degenerate_point_cloud"
    try:
        interpolator = LinearNDInterpolator(coords, values)
        result = interpolator(goal.reshape(1, -1))
        simplex = int(interpolator.tri.find_simplex(goal))
    except Exception:      # the runtime treats any scipy failure as "no answer"
        return "scipy_exception"
    latency = float(result[0])
    if simplex < 0 or not math.isfinite(latency):
        return "outside_convex_hull"
    if not latency > 0:
        return "latency_guard_rejected"
    vertices = [list(points.values())[int(i)] for i in interpolator.tri.simplices[simplex]]
    return latency, vertices


def run_axis_groups(points: Sequence[Point], target: Mapping[str, float], axis_groups: Sequence[Sequence[str]], *,
                    max_dim: int | None = None,
                    matchers: Mapping[str, Callable[[float, float], bool]] | None = None) -> _Step | str:
    """The runtime's per-group step: try each axis group in order, first success wins; else the first failure
    status that is not 'missing_target_axis' (the runtime's reported miss reason)."""
    statuses: list[str] = []
    for group in axis_groups:
        axes = tuple(group)
        if not axes or len(axes) > 3:
            continue
        if max_dim is not None and len(axes) > int(max_dim):
            statuses.append("interpolation_dim_disabled")
            continue
        if any(a not in target for a in axes):
            statuses.append("missing_target_axis")
            continue
        candidates = []
        for point in points:
            if any(a not in point.axes for a in axes):
                continue
            fits = True
            for axis, wanted in target.items():
                if axis in axes:
                    continue
                if axis not in point.axes:
                    fits = False
                    break
                matcher = (matchers or {}).get(axis)
                if not (matcher(float(point.axes[axis]), float(wanted)) if matcher
                        else point.axes[axis] == wanted):
                    fits = False
                    break
            if fits and _finite_positive(point.latency_us) is not None:
                candidates.append(point)
        if len(candidates) < 2:
            statuses.append("insufficient_filtered_candidates")
            continue
        bounds = {}
        for axis in axes:
            bound = _find_boundary([p.axes[axis] for p in candidates], float(target[axis]))
            if bound is None:
                break
            bounds[axis] = bound
        if len(bounds) < len(axes):
            statuses.append("outside_axis_boundary")
            continue
        merged = _merge_duplicates(candidates, axes)
        if len(axes) == 1:
            low, high = bounds[axes[0]]
            lower, upper = merged[(low,)], merged[(high,)]
            x = float(target[axes[0]])
            value = lower.latency_us if high == low else (
                lower.latency_us + (x - low) / (high - low) * (upper.latency_us - lower.latency_us))
            if _finite_positive(value) is not None:
                return _Step(float(value), "linear_1d", axes, [lower] if low == high else [lower, upper])
            statuses.append("latency_guard_rejected")
            continue
        unique_per_axis = [len({float(p.axes[a]) for p in candidates}) for a in axes]
        if len(merged) < len(axes) + 1 or min(unique_per_axis) < 2:
            statuses.append("grid_structure_rejected")
            continue
        outcome = _griddata(merged, tuple(float(target[a]) for a in axes))
        if isinstance(outcome, str):
            statuses.append(outcome)
            continue
        return _Step(outcome[0], "griddata_linear", axes, outcome[1])
    meaningful = [s for s in statuses if s != "missing_target_axis"]
    return (meaningful or statuses or ["no_axis_group"])[0]


def _latency_subsets(points: Sequence[Point]) -> list[tuple[str, list[Point]]]:
    """Preferred-column rows first, the rest after: the runtime never mixes the two in one interpolation."""
    preferred = [p for p in points if p.preferred]
    alternate = [p for p in points if not p.preferred]
    return [(label, subset) for label, subset in (("preferred", preferred), ("alternate", alternate)) if subset]


def _group(points: Iterable[Point]) -> dict[tuple, list[Point]]:
    groups: dict[tuple, list[Point]] = {}
    for point in points:
        groups.setdefault(point.regime, []).append(point)
    return groups


def _key_matches(candidate: tuple, target: tuple, *, allow_extra: frozenset = frozenset(),
                 required: frozenset = frozenset()) -> bool:
    """The runtime's group match: every field of the group present in the target and equal (except allowed
    extras), and every required field present in the group."""
    wanted, have = dict(target), dict(candidate)
    if any(f not in wanted for f in required) or any(f not in have for f in required):
        return False
    for name, value in have.items():
        if name in wanted:
            if wanted[name] != value:
                return False
        elif name not in allow_extra:
            return False
    return True


def single_axis(query_shapes: Sequence[Sequence[int]], row_shapes: Sequence[Sequence[int]]) -> bool:
    """Whether a row differs from the query along at most one logical axis: every differing dim holds one
    value in the query and one value in the row (so (T, H) vs (T', H) passes, (T, H) vs (T', H') does not)."""
    if len(query_shapes) != len(row_shapes):
        return False
    pairs = set()
    for q_shape, r_shape in zip(query_shapes, row_shapes):
        if len(q_shape) != len(r_shape):
            return False
        pairs.update((q, r) for q, r in zip(q_shape, r_shape) if q != r)
    return len({q for q, _ in pairs}) <= 1 and len({r for _, r in pairs}) <= 1


# --- the paths -------------------------------------------------------------------------------------------

@dataclass
class _Target:
    kernel_type: str
    axes: dict[str, float]
    regime: tuple
    bucket: tuple = ()
    shapes: tuple = ()
    metadata: dict = field(default_factory=dict)


def _row_formats_dtypes(row, count: int | None):
    shapes = parse_runtime_shapes(_text(row.get("Input Shapes", "")))
    dtypes = parse_runtime_names(_text(row.get("Input Data Types", "")))
    formats = parse_runtime_names(_text(row.get("Input Formats", "")))
    if count is not None:
        shapes, dtypes, formats = shapes[:count], dtypes[:count], formats[:count]
    return shapes, dtypes, formats


def _matmul_axes(kernel_type: str, shapes: Sequence[tuple[int, ...]]):
    """(axes, batch dims, weight layout) from the first two inputs, or None."""
    if len(shapes) < 2:
        return None
    batched = kernel_type in BATCHED_MATMUL_KERNELS

    def normal(shape):
        return shape[1:] if not batched and len(shape) >= 3 and shape[0] == 1 else tuple(shape)

    lhs, rhs = normal(shapes[0]), normal(shapes[1])
    if len(lhs) < 2 or len(rhs) < 2:
        return None
    m, k = lhs[-2], lhs[-1]
    if rhs[-2] == k:
        n, layout = rhs[-1], "rhs_k_n"
    elif rhs[-1] == k:
        n, layout = rhs[-2], "rhs_n_k"
    else:
        return None
    return {"M": float(m), "K": float(k), "N": float(n)}, (tuple(lhs[:-2]), tuple(rhs[:-2])), layout


class _Path:
    """One runtime interpolation path: how rows become points, a query a target, and what is legal."""

    name = ""
    axis_groups: tuple = ()

    def __init__(self, policy: Mapping):
        self.policy = policy          # interpolation_policy.kernel_overrides

    def override(self, kernel_type: str) -> Mapping:
        value = self.policy.get(kernel_type, {})
        return value if isinstance(value, Mapping) else {}

    def points(self, kernel_type: str, rows: list[dict], preferred: str) -> list[Point]:
        raise NotImplementedError

    def groups_for(self, index: dict[tuple, list[Point]], target: _Target) -> list[list[Point]]:
        return [points for key, points in index.items() if _key_matches(key, target.regime)]

    def axis_groups_for(self, kernel_type: str) -> tuple:
        return self.axis_groups

    # What a point's bucket[0] holds: rows combined in one answer must agree on it.
    bucket_name = "input formats"

    def legal(self, target: _Target, step: _Step) -> str | None:
        """None when the rows used lie in the query's bucket (one axis varies, nothing else); else why not.

        A point's bucket is (what the rows must share, their dtype spellings); `shapes`, where a path sets
        them, must differ from the query's along one axis only."""
        if len(step.axes) > 1:
            return f"varies {len(step.axes)} axes at once ({', '.join(step.axes)})"
        shared = {p.bucket[0] for p in step.used}
        if len(shared) > 1:
            return f"combines {self.bucket_name} {sorted(map(str, shared))}"
        dtypes = {p.bucket[1] for p in step.used}
        if dtypes != {target.bucket[1]}:
            return f"row dtypes {sorted(dtypes)} are not the query's {target.bucket[1]}"
        odd = [p for p in step.used if target.shapes and not single_axis(target.shapes, p.shapes)]
        if odd:
            return (f"row shapes {';'.join(map(str, odd[0].shapes))} differ from the query's "
                    f"{';'.join(map(str, target.shapes))} in more than one axis")
        return None


class _MatmulPath(_Path):
    name = "matmul"
    axis_groups = MATMUL_AXIS_GROUPS
    # The query's weight is TensorCast's (K, N) while rows may store (N, K): rows combined must share theirs.
    bucket_name = "weight layouts"

    def __init__(self, policy, input_count: int | None):
        super().__init__(policy)
        self.input_count = input_count

    def points(self, kernel_type, rows, preferred):
        points = []
        for index, row in enumerate(rows):
            shapes, dtypes, formats = _row_formats_dtypes(row, self.input_count)
            if len(shapes) < 2 or len(dtypes) < len(shapes) or len(formats) < len(shapes):
                continue
            logical = [_logical(tuple(s), formats[i]) for i, s in enumerate(shapes)]
            extracted = _matmul_axes(kernel_type, logical)
            if extracted is None:
                continue
            latency = row_latency(row, preferred)
            if latency is None:
                continue
            axes, batch_dims, layout = extracted
            count = self.input_count if self.input_count is not None else len(shapes)
            regime = (("kernel_type", kernel_type), ("input_count", count),
                      ("input_dtypes", tuple(_dtype_key(kernel_type, d) for d in dtypes[:count])),
                      ("batch_dims", batch_dims), ("input_formats", tuple(formats[:count])))
            points.append(Point(kernel_type, index + 2, axes, latency[0], latency[1], latency[1] == preferred,
                                regime, bucket=(layout, tuple(dtypes[:count]))))
        return points

    def target(self, query: Query, kernel_type: str, mapping: Mapping) -> _Target | str:
        if kernel_type not in INTERPOLATION_MATMUL_KERNELS:
            return "target_unavailable"
        inputs = list(query.inputs)
        if self.input_count is not None:
            inputs = inputs[:self.input_count]
        if len(inputs) < 2:
            return "target_unavailable"
        extracted = _matmul_axes(kernel_type, [tuple(s.shape) for s in inputs])
        if extracted is None:
            return "target_unavailable"
        spelled = [query_dtype(s.dtype) for s in inputs]
        if None in spelled:
            return "target_unavailable"
        axes, batch_dims, layout = extracted
        count = self.input_count if self.input_count is not None else len(inputs)
        regime = (("kernel_type", kernel_type), ("input_count", count),
                  ("input_dtypes", tuple(_dtype_key(kernel_type, d) for d in spelled[:count])),
                  ("batch_dims", batch_dims))
        return _Target(kernel_type, axes, regime, bucket=(layout, tuple(spelled[:count])))

    def groups_for(self, index, target):
        extra = frozenset({"output_count", "output_dtypes", "output_formats", "input_formats"})
        matched = [pts for key, pts in index.items() if _key_matches(key, target.regime, allow_extra=extra)]

        def rank(pts):
            formats = dict(pts[0].regime).get("input_formats")
            return (0 if formats and all(f == "ND" for f in formats) else 1, -len(pts))

        return sorted(matched, key=rank)


def broadcast_flags(inputs: Sequence[Sequence[int]], output: Sequence[int] | None) -> tuple[bool, ...]:
    """Per input, whether it is broadcast to the output (broadcastable to it, fewer elements): part of an
    elementwise kernel's execution path (an input of another shape, a GEMM's, is never flagged).

    mul of (M, 257, 128) by (1, 257, 128) runs TensorIterator's broadcasting kernel from M = 2 and a same-shape
    one at M = 1 (2.4 against 1.1 µs on an H100): the V1 standard's strict signature keeps such a field fixed
    in an interpolation bucket, so M = 1 is not a neighbour of M = 2 there."""
    out = tuple(output) if output is not None else ()
    if not _numel(out):
        return ()

    def broadcast(shape: tuple[int, ...]) -> bool:       # broadcastable to the output, and smaller than it
        fits = len(shape) <= len(out) and all(d in (1, o) for d, o in zip(reversed(shape), reversed(out)))
        return fits and (_numel(shape) or 0) < _numel(out)

    return tuple(broadcast(tuple(shape)) for shape in inputs)


class _GenericPath(_Path):
    name = "generic compute"
    bucket_name = "input formats and broadcast operands"

    def __init__(self, policy, input_count: int | None, policy_kernel_type: str):
        super().__init__(policy)
        self.input_count = input_count
        self.policy_kernel_type = policy_kernel_type

    def axis_name(self, kernel_type: str) -> str:
        for kt in dict.fromkeys((kernel_type, self.policy_kernel_type)):
            generic = self.override(kt).get("generic_compute", {})
            if isinstance(generic, Mapping) and generic:
                return "output_numel" if generic.get("axis", "axis_0") == "output_numel" else "axis_0"
        return "axis_0"

    def axis_groups_for(self, kernel_type):
        return ((self.axis_name(kernel_type),),)

    def _axes(self, kernel_type, logical, outputs):
        if self.axis_name(kernel_type) == "output_numel":
            if not outputs or len(outputs) != 1:
                return None
            out = tuple(outputs[0])
            out = out[1:] if len(out) >= 3 and out[0] == 1 else out
            numel = _numel(out)
            if numel is None:
                return None
            return {"output_numel": float(numel)}, (("output_tail_shape", out[1:]),)
        if not logical or not logical[0]:
            return None
        return {"axis_0": float(logical[0][0])}, (("shape_signature", (logical[0][1:], tuple(logical[1:]))),)

    def points(self, kernel_type, rows, preferred):
        points = []
        for index, row in enumerate(rows):
            shapes, dtypes, formats = _row_formats_dtypes(row, self.input_count)
            if not shapes or len(dtypes) < len(shapes) or len(formats) < len(shapes):
                continue
            logical = [strip_batch(_logical(tuple(s), formats[i])) for i, s in enumerate(shapes)]
            if not logical[0]:
                continue
            outputs = parse_runtime_shapes(_text(row.get("Output Shapes", "")))
            axes = self._axes(kernel_type, logical, outputs)
            latency = row_latency(row, preferred)
            if axes is None or latency is None:
                continue
            count = len(logical)
            regime = (("kernel_type", kernel_type), ("input_count", count),
                      ("input_dtypes", tuple(_dtype_key(kernel_type, d) for d in dtypes[:count])), *axes[1])
            out_shapes = tuple(tuple(o) for o in outputs)
            flags = broadcast_flags(shapes, out_shapes[0] if out_shapes else None)
            points.append(Point(kernel_type, index + 2, axes[0], latency[0], latency[1], latency[1] == preferred,
                                regime, bucket=((tuple(formats[:count]), flags), tuple(dtypes[:count])),
                                shapes=(*logical, *out_shapes) if self.axis_name(kernel_type) == "output_numel"
                                else ()))
        return points

    def target(self, query, kernel_type, mapping):
        inputs = list(query.inputs)
        if self.input_count is not None:
            inputs = inputs[:self.input_count]
        if not inputs:
            return "compute_target_unavailable"
        spelled = [query_dtype(s.dtype) for s in inputs]
        if None in spelled:
            return "compute_target_unavailable"
        logical = [strip_batch(tuple(s.shape)) for s in inputs]
        if not logical[0]:
            return "compute_target_unavailable"
        axes = self._axes(kernel_type, logical, [tuple(o.shape) for o in query.outputs])
        if axes is None:
            return "compute_target_unavailable"
        regime = (("kernel_type", kernel_type), ("input_count", len(logical)),
                  ("input_dtypes", tuple(_dtype_key(kernel_type, d) for d in spelled)), *axes[1])
        numel_axis = self.axis_name(kernel_type) == "output_numel"
        flags = broadcast_flags([tuple(s.shape) for s in inputs], tuple(query.outputs[0].shape) if query.outputs
                                else None)
        return _Target(kernel_type, axes[0], regime, bucket=(None, tuple(spelled)),
                       shapes=(*logical, *(tuple(o.shape) for o in query.outputs)) if numel_axis else (),
                       metadata={"broadcast": flags})

    def legal(self, target, step):
        """The base rule, and the rows used broadcast the same operands as the query does."""
        reason = super().legal(target, step)
        wanted = target.metadata.get("broadcast")
        if reason is None and wanted:
            have = {p.bucket[0][1] for p in step.used}
            if have != {wanted}:
                return f"broadcasts other operands than the query ({sorted(map(str, have))}, query {wanted})"
        return reason


class _ElementwisePath(_Path):
    name = "elementwise"
    axis_groups = (("io_numel",),)

    def points(self, kernel_type, rows, preferred, output_dtype: str | None = None):
        points = []
        for index, row in enumerate(rows):
            inputs = parse_runtime_shapes(_text(row.get("Input Shapes", "")))
            outputs = parse_runtime_shapes(_text(row.get("Output Shapes", "")))
            out_dtypes = parse_runtime_names(_text(row.get("Output Data Types", "")))
            if not outputs:
                continue
            out = strip_batch(tuple(outputs[0]))
            latency = row_latency(row, preferred)
            if not out or latency is None:
                continue
            row_dtype = out_dtypes[0] if out_dtypes else None
            if not row_dtype or not output_dtype or row_dtype != output_dtype:
                continue
            stripped = [strip_batch(tuple(s)) for s in inputs]
            numels = [_numel(s) for s in stripped]
            out_numel = _numel(out)
            if None in numels or out_numel is None:
                continue
            regime = (("kernel_type", kernel_type), ("query_mode", "elementwise"), ("output_rank", len(out)),
                      ("input_count", len(stripped)), ("output_dtype", row_dtype),
                      ("broadcast_pattern", broadcast_pattern(out, stripped)))
            input_dtypes = tuple(parse_runtime_names(_text(row.get("Input Data Types", ""))))
            points.append(Point(kernel_type, index + 2, {"io_numel": float(sum(numels) + out_numel)}, latency[0],
                                latency[1], latency[1] == preferred, regime, bucket=(None, input_dtypes),
                                shapes=(*stripped, out)))
        return points

    def target(self, query, kernel_type, mapping):
        out = query.outputs[0] if query.outputs else None
        if out is None or len(out.shape) == 0:
            return "elementwise_output_unavailable"
        out_shape = strip_batch(tuple(out.shape))
        if len(out_shape) < 1:
            return "elementwise_output_shape_unavailable"
        stripped = [strip_batch(tuple(s.shape)) for s in query.inputs]
        numels = [_numel(s) for s in stripped]
        if None in numels or _numel(out_shape) is None:
            return "elementwise_shape_invalid"
        out_dtype = query_dtype(out.dtype)
        regime = (("kernel_type", kernel_type), ("query_mode", "elementwise"), ("output_rank", len(out_shape)),
                  ("input_count", len(stripped)), ("output_dtype", out_dtype or ""),
                  ("broadcast_pattern", broadcast_pattern(out_shape, stripped)))
        spelled = tuple(query_dtype(s.dtype, str(s.dtype)) for s in query.inputs)
        return _Target(kernel_type, {"io_numel": float(sum(numels) + _numel(out_shape))}, regime,
                       bucket=(None, spelled),
                       shapes=(*stripped, out_shape), metadata={"output_dtype": out_dtype})


def _normalize_attention_q(shape: tuple[int, ...], head_dim: int = 0) -> tuple[int, ...] | None:
    if len(shape) == 3:
        return shape
    if len(shape) == 4 and shape[2] == 1:
        return (shape[0], shape[1], shape[3])
    if len(shape) == 2 and head_dim > 0 and shape[1] % head_dim == 0:
        return (shape[0], shape[1] // head_dim, head_dim)
    return None


def _q_tokens_match(candidate: float, wanted: float) -> bool:
    a, b = int(candidate), int(wanted)
    return a == b or is_block_padded(a, b) or is_block_padded(b, a)


class _AttentionPath(_Path):
    name = "attention"
    axis_groups = ATTENTION_AXIS_GROUPS

    def __init__(self, policy, columns: Sequence[str] = ()):
        super().__init__(policy)
        self.columns = set(columns)

    def seq_column(self) -> str | None:
        return next((c for c in ("Runtime avg_seq_len", "avg_seq_len") if c in self.columns), None)

    def points(self, kernel_type, rows, preferred):
        seq_column = self.seq_column()
        if seq_column is None or "Input Shapes" not in self.columns:
            return []
        points = []
        for index, row in enumerate(rows):
            seq = _int_cell(row.get(seq_column))
            if seq is None or seq < 0:
                continue
            shapes = parse_runtime_shapes(_text(row.get("Input Shapes", "")))
            if not shapes:
                continue
            q_raw = shapes[0]
            head_dim = shapes[1][-1] if len(shapes) > 1 and shapes[1] else q_raw[-1]
            q = _normalize_attention_q(q_raw, head_dim)
            dtypes = parse_runtime_names(_text(row.get("Input Data Types", "")))
            latency = row_latency(row, preferred)
            if q is None or not dtypes or latency is None:
                continue
            axes = {"q_tokens": float(q[0]), "seq": float(seq), "heads": float(q[1]), "head_dim": float(q[2])}
            if "Runtime batch_size" in self.columns:
                batch = _int_cell(row.get("Runtime batch_size"))
            elif len(q_raw) == 4 and q_raw[2] == 1:
                batch = int(q_raw[0])
            else:
                batch = None
            if batch is not None:
                axes["batch"] = float(batch)
            regime = [("kernel_type", kernel_type), ("dtype", dtypes[0])]
            if "Runtime sparse_mode" in self.columns:
                sparse = _int_cell(row.get("Runtime sparse_mode"))
                regime.append(("sparse_mode", _UNKNOWN if sparse is None else sparse))
            if "Runtime num_key_value_heads" in self.columns:
                kv_heads = _int_cell(row.get("Runtime num_key_value_heads"))
                regime.append(("kv_heads", _UNKNOWN if kv_heads is None else kv_heads))
            for column, name in (("Runtime input_layout", "input_layout"), ("Runtime quant_mode", "quant_mode")):
                value = _optional_text(row.get(column)) if column in self.columns else None
                if value is not None:
                    regime.append((name, value))
            points.append(Point(kernel_type, index + 2, axes, latency[0], latency[1], latency[1] == preferred,
                                tuple(regime)))
        return points

    def target(self, query, kernel_type, mapping):
        args = query.attention
        if args is None or args.seq_lens is None:
            return "attention_target_unavailable"
        q_shape, k_shape = tuple(args.query.shape), tuple(args.key.shape)
        head_dim = k_shape[-1] if len(k_shape) >= 1 else 0
        q = _normalize_attention_q(q_shape, head_dim)
        dtype = query_dtype(args.query.dtype)
        if q is None or dtype is None or not args.seq_lens:
            return "attention_target_unavailable"
        import torch   # the runtime's own float32 mean, rounding included

        average = int(torch.tensor(args.seq_lens, dtype=torch.float32).mean().item())
        axes = {"q_tokens": float(q[0]), "seq": float(average), "heads": float(q[1]), "head_dim": float(q[2])}
        batch = float(q_shape[0]) if len(q_shape) == 4 else float(len(args.seq_lens))
        if len(q_shape) == 4:
            layout = "BNSD_NBSD"
        elif len(q_shape) == 3 or (len(q_shape) == 2 and _normalize_attention_q(q_shape, head_dim) is not None):
            layout = "TND"
        else:
            layout = None
        sparse = 0 if layout == "BNSD_NBSD" else 3 if (layout == "TND" or args.has_query_lens) else None
        if sparse is None:
            return "attention_sparse_mode_unknown"
        if len(k_shape) < 2:
            kv_heads = None
        elif layout == "BNSD_NBSD" and len(k_shape) >= 4:
            kv_heads = k_shape[1]
        else:
            kv_heads = k_shape[-2]
        quant = self.override(kernel_type).get("quant_mode")
        quant = quant if quant is not None else mapping.get("quant_mode", args.quant_mode)
        regime = [("kernel_type", kernel_type), ("dtype", dtype), ("sparse_mode", sparse),
                  ("kv_heads", int(kv_heads) if kv_heads is not None else _UNKNOWN)]
        if layout is not None:
            regime.append(("input_layout", layout))
        if quant is not None:
            regime.append(("quant_mode", str(quant)))
        return _Target(kernel_type, axes, tuple(regime), metadata={"batch": batch})

    def groups_for(self, index, target):
        fields = dict(target.regime)
        required = {"sparse_mode", "kv_heads"}
        if "input_layout" in fields:
            required.add("input_layout")
        if "quant_mode" in fields and "Runtime quant_mode" in self.columns:
            required.add("quant_mode")
        return [pts for key, pts in index.items() if _key_matches(key, target.regime, required=frozenset(required))]

    def legal(self, target, step):
        if len(step.axes) > 1:
            return f"varies {len(step.axes)} axes at once ({', '.join(step.axes)})"
        if step.axes[0] not in _ATTENTION_GRID_AXES:
            return f"interpolates along {step.axes[0]}, a structural attention dim (exact values only)"
        if any(p.axes["q_tokens"] != target.axes["q_tokens"] for p in step.used):
            return "matched q_tokens through block padding, not exactly"
        return None


# --- the interpolation entry points ------------------------------------------------------------------------

def _overrides(op_mapping: Mapping) -> Mapping:
    policy = op_mapping.get("interpolation_policy") or {}
    overrides = policy.get("kernel_overrides") if isinstance(policy, Mapping) else None
    return overrides if isinstance(overrides, Mapping) else {}


def _kernel_types(mapping: Mapping) -> list[str]:
    return list(dict.fromkeys([mapping["kernel_type"], *(mapping.get("alternate_kernel_types") or [])]))


_UNMODELLED_QUERY_MODES = {"moe_fused": "moe_fused", "scatter_nd_update_mla": "scatter_nd_update_mla"}


def path_for(mapping: Mapping, op_mapping: Mapping, columns: Sequence[str] = ()) -> _Path | str:
    """The runtime's path for an op_mapping entry, or the status/reason it ends with before any path."""
    overrides = _overrides(op_mapping)
    if mapping.get("composite"):
        return f"{AnswerStatus.UNMODELLED}: composite"
    if mapping.get("category") == "communication":
        return f"{AnswerStatus.MISS}: wrapper_communication_owned_by_base"
    mode = mapping.get("query_mode")
    if mode in _UNMODELLED_QUERY_MODES:
        return f"{AnswerStatus.UNMODELLED}: query_mode {mode}"
    if mode == "attention_special":
        return _AttentionPath(overrides, columns)
    if mode == "attention_lightning_indexer":
        return f"{AnswerStatus.MISS}: runtime_attention_leaf_required"
    if mode == "elementwise":
        return _ElementwisePath(overrides)
    subcategory = mapping.get("compute_subcategory")
    if subcategory is not None:
        if str(subcategory) in ("compute_scale", "quantized_matmul"):
            return f"{AnswerStatus.UNMODELLED}: compute_subcategory {subcategory}"
        return f"{AnswerStatus.MISS}: compute_subcategory_unknown"
    kernel_type = mapping.get("kernel_type")
    if not kernel_type:
        return f"{AnswerStatus.MISS}: compute_kernel_type_missing"
    if kernel_type in INTERPOLATION_MATMUL_KERNELS:
        return _MatmulPath(overrides, mapping.get("tc_input_count"))
    return _GenericPath(overrides, mapping.get("tc_input_count"), kernel_type)


def _first_unreadable_cell(rows: Sequence[Mapping]) -> str | None:
    """Where the runtime's shape parser first raises: 'line N, field F: text'."""
    for index, row in enumerate(rows):
        for column in ("Input Shapes", "Output Shapes"):
            if column in row:
                try:
                    parse_runtime_shapes(_text(row[column]))
                except RuntimeWouldRaise:
                    shown = "an empty cell (read as NaN)" if _text(row[column]) == "nan" else repr(_text(row[column]))
                    return f"line {index + 2}, field {column!r}: the runtime's shape parser raises on {shown}"
    return None


class Database:
    """A database directory as the runtime's interpolation step sees it: op_mapping.yaml and kernel CSVs,
    read lazily, candidate points built once per kernel type and path."""

    def __init__(self, op_mapping: Mapping, tables: Mapping[str, pd.DataFrame] | None = None,
                 directory: str | Path | None = None):
        self.op_mapping = op_mapping or {}
        self.directory = Path(directory) if directory is not None else None
        self._tables = dict(tables or {})
        self._runtime_rows: dict[str, list[dict] | None] = {}
        self._points: dict[tuple, list[Point]] = {}

    @classmethod
    def load(cls, directory: str | Path) -> Database:
        directory = Path(directory)
        path = directory / "op_mapping.yaml"
        try:
            op_mapping = yaml.safe_load(path.read_text(encoding="utf-8")) if path.exists() else {}
        except (OSError, yaml.YAMLError) as exc:
            raise OpperfError(f"cannot read op_mapping: {exc}", path=path) from exc
        return cls(op_mapping or {}, directory=directory)

    def columns(self, kernel_type: str) -> list[str]:
        frame = self._table(kernel_type)
        return [] if frame is None else list(frame.columns)

    def _table(self, kernel_type: str):
        if kernel_type not in self._tables and self.directory is not None:
            from opperf.io import read_database_csv

            path = self.directory / f"{kernel_type}.csv"
            self._tables[kernel_type] = read_database_csv(path) if path.is_file() else None
        return self._tables.get(kernel_type)

    def rows(self, kernel_type: str) -> list[dict] | None:
        """The CSV's rows with the runtime's cell types (see `as_runtime_reads`)."""
        if kernel_type not in self._runtime_rows:
            frame = self._table(kernel_type)
            self._runtime_rows[kernel_type] = (None if frame is None
                                               else as_runtime_reads(frame).to_dict("records"))
        return self._runtime_rows[kernel_type]

    def points(self, path: _Path, kernel_type: str, **options) -> list[Point] | None:
        key = (type(path).__name__, kernel_type, getattr(path, "input_count", None),
               getattr(path, "policy_kernel_type", None), tuple(sorted(options.items())))
        if key not in self._points:
            rows = self.rows(kernel_type)
            if rows is None:
                return None
            preferred = preferred_latency_column(self.columns(kernel_type))
            try:
                self._points[key] = path.points(kernel_type, rows, preferred, **options)
            except RuntimeWouldRaise as exc:
                raise RuntimeWouldRaise(f"{kernel_type}.csv {_first_unreadable_cell(rows) or exc}") from exc
        return self._points[key]

    def interpolate(self, query: Query) -> Interpolation:
        return interpolate_query(self, query)


def interpolate(tables: Mapping[str, pd.DataFrame], query: Query, op_mapping: Mapping) -> Interpolation:
    """What the runtime's interpolation step answers for `query`, given kernel CSVs read as strings
    (kernel type -> `opperf.io.read_database_csv` frame) and the database's op_mapping."""
    return interpolate_query(Database(op_mapping, tables), query)


def interpolate_query(database: Database, query: Query) -> Interpolation:
    mapping = (database.op_mapping.get("operator_mappings") or {}).get(query.op_name)
    if mapping is None:
        return Interpolation(AnswerStatus.MISS, None, "wrapper_unmapped")
    if mapping.get("zero_cost") or mapping.get("accepted_miss"):
        return Interpolation(AnswerStatus.MISS, None, "wrapper_not_applicable")
    try:
        return _interpolate_mapped(database, query, mapping)
    except RuntimeWouldRaise as exc:
        return Interpolation(AnswerStatus.RAISES, None, str(exc))


def _interpolate_mapped(database: Database, query: Query, mapping: Mapping) -> Interpolation:
    primary = mapping.get("kernel_type")
    path = path_for(mapping, database.op_mapping, database.columns(primary) if primary else ())
    if isinstance(path, str):
        status, reason = path.split(": ", 1)
        return Interpolation(AnswerStatus(status), None, reason)
    last_reason = "candidate_group_failed"
    for kernel_type in _kernel_types(mapping):
        if isinstance(path, _AttentionPath):
            path = _AttentionPath(path.policy, database.columns(kernel_type))
            points = database.points(path, kernel_type)
            if points is None or path.seq_column() is None or "Input Shapes" not in path.columns:
                last_reason = "attention_index_unavailable"
                continue
        target = path.target(query, kernel_type, mapping)
        if isinstance(target, str):
            last_reason = target
            continue
        if isinstance(path, _ElementwisePath):
            points = database.points(path, kernel_type, output_dtype=target.metadata["output_dtype"])
        elif not isinstance(path, _AttentionPath):
            points = database.points(path, kernel_type)
        if points is None:
            last_reason = "csv_not_found"
            continue
        if (isinstance(path, _AttentionPath) and "Runtime input_layout" in path.columns
                and "input_layout" not in dict(target.regime)):
            last_reason = "attention_input_layout_unavailable"
            continue
        answer = _interpolate_target(path, points, target)
        if isinstance(answer, Interpolation):
            return answer
        last_reason = answer
    return Interpolation(AnswerStatus.MISS, None, last_reason)


def _interpolate_target(path: _Path, points: Sequence[Point], target: _Target) -> Interpolation | str:
    groups = path.groups_for(_group(points), target)
    if not groups:
        return "regime_key_unmatched"
    override = path.override(target.kernel_type)
    status = "candidate_group_failed"
    for group in groups:
        for _label, subset in _latency_subsets(group):
            axes, matchers = dict(target.axes), None
            if isinstance(path, _AttentionPath):
                prepared = _prepare_attention(path, subset, axes, target, override)
                if isinstance(prepared, str):
                    status = prepared
                    continue
                subset, axes = prepared
                matchers = {"q_tokens": _q_tokens_match}
            step = run_axis_groups(subset, axes, path.axis_groups_for(target.kernel_type),
                                   max_dim=override.get("max_interpolation_dim"), matchers=matchers)
            if isinstance(step, str):
                status = step
                continue
            lines = tuple(sorted(line for p in step.used for line in p.lines))
            illegal = path.legal(target, step)
            if illegal is None:
                return Interpolation(AnswerStatus.INTERPOLATED, step.latency_us,
                                     f"{step.method} along {', '.join(step.axes)}", target.kernel_type, step.method,
                                     step.axes, lines)
            return Interpolation(AnswerStatus.ILLEGAL, step.latency_us, illegal, target.kernel_type, step.method,
                                 step.axes, lines)
    return status


def _prepare_attention(path: _AttentionPath, subset: list[Point], axes: dict, target: _Target, override: Mapping):
    """The runtime's batch-axis handling and optional sqrt(seq) transform for one attention group."""
    if any("batch" in p.axes for p in subset) and "batch" not in axes:
        if target.metadata.get("batch") is not None:
            axes["batch"] = float(target.metadata["batch"])
        else:
            batchless = [p for p in subset if "batch" not in p.axes]
            if batchless:
                subset = batchless
            else:
                values = {float(p.axes["batch"]) for p in subset}
                if len(values) > 1:
                    return "batch_axis_unconstrained"
                axes["batch"] = next(iter(values))
    if override.get("axis_transform", override.get("shape_transform")) in {"sqrt", "sqrt_seq"}:
        axes["seq"] = math.sqrt(axes["seq"])
        subset = [replace(p, axes={**p.axes, "seq": math.sqrt(p.axes["seq"])}) for p in subset if p.axes["seq"] >= 0]
    return subset, axes


# --- holdout: how well the runtime's rule predicts rows it is not given -------------------------------------

@dataclass(frozen=True)
class HoldoutPoint:
    """One interior coordinate predicted from its neighbours by the runtime's rule, the row(s) left out."""

    kernel_type: str
    lines: tuple[int, ...]
    axis: str
    value: float
    lower: float
    upper: float
    actual_us: float
    predicted_us: float
    relative_error: float
    legal: bool
    latency_column: str
    bucket: str
    crosses_branch: bool = False          # illegal because a neighbour ran another execution branch


def mapping_for_kernel(kernel_type: str, op_mapping: Mapping) -> Mapping:
    """The op_mapping entry whose runtime path reads this kernel type (primary first), or a bare one."""
    entries = [m for m in (op_mapping.get("operator_mappings") or {}).values() if isinstance(m, Mapping)
               and m.get("kernel_type")]
    for entry in entries:
        if entry["kernel_type"] == kernel_type:
            return entry
    for entry in entries:
        if kernel_type in (entry.get("alternate_kernel_types") or []):
            return entry
    return {"kernel_type": kernel_type}


# --- execution branches: what the standard's bucket also holds fixed, read from a row --------------------------
#
# The V1 standard's interpolation bucket is the strict signature less the interpolated axis, and the strict
# signature keeps "the runtime metadata that selects an execution branch"; it forbids interpolating across
# branches. Three such fields are in our rows but not in the runtime's key, and each was measured to change the
# kernel's time in steps a line between neighbours cannot follow (benchmarks/results/cuda_database/README.md):
# - the memory layout of each input (Input Strides): rows of one runtime key along an axis come from other TP
#   sizes, whose fused buffers the op reads through other strides (neg of a rope slice, 16 heads: 14.9 µs read
#   at 1.25x the packed row width, predicted 19.1 µs from 8 and 32 heads read at 10x and 1.25x);
# - for packed inputs on CUDA, whether the element count fills whole blocks of PyTorch's vectorised elementwise
#   kernel (128 threads x 16-byte vectors: 2,048 bytes; 1,024 bf16 elements, measured on an H100): the rest
#   runs the scalar tail path (rsqrt of 4,096 bf16 elements 1.19 µs, of 4,095 1.49 µs, of 4,097 1.27 µs);
# - for a same-dtype copy of one dense layout (definitions with `memcpy_when_dense`: clone, copy_, contiguous,
#   _to_copy), which path the driver's device-to-device memcpy takes: ATen issues one cudaMemcpyAsync, not a
#   TensorIterator kernel, and its time steps with the byte count (benchmarks/results/memcpy_tail/, H100): under
#   1 MiB a count off 16-byte vectors is slower (256 KiB + 2 B: 1.52 µs, 256 KiB: 1.18 µs); from 1 MiB on, whole
#   4 KiB pages copy fast and any remainder costs 2.3-3 µs more, bimodally (4 MiB: 2.30 µs, 4 MiB + 2 KiB: 4.72
#   µs; 32 MiB + 16 B: 26.1 µs, 32 MiB: 23.1 µs); crossing 1 MiB changes the path too (960 KiB 1.63 µs, 1 MiB
#   1.28 µs). clone of (1, h, 1, 1000, 56) bf16 along heads: 1.57 / 3.94 / 2.26 / 3.88 µs at h = 8/16/32/64,
#   h = 16 (1,792,000 B, 2^11 x 875) the only one with a remainder past 1 MiB.
# Holdout points whose neighbours lie on another branch are ILLEGAL, like those combining buckets.

VECTOR_BLOCK_BYTES = {"cuda": 2048}
# Definition categories whose CUDA kernels are TensorIterator loops (vectorised when every operand is packed).
VECTORISED_CATEGORIES = frozenset({"elementwise", "activation", "memory"})
# Device-to-device memcpy: (the size from which the large path runs, its alignment below, its alignment from it).
MEMCPY_PATHS = {"cuda": (1 << 20, 16, 4096)}


def layout_class(shape: Sequence[int], strides: Sequence[int] | None) -> tuple | str:
    """A size-independent name for a tensor's memory layout: 'packed', or the dims (size > 1) innermost first
    with each one's stride relative to the extent of the dim inside it (1: packed against it; 10: one row in
    ten of a wider buffer; 0: broadcast). Rows of one layout family keep it as the interpolated axis grows, which
    grid.templates.Layout (the buffer's excess in elements, for building rows) does not: it grows with the TP size."""
    if strides is None or len(strides) != len(shape) or is_contiguous(shape, strides):
        return "packed"
    dims = sorted((i for i, size in enumerate(shape) if size > 1), key=lambda i: (strides[i], -i))
    family, inner = [], 1
    for i in dims:
        family.append((i, round(strides[i] / inner, 4) if inner else 0.0))
        inner = strides[i] * shape[i] if strides[i] else inner
    return tuple(family)


def _is_dense(layout: tuple | str) -> bool:
    """Packed, or a permutation of packed (every dim packed against the one inside it): no gaps, no broadcast."""
    return layout == "packed" or all(ratio == 1.0 for _, ratio in layout)


def execution_branch(row: Mapping[str, Any], backend: str | None, category: str | None,
                     memcpy_when_dense: bool = False) -> tuple:
    """(each input's layout class, the path a packed CUDA loop or a device memcpy takes by the size, or None).

    The path is whether a vectorised loop fills whole blocks (True/False), or for a copy that runs as a memcpy
    ('memcpy', whether it is past the large-copy size, whether its bytes are whole units of that path)."""
    shapes = parse_runtime_shapes(_text(row.get("Input Shapes", "")))
    cell = row.get("Input Strides")
    try:                                  # an empty cell (NaN where pandas read it) or unreadable text: packed
        strides = [parse_strides(slot) for slot in split_slots(cell)] if isinstance(cell, str) else []
    except OpperfError:
        strides = []
    strides += [None] * (len(shapes) - len(strides))
    layouts = tuple(layout_class(shape, stride) for shape, stride in zip(shapes, strides))
    block = VECTOR_BLOCK_BYTES.get(backend or "")
    outputs = parse_runtime_shapes(_text(row.get("Output Shapes", "")))
    out_dtypes = parse_runtime_names(_text(row.get("Output Data Types", "")))
    memcpy = MEMCPY_PATHS.get(backend or "")
    in_dtypes = parse_runtime_names(_text(row.get("Input Data Types", "")))
    if (memcpy and memcpy_when_dense and outputs and out_dtypes and is_known_dtype(out_dtypes[0]) and layouts
            and len(set(layouts)) == 1 and _is_dense(layouts[0]) and set(in_dtypes) == {out_dtypes[0]}):
        large_from, small_unit, large_unit = memcpy
        size = (_numel(outputs[0]) or 0) * dtype_bytes(out_dtypes[0])
        large = size >= large_from
        return layouts, ("memcpy", large, size % (large_unit if large else small_unit) == 0)
    whole_blocks = None
    if (block and category in VECTORISED_CATEGORIES and outputs and out_dtypes and is_known_dtype(out_dtypes[0])
            and all(layout == "packed" for layout in layouts)):
        whole_blocks = (_numel(outputs[0]) or 0) * dtype_bytes(out_dtypes[0]) % block == 0
    return layouts, whole_blocks


def holdout_errors(rows: pd.DataFrame, kernel_type: str, op_mapping: Mapping | None = None) -> list[HoldoutPoint]:
    """Every interior coordinate of the CSV's interpolation buckets, predicted by the runtime's rule from the
    other rows (all rows at that coordinate left out); relative error |predicted - actual| / actual.

    The axis is the path's first: M for MatMul kernels, the leading dim (or output size) for generic compute,
    elements moved for elementwise, seq for attention. Rows whose latency came from different columns are
    never combined, as in the runtime; `latency_column` says which."""
    op_mapping = op_mapping or {}
    mapping = dict(mapping_for_kernel(kernel_type, op_mapping))
    path = path_for({**mapping, "kernel_type": mapping.get("kernel_type", kernel_type)}, op_mapping,
                    list(rows.columns))
    if isinstance(path, str):
        return []
    if isinstance(path, _GenericPath):
        path.policy_kernel_type = mapping.get("kernel_type", kernel_type)
    database = Database(op_mapping, {kernel_type: rows})
    try:
        if isinstance(path, _ElementwisePath):
            # The runtime builds its elementwise candidates per query output dtype: one pass per dtype present.
            spelled = {names[0] for r in database.rows(kernel_type)
                       if (names := parse_runtime_names(_text(r.get("Output Data Types", ""))))}
            points = [p for dtype in sorted(spelled) for p in database.points(path, kernel_type, output_dtype=dtype)]
        else:
            points = database.points(path, kernel_type) or []
    except RuntimeWouldRaise as exc:
        raise OpperfError(f"the runtime cannot interpolate {exc}") from exc
    axis = path.axis_groups_for(kernel_type)[0][0]
    override = path.override(kernel_type)
    opperf = op_mapping.get("opperf") if isinstance(op_mapping.get("opperf"), Mapping) else {}
    kernel_entry = (opperf.get("kernel_types") or {}).get(kernel_type) or {}
    table = rows.to_dict("records")
    branches = {line: execution_branch(table[line - 2], opperf.get("backend"), kernel_entry.get("category"),
                                       bool(kernel_entry.get("memcpy_when_dense")))
                for line in {line for p in points for line in p.lines}} if table else {}
    records = []
    for group in _group(points).values():
        for label, subset in _latency_subsets(group):
            records += _holdout_subset(path, subset, axis, override, kernel_type, label, branches)
    return records


def _holdout_subset(path: _Path, subset: list[Point], axis: str, override: Mapping, kernel_type: str,
                    label: str, branches: Mapping[int, tuple]) -> list[HoldoutPoint]:
    matchers = {"q_tokens": _q_tokens_match} if isinstance(path, _AttentionPath) else None
    transform = (isinstance(path, _AttentionPath)
                 and override.get("axis_transform", override.get("shape_transform")) in {"sqrt", "sqrt_seq"})
    records = []
    slices: dict[tuple, list[Point]] = {}
    for point in subset:
        others = tuple(sorted((a, v) for a, v in point.axes.items() if a != axis))
        slices.setdefault(others, []).append(point)
    for points in slices.values():
        coordinates = sorted({p.axes[axis] for p in points})
        for low, value, high in zip(coordinates, coordinates[1:], coordinates[2:]):
            left_out = [p for p in points if p.axes[axis] == value]
            rest = [p for p in subset if p not in left_out]
            target_axes = dict(left_out[0].axes)
            if transform:
                target_axes["seq"] = math.sqrt(target_axes["seq"])
                rest = [replace(p, axes={**p.axes, "seq": math.sqrt(p.axes["seq"])}) for p in rest]
            step = run_axis_groups(rest, target_axes, path.axis_groups_for(kernel_type), max_dim=1, matchers=matchers)
            if isinstance(step, str) or step.axes != (axis,):
                continue
            actual = float(statistics.median(p.latency_us for p in left_out))
            held = _Target(kernel_type, target_axes, left_out[0].regime, bucket=left_out[0].bucket,
                           shapes=left_out[0].shapes)
            legal = path.legal(held, step) is None and all(p.bucket == left_out[0].bucket for p in step.used)
            branch = {branches.get(line) for p in left_out for line in p.lines}
            crosses = len(branch | {branches.get(line) for p in step.used for line in p.lines}) > 1
            records.append(HoldoutPoint(
                kernel_type, tuple(sorted(p.line for p in left_out)), axis, value, low, high, actual, step.latency_us,
                abs(step.latency_us - actual) / actual, legal and not crosses, left_out[0].latency_column,
                ", ".join(f"{k}={v}" for k, v in left_out[0].regime if k != "kernel_type"), legal and crosses))
    return records


def holdout_summary(points: Sequence[HoldoutPoint]) -> dict[str, float | int | None]:
    """Median and 90th percentile (numpy's linear method) of the relative errors (fractions), and how many."""
    import numpy as np

    errors = np.asarray([p.relative_error for p in points], dtype=float)
    if not len(errors):
        return {"count": 0, "median": None, "p90": None}
    return {"count": int(len(errors)), "median": float(np.median(errors)), "p90": float(np.percentile(errors, 90))}
