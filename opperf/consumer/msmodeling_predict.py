"""Predictions by msmodeling's own runner: its `text-generate` on a database, run as a user runs it (its unchanged CLI
through opperf's launcher, with the DeviceProfile the database holds), one run per scenario. What it says is the
prediction: its step time (`[empirical] Execution time`), its own hit/miss account (`--export-empirical-metrics-file`:
`m1` hits of the ops it asked, each miss with its reason) and its answer per op (`--chrome-trace-file`).

opperf's own model of the runtime records the transformers model's aten ops, which are not what the runner issues
(TensorCast's attention over a paged cache, its rotary path): where msmodeling is present, predict.py gives way to the
runner (docs/msmodeling.md, "Predictions")."""

from __future__ import annotations

import json
import re
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from opperf.consumer.msmodeling_env import Msmodeling, model_directory, run_cli, runner_options
from opperf.consumer.msmodeling_record import scenario_arguments
from opperf.errors import OpperfError

DEVICE_PROFILE = "msmodeling_device.py"
_EXECUTION_TIME = re.compile(r"^\[empirical\] Execution time: ([0-9.eE+-]+) s$", re.MULTILINE)
# The trace's `source` of an op its database answered; any other (its roofline) is a miss.
ANSWERED = ("MEASURED", "INTERPOLATED")


@dataclass
class RunnerPrediction:
    """One scenario as msmodeling's runner predicts it from a database."""

    scenario: str
    predicted_us: float
    m1_hit: int
    m1_total: int
    misses: list[dict]                          # [{"op", "reason", "shapes"}], one per distinct (op, reason, shapes)
    by_op: dict[str, dict] = field(default_factory=dict)   # op → {"us", "calls", "answered_us", "zero_cost_calls"}
    arguments: list[str] = field(default_factory=list)     # its text-generate arguments

    @property
    def answered_share(self) -> float:
        """The share of the trace's step time answered from the database (MEASURED or INTERPOLATED)."""
        total = sum(op["us"] for op in self.by_op.values())
        return sum(op["answered_us"] for op in self.by_op.values()) / total if total else 1.0

    def as_json(self) -> dict:
        return {"name": self.scenario, "predicted_us": self.predicted_us, "m1_hit": self.m1_hit,
                "m1_total": self.m1_total, "m1_hit_rate": self.m1_hit / self.m1_total if self.m1_total else 1.0,
                "answered_share": self.answered_share, "misses": self.misses, "by_op": self.by_op,
                "msmodeling_args": self.arguments}


def database_device(database: Path) -> tuple[str, Path]:
    """(the device name msmodeling knows the database's device by, the DeviceProfile file that registers it)."""
    from opperf.consumer.runtime import load_op_mapping

    device = load_op_mapping(database).get("device")
    profile = database / DEVICE_PROFILE
    if not device or not profile.is_file():
        raise OpperfError(f"no {DEVICE_PROFILE} or no `device` in op_mapping.yaml: msmodeling's runner needs the "
                          "database's device (the workflow writes it; by hand: scripts/build_database.py "
                          "msmodeling-device)", path=database)
    return device, profile


def runner_predictions(install: Msmodeling, database: str | Path, model_config: str | Path, scenarios: Sequence[str],
                       *, num_layers: int | None = None, tp: int = 1, timeout_s: float | None = 900,
                       progress=None) -> list[RunnerPrediction]:
    """msmodeling's runner's prediction of each scenario (`prefill:T`, `decode:BxC`) for a transformers config.json
    (or its directory), from `database`, at `num_layers` (None: the model's own depth) and `tp` ranks of tensor
    parallelism (--num-devices, --tp-size), linear layers unquantized (a database of bfloat16 rows)."""
    database = Path(database)
    device, profile = database_device(database)
    predictions = []
    with tempfile.TemporaryDirectory(prefix="opperf-msmodeling-predict-") as work:
        model_dir = model_directory(model_config, work)
        for text in scenarios:
            metrics, trace = Path(work) / "metrics.json", Path(work) / "trace.json"
            arguments = [*scenario_arguments(text), *runner_options(device, tp, "DISABLED", num_layers),
                         "--performance-model", "profiling", "--profiling-database-path", str(database.resolve())]
            done = run_cli(install, profile, ["inference", "text-generate", str(model_dir), *arguments,
                                              "--export-empirical-metrics-file", str(metrics),
                                              "--chrome-trace-file", str(trace)], timeout_s=timeout_s)
            prediction = read_run(text, done.stdout, metrics, trace, arguments)
            predictions.append(prediction)
            if progress is not None:
                progress(prediction)
    return predictions


def read_run(scenario: str, stdout: str, metrics: Path, trace: Path, arguments: list[str]) -> RunnerPrediction:
    """A prediction from what one text-generate run printed and wrote."""
    found = _EXECUTION_TIME.findall(stdout)
    if len(found) != 1:
        raise OpperfError(f"{scenario}: msmodeling's output has {len(found)} '[empirical] Execution time' lines, "
                          "expected one (its --performance-model profiling run)")
    account = json.loads(metrics.read_text(encoding="utf-8"))
    misses, seen = [], set()
    for miss in account.get("misses", []):
        entry = {"op": miss.get("func_name"), "reason": miss.get("reason"), "shapes": miss.get("tc_shapes")}
        key = json.dumps(entry, sort_keys=True)
        if key not in seen:
            seen.add(key)
            misses.append(entry)
    by_op: dict[str, dict] = defaultdict(lambda: {"us": 0.0, "calls": 0, "answered_us": 0.0, "zero_cost_calls": 0})
    for event in json.loads(trace.read_text(encoding="utf-8")).get("traceEvents", []):
        if event.get("ph") != "X":
            continue
        op = by_op[str(event["name"]).removeprefix("torch.ops.")]
        details = event.get("args") or {}
        op["us"] += float(event.get("dur", 0))
        op["calls"] += 1
        if details.get("source") in ANSWERED:
            op["answered_us"] += float(event.get("dur", 0))
        if details.get("zero_cost") == "True":
            op["zero_cost_calls"] += 1
    m1 = account.get("m1", {})
    return RunnerPrediction(scenario, float(found[0]) * 1e6, int(m1.get("m1_hit", 0)), int(m1.get("m1_total", 0)),
                            misses, dict(sorted(by_op.items(), key=lambda item: -item[1]["us"])), arguments)


def runner_table(predictions: Sequence[RunnerPrediction], top: int = 6) -> str:
    """Per scenario: the predicted step, the ops msmodeling's account hit of those it asked, the share of the step
    answered from the database, the misses, and its largest ops."""
    lines = [f"{'scenario':22} {'predicted µs':>13} {'m1 hits':>9} {'from database':>14}"]
    for p in predictions:
        lines.append(f"{p.scenario:22} {p.predicted_us:13.1f} {f'{p.m1_hit}/{p.m1_total}':>9} "
                     f"{p.answered_share:13.1%}")
        for op, entry in list(p.by_op.items())[:top]:
            lines.append(f"    {op:44} {entry['us']:10.1f} µs  {entry['calls']:4d} calls")
        for miss in p.misses:
            lines.append(f"    MISS {miss['op']} {miss['shapes']}: {miss['reason']}")
    return "\n".join(lines)


RUNNERS = ("auto", "msmodeling", "opperf")


@dataclass(frozen=True)
class RunnerChoice:
    """Who predicts: msmodeling's own runner (`install`) or opperf's model of its runtime (None), and why."""

    install: Msmodeling | None
    reason: str

    @property
    def said(self) -> str:
        if self.install is None:
            return f"answered by opperf's model of msmodeling's runtime ({self.reason})"
        return f"predicted by msmodeling's own runner, {self.install.describe()} ({self.reason})"


def choose_runner(setting: str, msmodeling_dir: str | Path | None, database: str | Path, models: Sequence,
                  dtype: str | None = None) -> RunnerChoice:
    """`msmodeling`: its runner, where a checkout is found, the database has the DeviceProfile its CLI needs and every
    model is a transformers config.json (ModelReference); `opperf`: opperf's model; `auto`: msmodeling's runner where
    all that holds and the database's consumer queries were recorded by msmodeling's runner (op_mapping.yaml
    `opperf.consumer_queries`: rows for what it asks), else opperf's model, saying why. msmodeling builds in float16,
    which its runtime reads as bfloat16 rows: a float32 `dtype` keeps opperf's model."""
    from opperf.consumer.msmodeling_env import find_msmodeling
    from opperf.consumer.runtime import load_op_mapping

    if setting not in RUNNERS:
        raise OpperfError(f"{setting!r} is not one of {', '.join(RUNNERS)}", field="--runner")
    if setting == "opperf":
        return RunnerChoice(None, "--runner opperf")
    database = Path(database)
    install = find_msmodeling(msmodeling_dir)
    problems = []
    if install is None:
        problems.append("no msmodeling checkout: set OPPERF_MSMODELING_DIR or --msmodeling, or lay it in "
                        "../shared/msmodeling")
    if not (database / DEVICE_PROFILE).is_file():
        problems.append(f"the database has no {DEVICE_PROFILE} for msmodeling's CLI")
    not_configs = [m.given for m in models if m.config_path is None]
    if not_configs:
        problems.append(f"{', '.join(not_configs)}: a config/models.yaml reference decoder, no transformers config "
                        "msmodeling builds")
    if dtype == "float32":
        problems.append("--dtype float32: msmodeling's runner builds in float16")
    recorded_by = ((load_op_mapping(database).get("opperf") or {}).get("consumer_queries") or {}).get("recorded_by")
    if setting == "msmodeling":
        if problems:
            raise OpperfError("; ".join(problems), field="--runner")
        return RunnerChoice(install, "--runner msmodeling")
    if problems:
        return RunnerChoice(None, "auto: " + "; ".join(problems))
    if "msmodeling" not in (recorded_by or {}).values():
        return RunnerChoice(None, "auto: the database's consumer queries were not recorded by msmodeling's runner "
                                  "(op_mapping.yaml opperf.consumer_queries), so it has no rows for what the runner "
                                  "asks; --runner msmodeling asks it anyway")
    return RunnerChoice(install, "auto: the database's queries were recorded by msmodeling's runner")
