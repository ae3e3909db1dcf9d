"""A prediction the user reads: how long one step of *their* model takes at a scenario, from a database.

The step's queries are recorded as a performance model records them (opperf.consumer.model_queries); each is
answered as msmodeling's runtime answers it (opperf's model of the runtime: exact lookup, then interpolation,
opperf.consumer.queries.answer): EXACT, ZERO_COST (a view), INTERPOLATED (legal), ILLEGAL (the runtime answers, across buckets or axes),
MISS (the runtime falls back to its roofline model; here the roofline of the database's device: the larger of
the bytes moved over its memory bandwidth and, for a matmul, its FLOPs over the dtype's peak). The predicted
device time of the step is Σ answer × calls; each status's share of it says how much of the number rests on
measured rows.

Where msmodeling is present, predict.py gives way to its own runner (opperf.consumer.msmodeling_predict), which
predicts the step TensorCast builds (its paged attention and cache write, its rotary path), not the transformers
model's aten ops recorded here.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from opperf.consumer.dtype import GEMM_ROWS, DatabaseDtype, count_activation_dtypes
from opperf.consumer.interpolation import Query
from opperf.consumer.queries import Answer, RecordedQuery
from opperf.consumer.scenarios import Scenario
from opperf.consumer.status import PREDICTION_STATUSES, AnswerStatus
from opperf.errors import OpperfError

# A query of a dtype the runtime cannot spell (DTYPE_UNMAPPED) is a MISS priced at the roofline, as the runtime
# prices it; its reason names the dtype (AnswerStatus.prediction_group).
_MATMULS = {"mm", "bmm", "addmm", "baddbmm", "_grouped_mm", "matmul", "linear"}


@dataclass(frozen=True)
class Roofline:
    """The device's roofline (config/devices.yaml): what the runtime falls back to for a MISS."""

    bandwidth_gbps: float
    peak_tflops: dict

    def latency_us(self, query: Query) -> float:
        moved = sum(math.prod(t.shape) * t.dtype.itemsize for t in (*query.inputs, *query.outputs))
        seconds = moved / (self.bandwidth_gbps * 1e9) if self.bandwidth_gbps else 0.0
        name = query.op_name.split(".")[1] if "." in query.op_name else query.op_name
        if name in _MATMULS and len(query.inputs) >= 2 and query.outputs:
            k = query.inputs[0].shape[-1] if query.inputs[0].shape else 1
            flops = 2 * math.prod(query.outputs[0].shape) * k
            dtype = str(query.inputs[0].dtype).removeprefix("torch.")
            peak = self.peak_tflops.get(dtype) or max(self.peak_tflops.values(), default=0)
            if peak:
                seconds = max(seconds, flops / (peak * 1e12))
        return seconds * 1e6


@dataclass
class ScenarioPrediction:
    """One scenario's predicted step: its total, per kernel type, per status, and every query's answer."""

    name: str
    scenario: Scenario
    predicted_us: float = 0.0
    status_time_us: dict = field(default_factory=lambda: {s: 0.0 for s in PREDICTION_STATUSES})
    status_queries: dict = field(default_factory=lambda: {s: 0 for s in PREDICTION_STATUSES})
    by_kernel_type: dict = field(default_factory=dict)
    answers: list = field(default_factory=list)      # (RecordedQuery, status, latency_us per call, reason)

    @property
    def status_time_share(self) -> dict:
        total = self.predicted_us or 1.0
        return {s: self.status_time_us[s] / total for s in PREDICTION_STATUSES}

    def as_json(self, *, rows: bool = False) -> dict:
        document = {"name": self.name, "phase": self.scenario.phase, "batch": self.scenario.batch,
                    "tokens": self.scenario.tokens, "context": self.scenario.context, "tp": self.scenario.tp,
                    "predicted_us": round(self.predicted_us, 3),
                    "status_time_share": {k: round(v, 6) for k, v in self.status_time_share.items()},
                    "status_queries": dict(self.status_queries),
                    "by_kernel_type": {k: {"predicted_us": round(v["predicted_us"], 3), "calls": v["calls"],
                                           "statuses": dict(sorted(v["statuses"].items()))}
                                       for k, v in sorted(self.by_kernel_type.items(),
                                                          key=lambda item: -item[1]["predicted_us"])}}
        if rows:
            document["queries"] = [{"op": r.query.op_name, "inputs": [[list(t.shape), str(t.dtype)[6:]]
                                                                     for t in r.query.inputs],
                                    "calls": r.calls, "status": status, "latency_us": latency, "reason": reason}
                                   for r, status, latency, reason in self.answers]
        return document


def _kernel_type(database, op_name: str) -> str:
    mapping = (database.op_mapping.get("operator_mappings") or {}).get(op_name) or {}
    return mapping.get("kernel_type") or (op_name.split(".")[1] if "." in op_name else op_name)


def predict_step(name: str, scenario: Scenario, recorded: Sequence[RecordedQuery], answers: Sequence[Answer],
                 database, roofline: Roofline | None) -> ScenarioPrediction:
    """Σ answer × calls of one step's queries, grouped by kernel type and status; a MISS costs its roofline."""
    prediction = ScenarioPrediction(name, scenario)
    for item, answered in zip(recorded, answers):
        if item.view and answered.status in (AnswerStatus.MISS, AnswerStatus.DTYPE_UNMAPPED, AnswerStatus.ZERO_COST):
            continue                 # a view: no kernel runs; the runtime's analytic fallback counts it free
        status = AnswerStatus(answered.status).prediction_group
        latency = answered.latency_us
        if status == AnswerStatus.MISS or latency is None or not math.isfinite(latency):
            status, latency = AnswerStatus.MISS, (roofline.latency_us(item.query) if roofline else 0.0)
        time_us = latency * item.calls
        prediction.predicted_us += time_us
        prediction.status_time_us[status] += time_us
        prediction.status_queries[status] += 1
        kernel = prediction.by_kernel_type.setdefault(_kernel_type(database, item.query.op_name),
                                                      {"predicted_us": 0.0, "calls": 0, "statuses": defaultdict(int)})
        kernel["predicted_us"] += time_us
        kernel["calls"] += item.calls
        kernel["statuses"][status] += 1
        prediction.answers.append((item, status, latency, answered.reason))
    return prediction


def database_roofline(database_dir: str | Path, devices_path: str | Path | None = None) -> Roofline | None:
    """The roofline of the database's device (op_mapping.yaml `device`, config/devices.yaml), if it has one."""
    from opperf.consumer.runtime import load_op_mapping
    from opperf.devices import DEFAULT_CATALOG, load_catalog

    mapping = load_op_mapping(database_dir)
    catalog = load_catalog(devices_path or DEFAULT_CATALOG)
    key = (mapping.get("opperf") or {}).get("device")
    device = catalog.get(key) if key else None
    if device is None:
        return None
    return Roofline(device.memory_bandwidth_gbps, dict(device.peak_tflops))


PREDICTION_DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class PredictionDtype:
    """The dtype a prediction records its queries in, and the line that says where it came from."""

    name: str
    said: str


def database_dtypes(database_dir: str | Path) -> DatabaseDtype:
    """What op_mapping.yaml records; for a database built before it did, counted from its rows (layouts/ where
    kept) with the categories its `opperf.kernel_types` records."""
    from opperf.consumer.runtime import layouts_path, load_op_mapping
    from opperf.io import read_database_csv

    database_dir = Path(database_dir)
    block = load_op_mapping(database_dir).get("opperf") or {}
    if isinstance(block.get("dtype_rows"), dict):
        return DatabaseDtype({str(k): int(v) for k, v in block["dtype_rows"].items()},
                             block.get("dtype_counted") or GEMM_ROWS, "op_mapping.yaml")
    tables = {}
    for path in sorted(database_dir.glob("*.csv")):
        every_row = layouts_path(path)
        tables[path.stem] = read_database_csv(every_row if every_row.is_file() else path)
    categories = {k: (v or {}).get("category") for k, v in (block.get("kernel_types") or {}).items()}
    return count_activation_dtypes(tables, categories,
                                   source="read from its rows: op_mapping.yaml records none, an older build")


def prediction_dtype(database_dir: str | Path, requested: str | None = None) -> PredictionDtype:
    """The database's dtype (op_mapping.yaml `opperf.dtype`, opperf.consumer.dtype), or `requested` where the
    database holds it. Refused (one line): a database of several dtypes without `requested`, and a `requested`
    dtype the database holds no row of: every GEMM query would fall to the roofline, and the number would be the
    roofline model's, not the database's (a float32 step predicted from a bfloat16 database: 12x off)."""
    held = database_dtypes(database_dir)
    mapping = Path(database_dir) / "op_mapping.yaml"
    if requested is not None:
        if held.rows and requested not in held.rows:
            raise OpperfError(f"{requested}: the database holds {held.describe()} ({held.source}): every {requested} "
                              f"GEMM query would miss its rows and fall to the roofline; predict in "
                              f"{' or '.join(held.rows)}, or build a {requested} database", field="--dtype")
        said = f"database dtype: {held.dtype}" if held.dtype else f"database dtypes: {held.describe()}"
        return PredictionDtype(requested, f"{said} ({held.source})" + (f"; predicting in {requested} (--dtype)"
                                                                        if held.dtype != requested else ""))
    if held.dtype is None:
        raise OpperfError(f"the database holds {'several dtypes' if held.rows else 'no dtype'}: {held.describe()} "
                          f"({held.source}); say which to predict in with --dtype ({', '.join(PREDICTION_DTYPES)})",
                          path=mapping, field="opperf.dtype")
    if held.dtype not in PREDICTION_DTYPES:
        raise OpperfError(f"the database's dtype is {held.dtype}, which a prediction does not record (one of "
                          f"{', '.join(PREDICTION_DTYPES)})", path=mapping, field="opperf.dtype")
    return PredictionDtype(held.dtype, f"database dtype: {held.dtype} ({held.source})")


def predict(database_dir: str | Path, source, scenarios: Sequence[Scenario], *, dtype=None,
            attention: str = "cuda") -> list[ScenarioPrediction]:
    """Each scenario's predicted step from `database_dir`, its queries recorded in `dtype` (a torch dtype; default:
    the database's, prediction_dtype) and answered by opperf's model of the runtime. Where msmodeling is present its
    own runner predicts instead (opperf.consumer.msmodeling_predict)."""
    import torch

    from opperf.consumer.interpolation import Database
    from opperf.consumer.model_queries import scenario_name, step_queries
    from opperf.consumer.queries import answer, modelled_exact_lookup

    database = Database.load(database_dir)
    roofline = database_roofline(database_dir)
    predictions = []
    dtype = dtype or getattr(torch, prediction_dtype(database_dir).name)
    for scenario, recorded in step_queries(source, scenarios, dtype=dtype, attention=attention):
        answers = answer(recorded, database_dir, modelled_exact_lookup, database=database)
        predictions.append(predict_step(scenario_name(scenario), scenario, recorded, answers, database, roofline))
    return predictions


def prediction_table(predictions: Sequence[ScenarioPrediction], top: int = 6) -> str:
    """The predictions as a person reads them: one line per scenario, then its largest kernel types."""
    lines = [f"{'scenario':22} {'predicted µs':>13} {'EXACT':>7} {'INTERP':>7} {'ILLEGAL':>7} {'MISS':>7}"]
    for p in predictions:
        share = p.status_time_share
        lines.append(f"{p.name:22} {p.predicted_us:13.1f} " + " ".join(f"{100 * share[s]:6.1f}%"
                                                                        for s in PREDICTION_STATUSES))
        for kernel, value in sorted(p.by_kernel_type.items(), key=lambda item: -item[1]["predicted_us"])[:top]:
            statuses = ", ".join(f"{s} {n}" for s, n in sorted(value["statuses"].items()))
            lines.append(f"    {kernel:34} {value['predicted_us']:11.1f} µs  {value['calls']:5d} calls  ({statuses})")
    return "\n".join(lines)
