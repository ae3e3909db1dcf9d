"""A profiled phase's calls, keyed the way the parse groups calls into rows (opperf.replay.phase): the base of
stage 4b (scripts/phase_replay.py), checked on the real CUDA decoder trace."""

from __future__ import annotations

import subprocess
import sys

import pytest

from opperf.errors import OpperfError
from opperf.replay.phase import call_keys, database_rows, phase_table, trace_calls

TRACE = "tests/data/parse/cuda_decoder_trace.json"


def _parse(trace: str, out):
    """The parse stage's database of `trace` in `out`."""
    done = subprocess.run([sys.executable, "scripts/parse_kernel_details.py", "--profiling-path", trace,
                           "--database-path", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def parsed(tmp_path_factory):
    return _parse(TRACE, tmp_path_factory.mktemp("parsed"))


def test_every_call_of_the_trace_finds_its_row_and_every_row_has_calls(parsed):
    calls = trace_calls(TRACE)
    rows = database_rows(parsed)
    keys = call_keys(calls, rows, parsed)
    assert len(calls) == 125 and len(rows) == 54
    assert set(keys) == set(rows)                       # the parse's grouping, no more and no less
    # Each row's calls are as many as the parse counted for it.
    for key, row in rows.items():
        assert keys.count(key) == int(row["Profiling Sample Count"]), key
    # Launch order: the first call is the embedding lookup, the prefill's RMSNorm follows.
    assert [c["Type"] for c in calls[:3]] == ["index_select", "pow", "mean"]


def test_the_order_does_not_read_the_execution_trace(tmp_path):
    """Stage 4b needs the calls' order and signatures, not the reuse distances the parse takes from the execution
    trace beside the trace (half of converting a large trace): one of another run does not stop it."""
    import shutil

    from opperf.parse.torch_trace import convert_trace

    trace = tmp_path / "trace.json"
    shutil.copy(TRACE, trace)
    (tmp_path / "execution_trace.json").write_text('{"nodes": [{"id": 1, "rf_id": 7, "name": "aten::mm"}]}')
    with pytest.raises(OpperfError, match="execution trace"):
        convert_trace(trace)
    calls = trace_calls(trace)
    assert len(calls) == 125 and all(not c.get("Profiling Input Reuse Distance(MiB)") for c in calls)
    assert [c["Type"] for c in calls] == [c["Type"] for c in trace_calls(TRACE)]


def test_calls_without_rows_are_named(parsed, tmp_path):
    calls = trace_calls(TRACE)
    rows = database_rows(parsed)
    del rows[next(k for k in rows if k[0] == "mm")]
    with pytest.raises(OpperfError, match=r"of the phase's 125 calls have no row here \(types \['mm'\]\)"):
        call_keys(calls, rows, parsed)
    assert database_rows(tmp_path) == {}


def test_the_stage_takes_the_whole_trace(tmp_path):
    from test_power_state import _trace_with_samples

    from opperf.replay.phase import select_phases

    trace, _ = _trace_with_samples(tmp_path, layout="new")          # 1,980 MHz, then 1,755 MHz
    assert select_phases(trace) == [trace_calls(trace)]              # every call, in launch order


CPU_TRACE = "tests/data/parse/cpu_decoder_trace.json"


@pytest.fixture(scope="module")
def cpu_parsed(tmp_path_factory):
    return _parse(CPU_TRACE, tmp_path_factory.mktemp("cpu_parsed"))


def test_a_phase_replays_every_call_in_order_on_the_cpu(cpu_parsed, monkeypatch, caplog):
    import logging

    from opperf.replay.phase import replay_phases

    calls = trace_calls(CPU_TRACE)
    rows = database_rows(cpu_parsed)
    prefill = [call for call in calls if str(call["Input Shapes"]).startswith(("1,4,", "4,"))][:40]
    keys = call_keys(prefill, rows, cpu_parsed)
    monkeypatch.setenv("OPPERF_PROGRESS_INTERVAL_S", "0")
    import opperf.replay.job as job

    looked_up = []
    find = job.find_definition
    monkeypatch.setattr(job, "find_definition", lambda kind, *rest: looked_up.append(kind) or find(kind, *rest))
    with caplog.at_level(logging.INFO, logger="opperf"):
        times = replay_phases([keys, keys[:3]], rows, device="cpu", iterations=2, rest_s=0.0)
    # Each kernel type's definition is read once, not per row (4,024 rows of the MoE decoder took 2 min to build).
    assert sorted(looked_up) == sorted({key[0] for key in keys})
    # Progress as the stage goes: rows built, then each pass's calls.
    total = len(keys) + 3
    assert f"progress phase replay, rows built: {len(set(keys))}/{len(set(keys))} rows (100.0 %)" in caplog.text
    for turn in (1, 2):
        assert f"progress phase replay, pass {turn} of 2: {total}/{total} calls (100.0 %)" in caplog.text
    # Every row of the phases, each call of each iteration one sample, all of them measured.
    assert set(times.samples) == set(keys)
    for key, samples in times.samples.items():
        assert len(samples) == 2 * (keys.count(key) + keys[:3].count(key)), key
        assert all(sample > 0 for sample in samples), key
    assert times.method == "cpu profiler op time per call, in the workload's call order (2 phase(s), 2 time(s))"
    assert times.ended_us > times.started_us


def test_a_phase_row_that_cannot_be_built_is_named(cpu_parsed, tmp_path):
    import shutil

    from opperf.replay.phase import replay_phases

    broken = tmp_path / "db"
    shutil.copytree(cpu_parsed, broken)
    path = broken / "mm.csv"
    rows = database_rows(broken)
    key = next(k for k in rows if k[0] == "mm")
    rows[key]["Input Shapes"] = "4,x"                      # not a shape
    with pytest.raises(OpperfError, match=r"mm cannot be replayed in its phase: failed_build") as caught:
        replay_phases([[key]], rows, device="cpu", rest_s=0.0)
    assert str(caught.value).startswith(f"{path}, line 2: ")
    assert "field 'Input Shapes': bad dimension 'x' in shape '4,x'" in str(caught.value)
    # Beside rows that can be built it is left out with its calls, and so is a row whose replay failed alone.
    others = [k for k in rows if k[0] in ("add", "silu")]
    failed = next(k for k in rows if k[0] == "mul")
    rows[failed]["Replay Status"] = "failed_crash"
    times = replay_phases([[key, *others, failed, key]], rows, device="cpu", rest_s=0.0)
    assert set(times.samples) == set(others) and set(times.left_out) == {key, failed}
    assert times.left_out[key].startswith("failed_build ") and "bad dimension 'x'" in times.left_out[key]
    assert times.left_out[failed] == "its one-at-a-time replay was failed_crash"
    table = phase_table([[{"Duration(us)": 1.0}] * (len(others) + 3)], [[key, *others, failed, key]], times)
    applied = dict(zip(table["Type"], table["Applied"]))
    assert applied["mul"] == "no: not replayed in order, its one-at-a-time replay was failed_crash"
    assert applied["mm"].startswith("no: not replayed in order, failed_build ")
    assert {applied[k[0]] for k in others} == {"yes"}


def test_a_call_out_of_memory_in_order_fails_the_phase_naming_its_row_and_what_to_do(cpu_parsed, monkeypatch):
    import torch

    from opperf.replay import inputs
    from opperf.replay.phase import replay_phases

    rows = database_rows(cpu_parsed)
    keys = [k for k in rows if k[0] in ("add", "silu")][:2]
    run = inputs.ReplayCase.run
    calls = []

    def short_of_memory(case):                  # each row's first call (its check) fits; the order's does not
        calls.append(case)
        if len(calls) > len(keys):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return run(case)

    monkeypatch.setattr(inputs.ReplayCase, "run", short_of_memory)
    with pytest.raises(OpperfError, match=r"ran out of device memory in order, with the inputs of 2 rows held") as caught:
        replay_phases([keys], rows, device="cpu", rest_s=0.0)
    row = rows[keys[0]]
    assert str(caught.value).startswith(f"{row['_path']}, line {row['_line']}: {keys[0][0]} ran out")
    assert "replay.phase.enabled: false" in str(caught.value) and "Tried to allocate 2.00 GiB" in str(caught.value)


def _table(kernel, shapes, calls, profiled, replayed, applied="yes", **signature):
    from opperf.replay.phase_table import PHASE_TABLE_COLUMNS

    line = dict.fromkeys(PHASE_TABLE_COLUMNS, "")
    line.update({"Type": kernel, "Input Shapes": shapes, "Phase Calls": str(calls),
                 "Phase Profiled Average Duration(us)": str(profiled),
                 "Phase Replay Average Duration(us)": str(replayed), "Phase Timing Method": "cuda, in order",
                 "Applied": applied, **signature})
    import pandas as pd

    return pd.DataFrame([line], columns=list(PHASE_TABLE_COLUMNS))


def test_a_phase_table_blends_each_row_over_its_calls_and_leaves_every_other_row_alone():
    import pandas as pd

    from opperf.parse.kernel_details import TYPE
    from opperf.replay import phase_table
    from opperf.replay.phase_table import apply_phase_table

    assert phase_table.TYPE == TYPE          # the table's type column is the parse's (kept apart: no polars here)

    frame = pd.DataFrame([
        {"Input Shapes": "64,1024,4096", "Profiling Sample Count": "8", "Average Duration(us)": "90",
         "Replay Timing Method": "cuda profiler", "source": "profiled"},
        {"Input Shapes": "1,1,4096", "Profiling Sample Count": "40", "Average Duration(us)": "3",
         "Replay Timing Method": "cuda profiler", "source": "profiled"},
        {"Input Shapes": "64,1024,4096", "Profiling Sample Count": "", "Average Duration(us)": "95",
         "Replay Timing Method": "", "source": "generated"}])
    table = pd.concat([_table("silu", "64,1024,4096", 2, 100, 102),
                       _table("silu", "1,1,4096", 40, 2.5, 3.4, applied="no: shorter than 10 us")])
    folded, changed = apply_phase_table(frame, "silu", table)
    assert changed == 1
    first = folded.iloc[0]
    # 2 of 8 calls in the phase at 102 us, 6 replayed one at a time at 90 us.
    assert first["Average Duration(us)"] == "93" and first["Replay Isolated Average Duration(us)"] == "90"
    assert first["Replay Phase Average Duration(us)"] == "102" and first["Replay Phase Calls"] == "2"
    assert first["Replay Timing Method"] == ("cuda profiler; 2 of 8 calls replayed in the workload's phase(s): "
                                             "cuda, in order")
    assert folded.iloc[1].to_dict() == {**frame.iloc[1].to_dict(), "Replay Isolated Average Duration(us)": "",
                                        "Replay Phase Average Duration(us)": "", "Replay Phase Calls": ""}
    assert folded.iloc[2]["Average Duration(us)"] == "95"          # a grid row has no calls in any phase
    # Folded twice (a database applied in place again): the same row, not a blend of a blend.
    again, _ = apply_phase_table(folded, "silu", table)
    assert again.iloc[0].to_dict() == first.to_dict()
    # Another kernel type's table lines do not apply.
    assert apply_phase_table(frame, "mul", table)[1] == 0


@pytest.fixture
def phase_script(capsys):
    """scripts/phase_replay.py's command line run in this process (its run_cli: exit code, one line on stderr)."""
    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("phase_replay_script", "scripts/phase_replay.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def run(*args):
        capsys.readouterr()
        code = module.run_cli(module.build_parser(), module.main, [str(a) for a in args])
        out = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)

    return run


def test_the_stage_refuses_a_kernel_table_and_names_calls_without_rows_leaving_no_table(cpu_parsed, tmp_path,
                                                                                       phase_script):
    table = tmp_path / "phase.csv"
    kernel_table = tmp_path / "kernel_details.csv"
    kernel_table.write_text("Name,Type,Duration(us)\nmm,MatMulV2,1.0\n")
    done = phase_script("--profiling-path", kernel_table, "--rows", cpu_parsed, "--output", table)
    assert done.returncode == 2 and not table.exists()
    assert done.stderr.startswith(f"error: {kernel_table}, field '--profiling-path': phase replay follows a "
                                  "torch.profiler trace's call order")
    # The CUDA trace's calls against the CPU trace's rows: none of them is here.
    done = phase_script("--profiling-path", TRACE, "--rows", cpu_parsed, "--output", table, "--device", "cpu")
    assert done.returncode == 2 and not table.exists()
    assert "calls have no row here" in done.stderr and "parse the same trace into it" in done.stderr


def test_the_report_shows_the_rows_as_the_database_folds_them(tmp_path):
    from opperf.report.build import summarise_kernel

    path = tmp_path / "silu.csv"
    path.write_text("OP State,Accelerator Core,Input Shapes,Input Data Types,Input Formats,Output Shapes,"
                    "Output Data Types,Output Formats,Average Duration(us),Profiling Average Duration(us),"
                    "Profiling Sample Count,Replay Status\n"
                    "dynamic,AI_VECTOR_CORE,\"64,1024,4096\",DT_BF16,ND,\"64,1024,4096\",DT_BF16,ND,90,100,8,ok\n")
    alone = summarise_kernel(path, "silu", (0.8, 1.2), [])
    signature = {"Output Shapes": "64,1024,4096", "Input Data Types": "DT_BF16", "Output Data Types": "DT_BF16"}
    folded = summarise_kernel(path, "silu", (0.8, 1.2), [], _table("silu", "64,1024,4096", 2, 100, 102, **signature))
    assert [p.replayed_us for p in alone.pairs] == [90.0]
    assert [p.replayed_us for p in folded.pairs] == [93.0]


def test_a_phase_cycles_each_rows_recorded_input_values_from_call_to_call(tmp_path, monkeypatch):
    """The MoE fixture's expert splits were recorded per call: in its phase each call after a row's first takes the
    next recorded offsets, as one-at-a-time replay does, not the first ones every time."""
    from collections import Counter

    from opperf.replay import inputs
    from opperf.replay.phase import replay_phases

    trace = "tests/data/parse/cuda_tiny_qwen2_moe/trace.json.gz"
    parsed = _parse(trace, tmp_path / "db")
    rows = database_rows(parsed)
    keys = [k for k in call_keys(trace_calls(trace), rows, parsed)
            if k[0] == "_grouped_mm"]
    calls = Counter(keys)
    seen: dict[str, list[int]] = {}
    next_values = inputs.ReplayCase.next_values

    def recording(case):
        next_values(case)
        target = case.value_variants[0][0]
        seen.setdefault(case.description, []).append(target.tolist())

    monkeypatch.setattr(inputs.ReplayCase, "next_values", recording)
    times = replay_phases([keys], rows, device="cpu", rest_s=0.0)
    assert {key: len(samples) for key, samples in times.samples.items()} == dict(calls)
    assert sum(len(v) for v in seen.values()) == sum(n - 1 for n in calls.values()) == 10
    # The 24-token rows' 2nd to 4th calls ran the 2nd to 4th recorded splits (the row's Profiling Input Values).
    assert [5, 7, 11, 15, 23, 24] in next(v for v in seen.values() if len(v) == 3)
    assert all(len({tuple(offsets) for offsets in v}) == len(v) for v in seen.values())


def test_memory_windows_split_the_order_into_runs_of_calls_whose_rows_fit():
    from opperf.replay.phase import memory_windows

    a, b, c, d, big = ("a",), ("b",), ("c",), ("d",), ("big",)
    sizes = {a: 4, b: 4, c: 4, d: 4, big: 100}
    phases = [[a, b, a, c, d, c]]
    assert memory_windows(phases, sizes, None) == [[[a, b, a, c, d, c]]]
    assert memory_windows([[a, b], [c]], sizes, 12) == [[[a, b], [c]]]          # all fit: one window, both phases
    assert memory_windows(phases, sizes, 8) == [[[a, b, a]], [[c, d, c]]]
    assert memory_windows(phases, sizes, 4) == [[[a]], [[b]], [[a]], [[c]], [[d]], [[c]]]
    assert memory_windows([[a, big, a]], sizes, 8) == [[[a]], [[big]], [[a]]]   # too large alone: its own window


def test_a_phase_over_the_memory_budget_runs_in_windows_with_every_call_and_its_values(tmp_path, monkeypatch, caplog):
    """Rows whose tensors do not fit the budget together (the reference MoE decoder's 4,024 rows take 99 GiB, more
    than an 80 GB GPU holds) are replayed in windows of consecutive calls: every call still gets one sample per pass,
    and a row rebuilt for a later window goes on with its recorded values where it stopped."""
    import logging
    import sys

    from opperf.replay import engine, inputs
    from opperf.replay.phase import replay_phases

    trace = "tests/data/parse/cuda_tiny_qwen2_moe/trace.json.gz"
    parsed = _parse(trace, tmp_path / "db")
    rows = database_rows(parsed)
    keys = [k for k in call_keys(trace_calls(trace), rows, parsed) if k[0] in ("_grouped_mm", "mul", "silu")]
    timed: list[tuple[tuple, list | None]] = []
    run = inputs.ReplayCase.run

    def recording(case):
        if sys._getframe(1).f_code.co_name == "run":          # the order's calls, not a build's check
            timed.append((case.row, case.value_variants[0][0].tolist() if case.value_variants else None))
        return run(case)

    prepare = engine.prepare_row

    def tagged(definition, row, **kwargs):                     # each case knows its row (file, line)
        outcome = prepare(definition, row, **kwargs)
        outcome.case.row = (row.get("_path"), row.get("_line"))
        return outcome

    monkeypatch.setattr(inputs.ReplayCase, "run", recording)
    monkeypatch.setattr(engine, "prepare_row", tagged)
    whole = replay_phases([keys], rows, device="cpu", iterations=2, rest_s=0.0)
    whole_calls = list(timed)
    timed.clear()
    largest = max(inputs.row_tensor_bytes(inputs.parse_row_slots(rows[key])) for key in keys)
    with caplog.at_level(logging.INFO, logger="opperf"):
        split = replay_phases([keys], rows, device="cpu", iterations=2, rest_s=0.0, memory_budget_bytes=largest)
    windows = int(caplog.text.split("replayed in ")[1].split(" windows")[0])
    assert windows > 3 and "exceed the stage's memory budget" in caplog.text
    assert f"in {windows} windows of consecutive calls" in split.method
    assert {key: len(s) for key, s in split.samples.items()} == {key: len(s) for key, s in whole.samples.items()}
    assert all(len(s) == 2 * keys.count(key) for key, s in split.samples.items())
    # Per row, its calls ran the same recorded values in the same order, windows or not.
    def per_row(calls):
        sequences: dict[tuple, list] = {}
        for row, values in calls:
            sequences.setdefault(row, []).append(values)
        return sequences

    assert len(timed) == len(whole_calls) == 2 * len(keys)
    assert any(values is not None for _, values in timed)
    assert per_row(timed) == per_row(whole_calls)


def test_an_interrupted_call_is_left_out_of_its_rows_mean_and_named(caplog):
    """One call at over 10x both the row's median and its longest profiled call (another context's time slice, a
    stall) does not move the row; a row slow in every call keeps them all, and so its gap shows."""
    from opperf.replay.phase import PhaseTimes, phase_table
    from opperf.replay.phase_table import KEY_COLUMNS

    blank = [""] * (len(KEY_COLUMNS) - 1)
    quick, slow = ("sigmoid", "2048,1", *blank), ("mm", "64,64;64,64", *blank)
    calls = [{"Duration(us)": 1.5}, {"Duration(us)": 1.7}, {"Duration(us)": 30.0}]
    times = PhaseTimes({quick: [1.6, 1.6, 1.7, 35000.0, 1.5, 1.6],
                        slow: [300.0, 310.0, 305.0, 320.0, 300.0, 310.0]}, "in order", 0.0, 1.0)
    with caplog.at_level("WARNING"):
        table = phase_table([calls * 2], [[quick, quick, slow] * 2], times).set_index("Type")
    assert table.loc["sigmoid", "Phase Replay Average Duration(us)"] == "1.6"
    assert table.loc["sigmoid", "Phase Timing Method"] == "in order, 1 interrupted call(s) left out"
    assert "sigmoid (2048,1): 1 of 6 call(s) took over 10x" in caplog.text and "(35000 us)" in caplog.text
    assert table.loc["mm", "Phase Replay Average Duration(us)"] == "307.5"
    assert table.loc["mm", "Phase Timing Method"] == "in order"


def test_cold_copies_go_to_rows_that_come_back_before_the_cache_turns_over():
    """q, k and v of one shape back to back come back at once; a fused projection a layer later does not."""
    from opperf.replay.phase import close_rows

    qkv, norm, up, down, attention = (("mm", "a"), ("mean", "b"), ("mm", "c"), ("mm", "d"), ("attn", "e"))
    mib = 2**20
    sizes = {qkv: 8 * mib, norm: 1 * mib, up: 40 * mib, down: 40 * mib, attention: 60 * mib}
    separate = [[norm, qkv, qkv, qkv, attention, norm, up, down] * 2]
    assert close_rows(separate, sizes, 60 * mib) == {qkv}          # norm comes back after 84 MiB, qkv after 0
    fused = [[norm, qkv, attention, norm, up, down] * 2]
    assert close_rows(fused, sizes, 60 * mib) == set()
    assert close_rows(fused, sizes, 200 * mib) == {qkv, norm, attention, up, down}
    assert close_rows([[qkv], [qkv]], sizes, 60 * mib) == set()     # phases apart: the idle between them
