"""msprof op_summary / torch_npu kernel_details parsing and aggregation, on files in the real formats."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from opperf import contract
from opperf.errors import OpperfError
from opperf.replay.npu import msprof, op_summary

DATA = Path(__file__).parent / "data" / "replay_npu"
MSPROF_RUN = DATA / "msprof_run"
CANN6_RUN = DATA / "prof_cann6"
REAL_KERNEL_DETAILS = (Path(__file__).parents[1] / "resources" / "profiles" / "A3_vllm0.18.0_torch2.9.0_cann8.5"
                       / "kernel_details.csv")

MATMUL_ROW = {
    contract.INPUT_SHAPES: "4096,7168;7168,2048", contract.INPUT_DTYPES: "DT_BF16;DT_BF16",
    contract.INPUT_FORMATS: "ND;ND", contract.OUTPUT_SHAPES: "4096,2048", contract.OUTPUT_DTYPES: "DT_BF16",
}
OP_SUMMARY_HEADER = ("Device_id,Model ID,Task ID,Stream ID,Op Name,OP Type,OP State,Task Type,Task Start Time(us),"
                     "Task Duration(us),Task Wait Time(us),Block Dim,Mix Block Dim,HF32 Eligible,Input Shapes,"
                     "Input Data Types,Input Formats,Output Shapes,Output Data Types,Output Formats,Context ID,"
                     "aicore_time(us),aic_total_cycles")


def _msprof_table():
    [path] = msprof.collect_op_summaries(MSPROF_RUN)
    return op_summary.read_profiler_table(path)


def test_reads_every_task_line_and_skips_communication_tasks():
    table = _msprof_table()
    assert table.timing_method == op_summary.TIMING_METHOD_MSPROF
    assert len(table.samples) == 16
    assert table.skipped == ((8, "no OP Type (communication or untyped task)"),)
    assert table.counter_columns[:3] == ("aicore_time(us)", "aic_total_cycles", "aic_mac_time(us)")
    assert table.counter_columns[-1] == "cube_utilization(%)" and len(table.counter_columns) == 25
    first = table.samples[0]
    assert (first.kernel_type, first.accelerator_core, first.start_us, first.duration_us) == \
        ("Cast", "AI_VECTOR_CORE", 1763796000000000.0, 12.5)
    assert first.fields[contract.INPUT_SHAPES] == "4096,7168"        # literal profiler quotes stripped


def test_keep_last_drops_warmup_and_gives_exact_statistics():
    timings = op_summary.aggregate_tables([_msprof_table()], keep_last=3)
    matmul = timings[("MatMulV2", contract.row_signature(MATMUL_ROW))]
    assert matmul.durations_us == (185.5, 186.5, 190.0)
    assert matmul.observed_count == 5
    columns = matmul.result_columns()
    assert columns[contract.REPLAY_AVERAGE] == "187.333333"
    assert columns[contract.REPLAY_MEDIAN] == "186.5"
    assert columns[contract.REPLAY_P10] == "185.7"
    assert columns[contract.REPLAY_P90] == "189.3"
    assert columns[contract.REPLAY_CV] == "0.010299"
    assert columns[contract.REPLAY_SAMPLE_COUNT] == "3"
    assert columns[contract.REPLAY_TIMING_METHOD] == "msprof op_summary Task Duration(us)"
    assert columns["MicroBench aicore_time(us)"] == "185.333333"
    assert columns["MicroBench aic_total_cycles"] == "3336000"
    assert columns["MicroBench cube_utilization(%)"] == "83"
    assert matmul.fields[contract.ACCELERATOR_CORE] == "AI_CORE"


def test_without_keep_last_every_sample_counts():
    timings = op_summary.aggregate_tables([_msprof_table()])
    matmul = timings[("MatMulV2", contract.row_signature(MATMUL_ROW))]
    assert matmul.stats.mean_us == pytest.approx(210.4)
    assert matmul.stats.sample_count == 5


def test_na_counter_values_are_left_out_of_the_mean():
    timings = op_summary.aggregate_tables([_msprof_table()], keep_last=3, kernel_types=["RmsNorm"])
    [rms] = timings.values()
    assert rms.durations_us == (7.5, 7.7, 7.9)
    assert rms.result_columns()["MicroBench aiv_time(us)"] == "7.2"        # (7.0 + 7.4) / 2, N/A skipped
    assert rms.signature[3:] == ("4096,7168;4096,1", "DT_BF16;DT_FLOAT")


def test_kernel_types_filter_keeps_input_building_kernels_out():
    timings = op_summary.aggregate_tables([_msprof_table()], keep_last=3, kernel_types=["MatMulV2", "MatMulV3"])
    by_type = op_summary.timings_by_kernel_type(timings)
    assert list(by_type) == ["MatMulV2", "MatMulV3"]      # the Cast of input building is not a MatMul sample
    [matmul_v3] = by_type["MatMulV3"].values()
    assert matmul_v3.durations_us == (20.25, 20.75, 21.0)
    assert matmul_v3.fields[contract.ACCELERATOR_CORE] == "MIX_AIC"


def test_cann6_layout_old_spellings_and_bom_match_new_rows():
    [path] = msprof.collect_op_summaries(CANN6_RUN)
    assert path.parent.name == "summary"
    table = op_summary.read_profiler_table(path)
    assert table.counter_columns == ("aicore_time(us)", "total_cycles", "vec_time(us)", "vec_ratio")
    timings = op_summary.aggregate_tables([table])
    new_style_row = {contract.INPUT_SHAPES: "512,2,4096;512,2,4096", contract.INPUT_DTYPES: "DT_FLOAT16;DT_FLOAT16",
                     contract.INPUT_FORMATS: "ND;ND", contract.OUTPUT_SHAPES: "512,2,4096",
                     contract.OUTPUT_DTYPES: "DT_FLOAT16"}
    add = timings[("Add", contract.row_signature(new_style_row))]
    assert add.durations_us == (26.78, 31.201, 27.021)
    assert add.result_columns()[contract.REPLAY_AVERAGE] == "28.334"
    assert add.result_columns()["MicroBench vec_time(us)"] == "22.1"       # N/A on the third sample
    assert ("split_qkv_rmsnorm_rope_kernel", ) == tuple(
        k for k, _ in timings if k.startswith("split"))                    # `_0` suffix folded


def test_real_torch_npu_kernel_details_is_read_as_the_alternative_timer():
    table = op_summary.read_profiler_table(REAL_KERNEL_DETAILS)
    assert table.timing_method == op_summary.TIMING_METHOD_TORCH_NPU
    timings = op_summary.aggregate_tables([table], kernel_types=["MatMulV2"])
    [matmul] = timings.values()
    assert matmul.durations_us == (185.504, 186.823, 187.724, 190.544)
    assert matmul.result_columns()[contract.REPLAY_AVERAGE] == "187.64875"
    assert matmul.result_columns()["MicroBench aicore_time(us)"] == "184.89375"


def test_dispatch_ffn_combine_signature_carries_the_ep_size(tmp_path):
    path = tmp_path / "op_summary_1.csv"
    path.write_text(OP_SUMMARY_HEADER + "\n" + ",".join([
        "0", "4294967295", "1", "2", "DispatchFFNCombine_0", "DispatchFFNCombine", "dynamic", "MIX_AIV",
        '"1.0\t"', "310.0", "0", "24", "48", "NO", '"""16,7168;7168,4096"""', "DT_BF16;DT_INT8", "ND;ND",
        '"""16,7168"""', "DT_BF16", "ND", "0", "300.0", "540000"]) + "\n", encoding="utf-8")
    timings = op_summary.aggregate_tables([op_summary.read_profiler_table(path)], ep_size=16)
    [(kernel_type, signature)] = timings
    assert kernel_type == "DispatchFFNCombine" and signature[-1] == "16"
    assert timings[(kernel_type, signature)].fields[contract.EP_SIZE] == "16"


GOOD_CELLS = ["0", "4294967295", "1", "2", "n", "Add", "dynamic", "AI_VECTOR_CORE", '"1.0\t"', "3.0", "0", "8", "0",
              "NO", '"""4,4;4,4"""', "DT_BF16;DT_BF16", "ND;ND", '"""4,4"""', "DT_BF16", "ND", "N/A", "1.0", "1800"]


@pytest.mark.parametrize("mutation, field, line", [
    (lambda cells: cells.__setitem__(9, "fast"), "Task Duration(us)", 3),
    (lambda cells: cells.__setitem__(22, "12x"), "aic_total_cycles", 3),
    (lambda cells: cells.pop(), None, 3),
])
def test_bad_cells_name_file_line_and_field(tmp_path, mutation, field, line):
    cells = list(GOOD_CELLS)
    mutation(cells)
    path = tmp_path / "op_summary_1.csv"
    path.write_text("\n".join([OP_SUMMARY_HEADER, ",".join(GOOD_CELLS), ",".join(cells)]) + "\n", encoding="utf-8")
    with pytest.raises(OpperfError) as error:
        op_summary.read_profiler_table(path)
    assert error.value.path == str(path) and error.value.row == line and error.value.field == field


def test_an_unknown_text_column_is_descriptive_not_a_counter(tmp_path):
    path = tmp_path / "op_summary_1.csv"
    path.write_text("\n".join([OP_SUMMARY_HEADER + ",Task Category", ",".join(GOOD_CELLS + ["vector"]),
                               ",".join(GOOD_CELLS + ["N/A"])]) + "\n", encoding="utf-8")
    table = op_summary.read_profiler_table(path)
    assert table.counter_columns == ("aicore_time(us)", "aic_total_cycles") and len(table.samples) == 2


def test_a_table_without_shapes_is_refused_with_the_reason(tmp_path):
    path = tmp_path / "op_summary_1.csv"
    path.write_text("Device_id,Op Name,OP Type,Task Type,Task Start Time(us),Task Duration(us)\n"
                    "0,n,Add,AI_CORE,1.0,2.0\n", encoding="utf-8")
    with pytest.raises(OpperfError, match="task-time") as error:
        op_summary.read_profiler_table(path)
    assert error.value.field == contract.INPUT_SHAPES


def test_prof_dir_discovery_errors_say_what_is_missing(tmp_path):
    with pytest.raises(OpperfError, match="no PROF_"):
        msprof.collect_op_summaries(tmp_path)
    (tmp_path / "PROF_1" / "device_0" / "data").mkdir(parents=True)
    with pytest.raises(OpperfError, match="msprof --export=on"):
        msprof.collect_op_summaries(tmp_path)                   # msprof=None: never runs the exporter
    prof = tmp_path / "PROF_1"
    shutil.copytree(MSPROF_RUN / "PROF_000001_20261122072000123_KHGLNQPA" / "mindstudio_profiler_output",
                    prof / "mindstudio_profiler_output")
    assert msprof.find_prof_dirs(prof) == [prof]                # a PROF_* directory given directly
    assert [p.name for p in msprof.collect_op_summaries(tmp_path)] == ["op_summary_20261122072001.csv"]


def test_op_type_spelling_and_bookkeeping_columns_match_the_parse_stage(tmp_path):
    """`Op Type` (an older msprof spelling) is read, and Subtask/Thread/Rank IDs are never counters."""
    [path] = msprof.collect_op_summaries(MSPROF_RUN)
    header, *lines = path.read_text(encoding="utf-8").splitlines()
    renamed = tmp_path / "op_summary_0_1.csv"
    extra = ",Subtask ID,Thread ID,Rank ID"
    renamed.write_text("\n".join([header.replace("OP Type", "Op Type") + extra]
                                 + [line + ",7,8,0" for line in lines]) + "\n", encoding="utf-8")
    table = op_summary.read_profiler_table(renamed)
    reference = _msprof_table()
    assert [s.kernel_type for s in table.samples] == [s.kernel_type for s in reference.samples]
    assert table.counter_columns == reference.counter_columns
    assert not {"Subtask ID", "Thread ID", "Rank ID"} & set(table.counter_columns)
