"""Timed calls chosen per row by a time budget (--time-budget-s, issue 40): the stopping rule on exact samples, the
cpu timers under it (a slow row stops early, a tiny one runs to the maximum, each row's record names the calls it
ran), a replay job's rows, the option off (exactly --repeat-count calls, the method unchanged), and the config
schema's and the CLI's checks."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from opperf import contract
from opperf.cli import run_cli
from opperf.errors import OpperfError
from opperf.replay.engine import STATUS_OK, PreparedRow, measure_prepared
from opperf.replay.inputs import ReplayCase
from opperf.replay.isolation import WorkerSettings
from opperf.replay.job import ReplaySettings, replay_kernel_csv
from opperf.replay.methods import METHOD_CPU_PROFILER, STOP_BUDGET, STOP_MAXIMUM, RepeatBudget
from opperf.replay.timing import CpuProfilerTimer, CudaTimer
from opperf.versions import cpu_version_dir
from opperf.workflow_config import check_workflow
from opperf.yaml_files import check_schema

REPO = Path(__file__).resolve().parents[1]
NOTE = re.compile(r"; (\d+) timed calls, (?:stopped|set) by the (time budget|maximum): .*\(min (\d+), max (\d+)\)$")


def test_the_stopping_rule_on_exact_samples():
    budget = RepeatBudget(time_budget_s=0.001, min_count=3)
    assert budget.stop_reason(2, 30, 5000.0) is None                              # budget spent, under the minimum
    assert budget.stop_reason(3, 30, 1000.0) == STOP_BUDGET                       # 1 ms of 1 ms
    assert budget.stop_reason(3, 30, 999.0) is None
    assert budget.stop_reason(30, 30, 0.0) == STOP_MAXIMUM
    assert budget.stop_reason(2, 2, 0.0) == STOP_MAXIMUM                         # the maximum wins over the minimum
    assert budget.note(3, STOP_BUDGET, 30, spent_us=1200.0) == (
        "3 timed calls, stopped by the time budget: 1.2 ms of 1 ms spent (min 3, max 30)")


def test_a_planned_count_is_what_the_budget_holds_within_the_bounds():
    budget = RepeatBudget(time_budget_s=0.001, min_count=3)
    assert budget.planned_count(250.0, 30) == (4, STOP_BUDGET)
    assert budget.planned_count(400.0, 30) == (3, STOP_BUDGET)           # ceil(2.5)
    assert budget.planned_count(5000.0, 30) == (3, STOP_BUDGET)          # one call is over the budget: the minimum
    assert budget.planned_count(1.0, 30) == (30, STOP_MAXIMUM)
    assert budget.planned_count(0.0, 30) == (30, STOP_MAXIMUM)
    assert budget.note(4, STOP_BUDGET, 30, call_us=250.0) == (
        "4 timed calls, set by the time budget: 1 ms at 250 us per call in the warm-up (min 3, max 30)")


def _counted(fn):
    """`fn` and a list that grows by one per call."""
    calls = []

    def run(*args):
        calls.append(1)
        return fn(*args)
    return run, calls


def _recorded_calls(repetitions: str) -> int:
    match = NOTE.search("; " + repetitions)
    assert match, repetitions
    return int(match.group(1))


def test_a_slow_row_gets_fewer_calls_than_a_tiny_one_and_records_the_calls_it_ran():
    torch.set_num_threads(1)
    timer = CpuProfilerTimer(threads=1)
    budget = RepeatBudget(time_budget_s=0.02, min_count=3)
    slow_fn, slow_calls = _counted(torch.ops.aten.mm)
    tiny_fn, tiny_calls = _counted(torch.ops.aten.add)
    slow = ReplayCase(fn=slow_fn, args=(torch.ones(1024, 1024), torch.ones(1024, 1024)))   # tens of ms a call
    tiny = ReplayCase(fn=tiny_fn, args=(torch.ones(8), torch.ones(8)))
    timer.measure(slow, 1, 12, "slow", budget=budget)
    timer.measure(tiny, 1, 12, "tiny", budget=budget)
    results = timer.collect()
    slow_result, tiny_result = results["slow"], results["tiny"]
    assert len(slow_result.samples_us) == 3 == len(slow_calls) - 1         # the minimum: one call spends the budget
    assert slow_result.repetitions.startswith("3 timed calls, stopped by the time budget: ")
    assert len(tiny_result.samples_us) == 12 == len(tiny_calls) - 1        # the maximum
    assert tiny_result.repetitions.startswith("12 timed calls, stopped by the maximum: ")
    for result in (slow_result, tiny_result):
        assert _recorded_calls(result.repetitions) == len(result.samples_us)
        assert result.repetitions.endswith("(min 3, max 12)")


def test_the_budget_stops_a_row_between_the_bounds():
    x = torch.ones(64)

    def pause_then_op():
        time.sleep(0.002)                  # the wall time the budget counts ...
        return torch.ops.aten.neg(x)       # ... and an op for the profiler's sample

    fn, calls = _counted(pause_then_op)
    timer = CpuProfilerTimer(threads=1)
    timer.measure(ReplayCase(fn=fn), 0, 30, "row", budget=RepeatBudget(time_budget_s=0.01, min_count=2))
    result = timer.collect()["row"]
    # Each call takes 2 ms or more: the budget is spent after 5 calls at most, and not before the second.
    assert 2 <= len(result.samples_us) == len(calls) <= 5
    assert result.repetitions.startswith(f"{len(calls)} timed calls, stopped by the time budget: ")


def test_without_a_budget_every_row_gets_exactly_the_repeat_count():
    timer = CpuProfilerTimer(threads=1)
    slow_fn, slow_calls = _counted(torch.ops.aten.mm)
    timer.measure(ReplayCase(fn=slow_fn, args=(torch.ones(512, 512), torch.ones(512, 512))), 1, 5, "slow")
    result = timer.collect()["slow"]
    assert len(result.samples_us) == 5 and len(slow_calls) == 6 and result.repetitions == ""


def test_without_a_budget_the_engine_calls_the_timer_as_before():
    class Recorder:
        backend = "cpu"

        def __init__(self):
            self.calls = []

        def measure(self, *args, **kwargs):
            self.calls.append((args[1:], kwargs))

    timer = Recorder()
    for budget in (None, RepeatBudget(1.0)):
        prepared = PreparedRow(ReplayCase(fn=torch.ops.aten.neg, args=(torch.ones(2),)), "", "", "")
        assert measure_prepared(prepared, timer, "key", repeat_count=7, warmup_count=3, budget=budget) is None
    assert timer.calls == [((2, 7, "key"), {}), ((2, 7, "key"), {"budget": RepeatBudget(1.0)})]
    command = WorkerSettings("rows.csv", "mm", "mm.yaml", "cpu", 10, 3).command(Path("i"), Path("p"))
    assert not any(arg in command for arg in ("--time-budget-s", "--min-repeat-count"))


def _mm_rows(path: Path) -> Path:
    rows = [{contract.OP_STATE: "eager", contract.ACCELERATOR_CORE: "CPU", contract.INPUT_SHAPES: shapes,
             contract.INPUT_DTYPES: "DT_FLOAT;DT_FLOAT", contract.INPUT_FORMATS: "ND;ND", contract.OUTPUT_SHAPES: out,
             contract.OUTPUT_DTYPES: "DT_FLOAT", contract.OUTPUT_FORMATS: "ND", contract.PROFILING_AVERAGE: "1"}
            for shapes, out in (("1024,1024;1024,1024", "1024,1024"), ("1,8;8,4", "1,4"))]
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_a_replay_jobs_rows_record_the_calls_they_ran_and_why(tmp_path):
    output = tmp_path / "out.csv"
    replay_kernel_csv(_mm_rows(tmp_path / "mm.csv"), "mm", "config/kernels", output,
                      ReplaySettings(repeat_count=12, warmup_count=1, cpu_threads=1, time_budget_s=0.02,
                                     min_repeat_count=3),
                      version_dir=None)
    written = pd.read_csv(output, dtype=str, keep_default_na=False)
    assert written[contract.REPLAY_STATUS].tolist() == [STATUS_OK] * 2
    recorded = []
    for method, kept, l2 in zip(written[contract.REPLAY_TIMING_METHOD], written[contract.REPLAY_SAMPLE_COUNT],
                                written[contract.REPLAY_L2_POLICY]):
        assert method.startswith(f"{METHOD_CPU_PROFILER}, 1 threads; ")
        match = NOTE.search(method)
        calls, reason = int(match.group(1)), match.group(2)
        assert (match.group(3), match.group(4)) == ("3", "12")
        # Replay Sample Count: the calls run, less those left out as interrupted (said in Replay L2 Policy).
        left_out = re.search(r"(\d+) of (\d+) timed calls left out as interrupted", l2)
        assert int(kept) == calls - (int(left_out.group(1)) if left_out else 0)
        assert left_out is None or int(left_out.group(2)) == calls
        recorded.append((calls, reason))
    assert recorded == [(3, "time budget"), (12, "maximum")]


def test_a_replay_job_without_a_budget_writes_the_method_as_before(tmp_path):
    output = tmp_path / "out.csv"
    replay_kernel_csv(_mm_rows(tmp_path / "mm.csv"), "mm", "config/kernels", output,
                      ReplaySettings(repeat_count=4, warmup_count=1, cpu_threads=1), version_dir=None)
    written = pd.read_csv(output, dtype=str, keep_default_na=False)
    assert written[contract.REPLAY_TIMING_METHOD].tolist() == [f"{METHOD_CPU_PROFILER}, 1 threads"] * 2
    assert written[contract.REPLAY_SAMPLE_COUNT].tolist() == ["4"] * 2


@pytest.mark.parametrize("settings, field", [
    (ReplaySettings(time_budget_s=0.0), "--time-budget-s"),
    (ReplaySettings(time_budget_s=float("inf")), "--time-budget-s"),
    (ReplaySettings(time_budget_s=1.0, repeat_count=2, min_repeat_count=3), "--min-repeat-count"),
    (ReplaySettings(min_repeat_count=0), "--min-repeat-count"),
    (ReplaySettings(backend="npu", time_budget_s=1.0), "--time-budget-s"),
])
def test_bad_budget_settings_name_the_option(settings, field):
    with pytest.raises(OpperfError) as raised:
        settings.validate()
    assert raised.value.field == field
    ReplaySettings(repeat_count=2, min_repeat_count=3).validate()          # the minimum matters only with a budget


def _config_file(tmp_path: Path, old: str, new: str) -> tuple[dict, Path]:
    text = (REPO / "config" / "config.yaml").read_text(encoding="utf-8")
    assert old in text
    path = tmp_path / "config.yaml"
    path.write_text(text.replace(old, new), encoding="utf-8")
    return yaml.safe_load(path.read_text(encoding="utf-8")), path


def test_the_config_schema_accepts_the_budget_and_defaults_it_off(tmp_path):
    config, path = _config_file(tmp_path, "  time_budget_s: null ", "  time_budget_s: 0.5 ")
    check_schema(config, "config.schema.yaml", path, set_defaults=True)
    assert (config["replay"]["time_budget_s"], config["replay"]["min_repeat_count"]) == (0.5, 3)
    shipped = yaml.safe_load((REPO / "config" / "config.yaml").read_text(encoding="utf-8"))
    del shipped["replay"]["time_budget_s"], shipped["replay"]["min_repeat_count"]
    check_schema(shipped, "config.schema.yaml", REPO / "config" / "config.yaml", set_defaults=True)
    assert (shipped["replay"]["time_budget_s"], shipped["replay"]["min_repeat_count"]) == (None, 3)


@pytest.mark.parametrize("old, new, message", [
    ("  time_budget_s: null ", "  time_budget_s: 0 ", "field 'replay.time_budget_s': must be > 0, got 0"),
    ("  time_budget_s: null ", "  time_budget_s: fast ",
     "field 'replay.time_budget_s': must be a number or null, got 'fast'"),
    ("  min_repeat_count: 3", "  min_repeat_count: 0", "field 'replay.min_repeat_count': must be >= 1, got 0"),
])
def test_the_config_schema_rejects_bad_budget_values_naming_file_line_and_field(tmp_path, old, new, message):
    config, path = _config_file(tmp_path, old, new)
    with pytest.raises(OpperfError) as raised:
        check_schema(config, "config.schema.yaml", path, set_defaults=True)
    line = next(i for i, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if text.startswith(new))
    assert str(raised.value) == f"{path}, line {line}, {message}"


def test_the_workflow_refuses_a_minimum_over_the_repeat_count(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    config, path = _config_file(tmp_path, "  time_budget_s: null ", "  time_budget_s: 0.5 ")
    config["replay"]["min_repeat_count"] = 11
    with pytest.raises(OpperfError, match=r"field 'replay.min_repeat_count': must be at most replay.repeat_count "
                                          r"\(10\), the most timed calls a row gets, got 11"):
        check_workflow(config, config_files=[path], definitions_root=REPO / "config" / "kernels")


def _replay_script():
    spec = importlib.util.spec_from_file_location("replay_script", REPO / "scripts" / "replay.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_command_line_passes_the_budget_to_the_rows_and_the_reproducer(tmp_path, capsys):
    script = _replay_script()
    rows, output = _mm_rows(tmp_path / "mm.csv"), tmp_path / "out.csv"
    common = ["--rows", str(rows), "--kernel", "mm", "--version-dir", cpu_version_dir(), "--cpu-threads", "1",
              "--definitions", str(REPO / "config" / "kernels"), "--repeat-count", "12", "--warmup-count", "1"]
    assert run_cli(script.build_parser(), script.main, [*common, "--output", str(output), "--time-budget-s", "-1"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--time-budget-s" in error and "must be a time in seconds > 0" in error
    assert not output.exists()
    assert run_cli(script.build_parser(), script.main,
                   [*common, "--output", str(output), "--time-budget-s", "0.02", "--min-repeat-count", "2",
                    "--trace-dir", str(tmp_path / "traces")]) == 0
    written = pd.read_csv(output, dtype=str, keep_default_na=False)
    assert [NOTE.search(method).group(2, 3, 4) for method in written[contract.REPLAY_TIMING_METHOD]] == [
        ("time budget", "2", "12"), ("maximum", "2", "12")]
    assert written[contract.REPLAY_TIMING_METHOD][0].startswith(f"{METHOD_CPU_PROFILER}, 1 threads; 2 timed calls, ")
    reproducer = next((tmp_path / "traces" / "mm").glob("*_verify/replay_mm.py"))
    usage = subprocess.run([sys.executable, str(reproducer), "--help"], capture_output=True, text=True, check=True)
    assert "(default: 0.02, as the job" in " ".join(usage.stdout.split())


class _WarmCache:
    """CacheState's interface with nothing to prepare (the device's cache is not what this test is about)."""

    def plan(self, case):
        return [case], [], "none"

    def prepare(self, views, neighbour=None):
        return None


class _Session:
    def __init__(self):
        self.ranges = []

    def range_name(self, key, repeat_count, policy, repetitions=""):
        self.ranges.append((key, repeat_count, repetitions))
        return f"opperf_replay#{len(self.ranges) - 1}"


def test_the_cuda_timer_sets_the_count_from_the_warm_up_before_the_first_timed_call():
    """CudaTimer's own measure() on the host: the device parts (CUDA events, the cache, the profiler session) are
    stand-ins that say what they were asked for; a 100 us warm-up call under a 1 ms budget gets 10 timed calls."""
    timer = CudaTimer.__new__(CudaTimer)
    timer.cache, timer.power = _WarmCache(), None
    timer._windows, timer.session = {}, _Session()
    asked = []

    def event_samples(cases, views, repeat_count):
        asked.append(repeat_count)
        return [100.0] * repeat_count
    timer._event_samples = event_samples
    fn, calls = _counted(torch.ops.aten.neg)
    case = ReplayCase(fn=fn, args=(torch.ones(4),))
    timer.measure(case, 2, 30, "row", budget=RepeatBudget(time_budget_s=0.001, min_count=3))
    note = "10 timed calls, set by the time budget: 1 ms at 100 us per call in the warm-up (min 3, max 30)"
    assert asked == [2] and len(calls) == 10 and timer.session.ranges == [("row", 10, note)]
