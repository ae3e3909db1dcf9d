"""The NPU job's msprof side: command lines, resolution of executed rows, write-back with exact values,
`--prof-path` back-fill, and the environment checks (custom OPP, device, msprof)."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest

from opperf import contract
from opperf.errors import DeviceUnavailableError, OpperfError
from opperf.io import read_database_csv, write_csv_atomic
from opperf.replay.engine import (STATUS_EXECUTED, STATUS_FAILED_BUILD, STATUS_FAILED_NO_SAMPLES, STATUS_OK,
                                  RowOutcome, replay_key)
from opperf.replay.isolation import WorkerSettings
from opperf.replay.npu import entry, environment, msprof
from opperf.replay.npu.session import MsprofSession, backfill_database, resolve_outcomes
from opperf.replay.writeback import write_back

DATA = Path(__file__).parent / "data" / "replay_npu"
PROF_ROOT = DATA / "msprof_run"
MATMUL_KERNEL_TYPES = ("MatMulV2", "MatMulV3", "MatMulCommon")


def _row(inputs: str, outputs: str, dtypes: str = "DT_BF16;DT_BF16", **extra) -> dict[str, str]:
    row = {contract.OP_STATE: "dynamic", contract.ACCELERATOR_CORE: "AI_CORE", contract.INPUT_SHAPES: inputs,
           contract.INPUT_DTYPES: dtypes, contract.INPUT_FORMATS: "ND;ND", contract.OUTPUT_SHAPES: outputs,
           contract.OUTPUT_DTYPES: "DT_BF16", contract.OUTPUT_FORMATS: "ND",
           contract.PROFILING_AVERAGE: "190.2", contract.SOURCE: contract.SOURCE_PROFILED}
    row.update(extra)
    return row


PROFILED_V2 = _row("4096,7168;7168,2048", "4096,2048")           # the profiler reports it as MatMulV2
REPORTED_AS_V3 = _row("128,7168;7168,1536", "128,1536")          # same call family, reported as MatMulV3
NEVER_PROFILED = _row("64,64;64,64", "64,64")                    # ran, but the session holds no such task
UNBUILDABLE = _row("8192,15365;8192,4096", "1536,4096")          # the recipe could not build it


def _worker_command() -> list[str]:
    settings = WorkerSettings(rows_path="rows.csv", kernel_type="MatMulV2", definition_path="MatMulV2.yaml",
                              backend="npu", repeat_count=3, warmup_count=3)
    return settings.command(Path("indices.txt"), Path("progress.jsonl"), python="/usr/bin/python3")


def test_the_worker_runs_inside_one_msprof_session_per_attempt(tmp_path):
    session = MsprofSession(output_root=tmp_path / "prof", msprof_executable="msprof", aic_metrics="PipeUtilization")
    wrapped = session.wrap_command(_worker_command(), attempt=1)
    assert wrapped[:7] == ["msprof", f"--output={tmp_path / 'prof' / 'attempt_1'}", "--aic-metrics=PipeUtilization",
                           "/usr/bin/python3", "-m", "opperf.replay.npu.entry", "--execution-mode"]
    assert wrapped[7:10] == ["inprocess", "--rows", "rows.csv"]
    assert "--progress" in wrapped and "opperf.replay.worker" not in wrapped
    assert (tmp_path / "prof" / "attempt_1").is_dir() and session.attempts == [tmp_path / "prof" / "attempt_1"]
    with pytest.raises(OpperfError, match="expected `python -m opperf.replay.worker"):
        session.wrap_command(["python", "some_script.py"], attempt=2)


def test_dispatch_ffn_combine_runs_under_torchrun_inside_the_session(tmp_path):
    options = msprof.TorchrunOptions(ep_size=16, nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29611)
    session = MsprofSession(output_root=tmp_path, torchrun=options)
    wrapped = session.wrap_command(_worker_command(), attempt=1)
    assert wrapped[2:12] == ["/usr/bin/python3", "-m", "torch.distributed.run", "--nproc-per-node=8", "--nnodes=2",
                             "--node-rank=1", "--master-addr=10.0.0.1", "--master-port=29611", "-m",
                             "opperf.replay.npu.entry"]
    with pytest.raises(OpperfError) as error:
        msprof.TorchrunOptions(ep_size=16, nproc_per_node=4, nnodes=2).validate()
    assert error.value.field == "--dispatch-ffn-combine-nproc-per-node" and "4 x 2" in str(error.value)
    with pytest.raises(OpperfError, match="node rank 2"):
        msprof.TorchrunOptions(ep_size=8, nnodes=2, node_rank=2).validate()


def test_only_rank_zero_reports_progress(monkeypatch):
    arguments = ["--rows", "r.csv", "--progress", "p.jsonl"]
    monkeypatch.setenv("RANK", "0")
    assert entry._rank_local_arguments(arguments) == arguments
    monkeypatch.setenv("RANK", "3")
    assert entry._rank_local_arguments(arguments) == ["--rows", "r.csv", "--progress", "p.jsonl.rank3"]


def _executed(row: dict) -> tuple[tuple[str, ...], RowOutcome]:
    return replay_key(row, "MatMulV2"), RowOutcome(STATUS_EXECUTED, call="torch.mm(...)",
                                                   expected_outputs=f"{row[contract.OUTPUT_SHAPES]} | DT_BF16",
                                                   produced_outputs=f"{row[contract.OUTPUT_SHAPES]} | DT_BF16")


def _resolved() -> dict[tuple[str, ...], RowOutcome]:
    outcomes = dict(_executed(r) for r in (PROFILED_V2, REPORTED_AS_V3, NEVER_PROFILED))
    outcomes[replay_key(UNBUILDABLE, "MatMulV2")] = RowOutcome(STATUS_FAILED_BUILD, error="do not multiply")
    return resolve_outcomes(outcomes, msprof.collect_op_summaries(PROF_ROOT), kernel_types=MATMUL_KERNEL_TYPES,
                            kernel_type="MatMulV2", repeat_count=3)


def test_executed_rows_get_the_sessions_measured_durations():
    resolved = _resolved()
    ok = resolved[replay_key(PROFILED_V2, "MatMulV2")]
    assert ok.status == STATUS_OK
    assert ok.columns[contract.REPLAY_AVERAGE] == "187.333333"           # warm-up (250, 240) dropped
    assert ok.columns[contract.REPLAY_SAMPLE_COUNT] == "3"
    assert ok.columns["MicroBench aic_total_cycles"] == "3336000"
    v3 = resolved[replay_key(REPORTED_AS_V3, "MatMulV2")]
    assert v3.status == STATUS_OK and v3.columns[contract.REPLAY_AVERAGE] == "20.666667"
    assert v3.columns[contract.REPLAY_TIMING_METHOD].endswith("(reported as MatMulV3)")
    missing = resolved[replay_key(NEVER_PROFILED, "MatMulV2")]
    assert missing.status == STATUS_FAILED_NO_SAMPLES and missing.columns == {}
    assert "64,64;64,64" in missing.error and "MatMulV2, MatMulV3" in missing.error
    assert resolved[replay_key(UNBUILDABLE, "MatMulV2")].status == STATUS_FAILED_BUILD


def test_write_back_of_a_session_keeps_every_row_with_exact_values(tmp_path):
    frame = pd.DataFrame([PROFILED_V2, REPORTED_AS_V3, NEVER_PROFILED, UNBUILDABLE, PROFILED_V2]).fillna("")
    updated, report = write_back(frame, "MatMulV2", _resolved(), collected_at="2026-11-22T07:30:00+0000")
    path = tmp_path / "MatMulV2.csv"
    write_csv_atomic(path, updated)
    rows = read_database_csv(path).to_dict(orient="records")
    assert len(rows) == 5 and report.rows_out == report.rows_in == 5
    first, second, third, fourth, duplicate = rows
    assert (first[contract.REPLAY_AVERAGE], first[contract.REPLAY_MEDIAN], first[contract.REPLAY_P10],
            first[contract.REPLAY_P90]) == ("187.333333", "186.5", "185.7", "189.3")
    assert first["MicroBench aicore_time(us)"] == "185.333333" and first[contract.REPLAY_STATUS] == STATUS_OK
    assert duplicate[contract.REPLAY_AVERAGE] == "187.333333"             # same signature, same call
    assert second[contract.REPLAY_AVERAGE] == "20.666667"
    assert third[contract.REPLAY_AVERAGE] == "" and third[contract.REPLAY_STATUS] == STATUS_FAILED_NO_SAMPLES
    assert fourth[contract.REPLAY_STATUS] == STATUS_FAILED_BUILD and fourth[contract.INPUT_SHAPES] == \
        UNBUILDABLE[contract.INPUT_SHAPES]
    header = list(rows[0])
    assert header.index(contract.REPLAY_AVERAGE) == header.index(contract.OUTPUT_FORMATS) + 1
    assert header.index("MicroBench aicore_time(us)") < header.index(contract.PROFILING_AVERAGE) or \
        "Profiling Average aicore_time(us)" not in header


def _database(tmp_path: Path) -> Path:
    database = tmp_path / "vllm0.18.0_torch2.9.0_cann8.5"
    database.mkdir()
    filled = _row("999,1;1,1", "999,1", **{contract.REPLAY_AVERAGE: "5.5"})
    write_csv_atomic(database / "MatMulV2.csv", pd.DataFrame([PROFILED_V2, filled]).fillna(""))
    rms = {contract.OP_STATE: "static", contract.ACCELERATOR_CORE: "AI_VECTOR_CORE",
           contract.INPUT_SHAPES: "4096,7168;7168", contract.INPUT_DTYPES: "BF16;BF16",
           contract.INPUT_FORMATS: "FORMAT_ND;FORMAT_ND", contract.OUTPUT_SHAPES: "4096,7168;4096,1",
           contract.OUTPUT_DTYPES: "DT_BF16;DT_FLOAT", contract.OUTPUT_FORMATS: "ND;ND",
           contract.REPLAY_AVERAGE: "6.0", contract.PROFILING_AVERAGE: "7.9"}
    write_csv_atomic(database / "RmsNorm.csv", pd.DataFrame([rms]))
    return database


def test_prof_path_backfill_lands_each_group_in_its_reported_types_csv(tmp_path):
    database = _database(tmp_path)
    result = backfill_database(database, PROF_ROOT, update_mode="all", collected_at="T")
    matmul = read_database_csv(database / "MatMulV2.csv").to_dict(orient="records")
    assert len(matmul) == 2
    assert matmul[0][contract.REPLAY_AVERAGE] == "210.4"                # an existing profile: every sample counts
    assert matmul[0][contract.REPLAY_SAMPLE_COUNT] == "5"
    assert matmul[1][contract.REPLAY_AVERAGE] == "5.5"                  # no such task: left exactly as it was
    rms = read_database_csv(database / "RmsNorm.csv").to_dict(orient="records")
    assert rms[0][contract.REPLAY_AVERAGE] == "8.02"                    # old spellings match (BF16, FORMAT_ND)
    created = read_database_csv(database / "MatMulV3.csv").to_dict(orient="records")
    assert sorted(result.created) == ["Cast", "MatMulV3"]
    assert created[0][contract.INPUT_SHAPES] == "128,7168;7168,1536"
    assert created[0][contract.ACCELERATOR_CORE] == "MIX_AIC" and created[0][contract.REPLAY_AVERAGE] == "26.4"
    assert result.files["MatMulV2"].rows_out == 2 and result.unmatched == {"MatMulV3": 1, "Cast": 1}


def test_prof_path_missing_only_fills_only_empty_rows_and_appends_nothing(tmp_path):
    database = _database(tmp_path)
    result = backfill_database(database, PROF_ROOT, update_mode="missing-only", kernel_types=["MatMulV2", "RmsNorm",
                                                                                             "MatMulV3"])
    matmul = read_database_csv(database / "MatMulV2.csv").to_dict(orient="records")
    assert matmul[0][contract.REPLAY_AVERAGE] == "210.4" and matmul[1][contract.REPLAY_AVERAGE] == "5.5"
    rms = read_database_csv(database / "RmsNorm.csv").to_dict(orient="records")
    assert rms[0][contract.REPLAY_AVERAGE] == "6.0"                     # already filled: untouched
    assert not (database / "MatMulV3.csv").exists() and result.unmatched == {"MatMulV3": 1}


def test_prof_path_missing_only_keeps_a_filled_row_beside_an_empty_twin(tmp_path):
    database = tmp_path / "db"
    database.mkdir()
    filled_twin = dict(PROFILED_V2, **{contract.REPLAY_AVERAGE: "5.5"})     # same call, already measured
    write_csv_atomic(database / "MatMulV2.csv", pd.DataFrame([PROFILED_V2, filled_twin]).fillna(""))
    result = backfill_database(database, PROF_ROOT, update_mode="missing-only", kernel_types=["MatMulV2"])
    rows = read_database_csv(database / "MatMulV2.csv").to_dict(orient="records")
    assert [r[contract.REPLAY_AVERAGE] for r in rows] == ["210.4", "5.5"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", rows[0][contract.COLLECTED_AT])      # UTC, as replays write
    assert result.files["MatMulV2"].updated == 1 and result.files["MatMulV2"].untouched == 1


def test_prof_path_errors_leave_the_database_unchanged(tmp_path):
    database = _database(tmp_path)
    before = {p.name: p.read_bytes() for p in database.iterdir()}
    broken = tmp_path / "PROF_9" / "mindstudio_profiler_output"
    broken.mkdir(parents=True)
    source = next((PROF_ROOT).rglob("op_summary_*.csv")).read_text(encoding="utf-8")
    (broken / "op_summary_1.csv").write_text(source.replace("185.500", "fast"), encoding="utf-8")
    with pytest.raises(OpperfError) as error:
        backfill_database(database, tmp_path / "PROF_9")
    assert error.value.field == "Task Duration(us)" and error.value.row == 5
    assert {p.name: p.read_bytes() for p in database.iterdir()} == before


def test_prof_path_a_bad_type_after_good_ones_leaves_the_database_unchanged(tmp_path):
    database = _database(tmp_path)
    before = {p.name: p.read_bytes() for p in database.iterdir()}
    prof = tmp_path / "PROF_9" / "mindstudio_profiler_output"
    prof.mkdir(parents=True)
    lines = next(PROF_ROOT.rglob("op_summary_*.csv")).read_text(encoding="utf-8").splitlines()
    (prof / "op_summary_1.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    cast_line = next(line for line in lines if ",Cast,dynamic," in line)
    bad = prof / "op_summary_2.csv"       # a Type that cannot name a CSV, sorted after every good one
    bad.write_text(f"{lines[0]}\n{cast_line.replace(',Cast,dynamic,', ',zz/bad,dynamic,')}\n", encoding="utf-8")
    with pytest.raises(OpperfError) as error:
        backfill_database(database, tmp_path / "PROF_9")
    assert error.value.path == str(bad) and error.value.field == "OP Type"
    assert {p.name: p.read_bytes() for p in database.iterdir()} == before


def test_custom_opp_check_says_exactly_what_is_missing(tmp_path):
    vendor = tmp_path / "vllm_ascend" / "_cann_ops_custom" / "vendors" / "vllm-ascend"
    (vendor / "op_api" / "lib").mkdir(parents=True)
    assert environment.custom_opp_problems(["MatMulV2", "RmsNorm"], {}) == []          # none needed
    [problem] = environment.custom_opp_problems(["AddRmsNormBias", "RmsNorm"], {}, vendor_dir=vendor)
    assert "AddRmsNormBias" in problem and "ASCEND_CUSTOM_OPP_PATH is not set" in problem
    assert f"export ASCEND_CUSTOM_OPP_PATH={vendor}:$ASCEND_CUSTOM_OPP_PATH" in problem
    [problem] = environment.custom_opp_problems(["DispatchFFNCombine"], {"ASCEND_CUSTOM_OPP_PATH": str(vendor),
                                                                         "LD_LIBRARY_PATH": "/usr/lib"})
    assert f"LD_LIBRARY_PATH lacks {vendor / 'op_api' / 'lib'}" in problem
    [problem] = environment.custom_opp_problems(["KvRmsNormRopeCache"], {"ASCEND_CUSTOM_OPP_PATH": "/nowhere",
                                                                         "LD_LIBRARY_PATH": "/usr/lib"})
    assert "no ASCEND_CUSTOM_OPP_PATH entry exists (/nowhere is not a directory)" in problem
    complete = {"ASCEND_CUSTOM_OPP_PATH": f"{vendor}:/opt/other", "LD_LIBRARY_PATH": f"/usr/lib:{vendor}/op_api/lib/"}
    assert environment.custom_opp_problems(["split_qkv_rmsnorm_rope_kernel"], complete) == []
    with pytest.raises(OpperfError) as error:
        environment.check_custom_opp(["RINGMLAPrefillBF16Kernel"], {})
    assert error.value.field == "ASCEND_CUSTOM_OPP_PATH"


@pytest.mark.skipif(shutil.which("msprof") is not None, reason="this host has msprof")
def test_without_msprof_the_npu_timer_says_how_to_get_it():
    with pytest.raises(DeviceUnavailableError, match="set_env.sh"):
        environment.check_msprof()


@pytest.mark.skipif("torch_npu" in sys.modules or shutil.which("npu-smi") is not None, reason="an NPU host")
def test_without_an_npu_the_device_check_raises_device_unavailable():
    with pytest.raises(DeviceUnavailableError, match="torch_npu"):
        environment.check_npu_available()


def test_torch_npu_profiler_is_the_alternative_timer(tmp_path):
    session = MsprofSession(output_root=tmp_path, profiler="torch_npu")
    wrapped = session.wrap_command(_worker_command(), attempt=1)
    assert wrapped[:9] == ["/usr/bin/python3", "-m", "opperf.replay.npu.entry", "--execution-mode", "inprocess",
                           "--profiler", "torch_npu", "--profiler-output", str(tmp_path / "attempt_1")]
    assert "msprof" not in wrapped
    # What torch_npu.profiler writes: <host>_<pid>_<time>_ascend_pt/ASCEND_PROFILER_OUTPUT/kernel_details.csv
    output = tmp_path / "attempt_1" / "node0_4242_20261122073000_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    output.mkdir(parents=True)
    shutil.copy(Path(__file__).parents[1] / "resources" / "profiles" / "A3_vllm0.18.0_torch2.9.0_cann8.5"
                / "kernel_details.csv", output / "kernel_details.csv")
    row = _row('"""81920,4096;8192,512"""', '"""4096,512"""')
    resolved = resolve_outcomes(dict([_executed(row)]), session.summaries(), kernel_types=MATMUL_KERNEL_TYPES,
                                kernel_type="MatMulV2", repeat_count=2)
    [outcome] = resolved.values()
    assert outcome.columns[contract.REPLAY_AVERAGE] == "189.134"          # (187.724 + 190.544) / 2
    assert outcome.columns[contract.REPLAY_TIMING_METHOD] == "torch_npu.profiler kernel_details Duration(us)"
    with pytest.raises(OpperfError, match="not one of"):
        MsprofSession(output_root=tmp_path, profiler="perf")


def test_a_session_that_wrote_nothing_fails_the_executed_rows_not_the_job(tmp_path):
    for profiler in ("msprof", "torch_npu"):
        session = MsprofSession(output_root=tmp_path / profiler, profiler=profiler)
        assert session.summaries() == []
        outcomes = dict([_executed(PROFILED_V2)])
        outcomes[replay_key(UNBUILDABLE, "MatMulV2")] = RowOutcome(STATUS_FAILED_BUILD, error="do not multiply")
        resolved = resolve_outcomes(outcomes, session.summaries(), kernel_types=MATMUL_KERNEL_TYPES,
                                    kernel_type="MatMulV2", repeat_count=3)
        executed = resolved[replay_key(PROFILED_V2, "MatMulV2")]
        assert executed.status == STATUS_FAILED_NO_SAMPLES and "left no op_summary" in executed.error
        assert resolved[replay_key(UNBUILDABLE, "MatMulV2")].status == STATUS_FAILED_BUILD
    with pytest.raises(SystemExit):
        entry.main(["--profiler", "torch_npu", "--rows", "r.csv"])


def test_msprof_output_paths_with_characters_it_refuses_are_caught_early(tmp_path):
    with pytest.raises(OpperfError, match="refuses output paths containing '\\$'"):
        msprof.msprof_command(tmp_path / "a$b", ["python"])


@pytest.mark.skipif(shutil.which("npu-smi") is not None, reason="an NPU host")
def test_an_npu_job_on_a_host_without_npu_fails_with_one_clear_line(tmp_path):
    import os
    import subprocess

    rows = tmp_path / "RmsNorm.csv"
    write_csv_atomic(rows, pd.DataFrame([_row("16,256;256", "16,256;16,1", dtypes="DT_BF16;DT_BF16")]))
    env = {k: v for k, v in os.environ.items() if k != "ASCEND_RT_VISIBLE_DEVICES"}
    repo = Path(__file__).resolve().parents[1]
    completed = subprocess.run(
        [sys.executable, "scripts/replay.py", "--backend", "npu", "--kernel", "RmsNorm", "--rows", str(rows),
         "--definitions", "config/kernels", "--version-dir", "vllm0.18.0_torch2.9.0_cann8.5",
         "--output", str(tmp_path / "out.csv")], cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines() == [completed.stderr.strip()]          # one line, no traceback
    assert "torch_npu is not installed" in completed.stderr or "msprof is not on PATH" in completed.stderr
    assert not (tmp_path / "out.csv").exists()


def test_torchrun_ranks_must_run_the_worker_in_process(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(SystemExit):
        entry.main(["--execution-mode", "subprocess", "--rows", "r.csv"])
