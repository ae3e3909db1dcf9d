"""The collective CSV: contract columns, our additions, statistics over per-call samples, reading and writing.

Contract columns first, in the peer's order: `message_bytes, num_devices, dtype, topology_tier,
Duration(us), bandwidth_gbps`. `Duration(us)` is the median call time; `bandwidth_gbps` is
message_bytes / Duration (the peer's definition, GB = 1e9 B). Our additions follow: nccl-tests
`algbw_gbps`/`busbw_gbps`, the spread of the samples, and how they were taken.

A call's duration comes from every rank's time for it (`per_call_durations`): the slowest rank in event
mode, the last-arriving rank's kernel in kernel mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from opperf.comm.collectives import collective
from opperf.errors import OpperfError
from opperf.io import read_database_csv, write_csv_atomic
from opperf.log import utc_timestamp

MESSAGE_BYTES = "message_bytes"
NUM_DEVICES = "num_devices"
DTYPE = "dtype"
TOPOLOGY_TIER = "topology_tier"
DURATION = "Duration(us)"
BANDWIDTH = "bandwidth_gbps"
CONTRACT_COLUMNS = (MESSAGE_BYTES, NUM_DEVICES, DTYPE, TOPOLOGY_TIER, DURATION, BANDWIDTH)

ALGBW = "algbw_gbps"
BUSBW = "busbw_gbps"
DURATION_P10 = "Duration P10(us)"
DURATION_P90 = "Duration P90(us)"
DURATION_MEAN = "Duration Mean(us)"
DURATION_MIN = "Duration Min(us)"
SAMPLE_COUNT = "sample_count"
OP = "op"
BACKEND = "backend"
BENCH_MODE = "bench_mode"
TIMING_METHOD = "timing_method"
GROUP_RANKS = "group_ranks"
GRID_SHAPE = "grid_shape"
DEVICE = "device"
VERIFIED = "verified"
COLLECTED_AT = "collected_at"
EXTRA_COLUMNS = (ALGBW, BUSBW, DURATION_P10, DURATION_P90, DURATION_MEAN, DURATION_MIN, SAMPLE_COUNT, OP,
                 BACKEND, BENCH_MODE, TIMING_METHOD, GROUP_RANKS, GRID_SHAPE, DEVICE, VERIFIED, COLLECTED_AT)
COLUMNS = CONTRACT_COLUMNS + EXTRA_COLUMNS
# One row per point: a second row with the same key would be the same measurement twice.
KEY_COLUMNS = (MESSAGE_BYTES, NUM_DEVICES, DTYPE, TOPOLOGY_TIER)


def per_call_durations(samples_per_rank: Sequence[Sequence[float]], bench_mode: str) -> list[float]:
    """One duration per call from every rank's samples of it.

    event: the slowest rank's time (a caller waits until its collective returns everywhere).
    kernel: the shortest rank's kernel time. A collective kernel starts when its rank launches it and
    spins until every peer has arrived, so the last rank to arrive waits for no one: its kernel time is
    the collective's own time, free of launch skew between the ranks.
    """
    lengths = {len(s) for s in samples_per_rank}
    if len(lengths) != 1 or 0 in lengths:
        raise OpperfError(f"ranks timed different numbers of calls: {sorted(lengths)}")
    pick = min if bench_mode == "kernel" else max
    return [pick(values) for values in zip(*samples_per_rank)]


def duration_statistics(samples_us: Sequence[float]) -> dict[str, float]:
    """median, p10, p90, mean, min and count of per-call durations (µs)."""
    values = np.asarray(samples_us, dtype=float)
    if values.size == 0 or not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise OpperfError(f"durations must be positive and finite, got {list(samples_us)[:5]}...")
    return {"median": float(np.median(values)), "p10": float(np.percentile(values, 10)),
            "p90": float(np.percentile(values, 90)), "mean": float(values.mean()), "min": float(values.min()),
            "count": int(values.size)}


def _fmt(value: float, digits: int = 3) -> str:
    return f"{value:.{digits}f}"


def result_row(*, op: str, message_bytes: int, num_devices: int, dtype_csv: str, topology_tier: int,
               samples_us: Sequence[float], backend: str, bench_mode: str, timing_method: str,
               group_ranks: Sequence[int], grid_shape: str, device: str,
               collected_at: str | None = None) -> dict[str, str]:
    """One CSV row (all strings) from the slowest-rank per-call samples of one point."""
    stats = duration_statistics(samples_us)
    spec = collective(op)
    median = stats["median"]
    return {
        MESSAGE_BYTES: str(message_bytes), NUM_DEVICES: str(num_devices), DTYPE: dtype_csv,
        TOPOLOGY_TIER: str(topology_tier), DURATION: _fmt(median),
        BANDWIDTH: _fmt(message_bytes / (median * 1e3), 4),
        ALGBW: _fmt(spec.algbw_gbps(message_bytes, num_devices, median), 4),
        BUSBW: _fmt(spec.busbw_gbps(message_bytes, num_devices, median), 4),
        DURATION_P10: _fmt(stats["p10"]), DURATION_P90: _fmt(stats["p90"]), DURATION_MEAN: _fmt(stats["mean"]),
        DURATION_MIN: _fmt(stats["min"]), SAMPLE_COUNT: str(stats["count"]), OP: op, BACKEND: backend,
        BENCH_MODE: bench_mode, TIMING_METHOD: timing_method, GROUP_RANKS: " ".join(map(str, group_ranks)),
        GRID_SHAPE: grid_shape, DEVICE: device, VERIFIED: "true",
        COLLECTED_AT: collected_at or utc_timestamp(),
    }


def write_comm_csv(path: str | Path, rows: Sequence[dict[str, str]]) -> None:
    """Write one collective's rows (sorted by key) atomically; a header-only file means no point was measured."""
    frame = pd.DataFrame(list(rows), columns=list(COLUMNS)).astype(str)
    if len(frame):
        frame = frame.sort_values(by=[NUM_DEVICES, TOPOLOGY_TIER, DTYPE, MESSAGE_BYTES],
                                  key=lambda col: pd.to_numeric(col, errors="coerce") if col.name != DTYPE else col)
        duplicated = frame.duplicated(subset=list(KEY_COLUMNS))
        if duplicated.any():
            raise OpperfError(f"two rows for the same point {frame[duplicated].iloc[0][list(KEY_COLUMNS)].tolist()}",
                              path=path)
    write_csv_atomic(path, frame)


_INTEGER_COLUMNS = (MESSAGE_BYTES, NUM_DEVICES, TOPOLOGY_TIER)
_NUMBER_COLUMNS = (DURATION, BANDWIDTH)


def number_column(frame: pd.DataFrame, column: str, path: str | Path, integer: bool = False) -> pd.Series:
    """A text column of a collective CSV as int64 or float64; a cell that is not one is an error naming
    file, line and field."""
    values = []
    for line, text in enumerate(frame[column], start=2):
        try:
            values.append(int(text) if integer else float(text))
        except ValueError:
            raise OpperfError(f"not {'an integer' if integer else 'a number'}: {text!r}",
                              path=path, row=line, field=column) from None
    return pd.Series(values, index=frame.index, dtype="int64" if integer else "float64")


def read_comm_csv(path: str | Path) -> pd.DataFrame:
    """A collective CSV with its contract columns checked and typed (ints, floats); extra columns as text.

    Accepts the peer's files (contract columns only). A bad value is an error naming file, line and field.
    """
    frame = read_database_csv(path, required=CONTRACT_COLUMNS)
    for column in _INTEGER_COLUMNS + _NUMBER_COLUMNS:
        typed = number_column(frame, column, path, integer=column in _INTEGER_COLUMNS)
        if column == DURATION:
            bad = np.flatnonzero(~(np.isfinite(typed.to_numpy()) & (typed.to_numpy() > 0)))
            if len(bad):
                raise OpperfError(f"duration must be positive, got {frame[column].iloc[bad[0]]!r}",
                                  path=path, row=int(bad[0]) + 2, field=column)
        frame[column] = typed
    duplicated = frame.duplicated(subset=list(KEY_COLUMNS))
    if duplicated.any():
        line = int(np.flatnonzero(duplicated.to_numpy())[0]) + 2
        raise OpperfError("repeats the (message_bytes, num_devices, dtype, topology_tier) of an earlier row",
                          path=path, row=line, field=MESSAGE_BYTES)
    return frame
