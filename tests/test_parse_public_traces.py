"""Other people's profiles: public torch.profiler traces (tests/fixtures/public_traces/, from HolisticTraceAnalysis)
and the msprof-analyze kernel_details fixture. What the parse makes of collectives, torch.compile regions, launches
no op records, traces without shapes or scalars, ROCm, and how much of each profile's time its CSVs hold."""

from __future__ import annotations

import gzip
import json
import logging
import shutil

import pytest

from opperf.errors import OpperfError
from opperf.parse import parse_profiles
from opperf.parse.attribution import COLLECTIVES, SKIPPED_PREFIX
from opperf.parse.discover import discover_inputs
from opperf.parse.aggregate import SKIP_COMMUNICATION
from opperf.parse.torch_trace import (NOT_A_KERNEL_TYPE, NOT_A_ROW_COLLECTIVE, NOT_A_ROW_NOT_AN_OP,
                                      SCALARS_NOT_RECORDED, UNATTRIBUTED_COMPILED, UNATTRIBUTED_NOT_AN_OP,
                                      convert_trace)
from test_parse_helpers import FIXTURE, REPO, fixture_table, read_csv, run_parse, write_table

PUBLIC = REPO / "tests" / "fixtures" / "public_traces"
NCCL_TRACE = PUBLIC / "sm80_nccl_cppnode_sampled_rank-0.json.gz"
COMPILED_TRACE = PUBLIC / "a100_compiled_function_rank0.json.gz"
NO_SHAPES_TRACE = PUBLIC / "alexnet_no_shapes_benchmark_result_2869224_1695835535_trace.json.gz"
ROCM_TRACE = PUBLIC / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"
TRITON_TRACE = PUBLIC / "triton_example.json.gz"
CPU_TRACE = PUBLIC / "cpu_only_rank_non_gpu.json.gz"
DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")


def _device_events(path):
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [e for e in json.load(handle)["traceEvents"] if e.get("cat") in DEVICE]


def _rows_us(out):
    """The device time the written CSVs hold: each row's mean times its calls."""
    types = (out / "kernel_types.txt").read_text().split()
    return sum(float(r["Profiling Average Duration(us)"]) * int(r["Profiling Sample Count"])
               for t in types for r in read_csv(out / f"{t}.csv"))


def _account(out):
    (account,) = json.loads((out / "trace_attribution.json").read_text()).values()
    return account


@pytest.fixture(scope="module")
def nccl_database(tmp_path_factory):
    out = tmp_path_factory.mktemp("nccl") / "out"
    return parse_profiles([NCCL_TRACE], out), out


def test_collectives_are_no_compute_rows(nccl_database):
    database, out = nccl_database
    # Before: record_param_comms.csv and c10d._allgather_base_.csv held the NCCL kernels' time.
    assert database.kernel_types == ["fbgemm.FP8RowwiseQuantizedToFloat", "fill_", "mm", "mul",
                                     "native_layer_norm_backward", "scatter_add_", "sigmoid_backward", "sum"]
    nccl = [e for e in _device_events(NCCL_TRACE) if "nccl" in e["name"]]
    assert len(nccl) == 3
    account = _account(out)
    assert account["unattributed"][COLLECTIVES] == {"us": sum(e["dur"] for e in nccl), "activities": 3}
    assert account["unattributed"][COLLECTIVES]["us"] == 111921.0        # 75.88 % of the excerpt's device time


def test_attribution_share_is_what_the_csvs_hold(nccl_database):
    database, out = nccl_database
    account = _account(out)
    device_us = sum(e["dur"] for e in _device_events(NCCL_TRACE))
    assert account["device_us"] == device_us == 147506.0
    assert account["rows_us"] == 4239.0 == pytest.approx(_rows_us(out), abs=1e-3)
    assert account["share"] == round(4239.0 / 147506.0, 6)
    # The CppNode<SplitLookupFunction_rowwise_adagrad_Op> backward launches its kernels itself: named, not counted
    # as rows (before: counted in the share, then skipped as "not a safe file name").
    assert account["unattributed"][UNATTRIBUTED_NOT_AN_OP + NOT_A_KERNEL_TYPE] == {"us": 31346.0, "activities": 30}
    assert account["rows_us"] + sum(part["us"] for part in account["unattributed"].values()) == device_us
    assert database.skip_counts == {}


def test_large_unattributed_time_is_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="opperf"):
        parse_profiles([NCCL_TRACE], tmp_path / "out")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"{NCCL_TRACE}: attribution: 2.87 % of the trace's device time (4239.0 of 147506.0 us) became rows" \
        in warnings
    assert f"{NCCL_TRACE}: 7 op events: {SCALARS_NOT_RECORDED}" in warnings     # torch <= 2.0: no Concrete Inputs


def test_cli_prints_the_share_and_every_part(tmp_path):
    result = run_parse("--profiling-path", NCCL_TRACE, "--database-path", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    line = result.stdout.splitlines()[-1]
    assert line.startswith(f"{NCCL_TRACE}: 2.87 % of its device time became rows; not in any row: 111921.0 us "
                           f"(75.88 %) in 3 {COLLECTIVES}; not in any row: 31346.0 us (21.25 %) in 30 ")


def test_compiled_regions_are_no_kernel_type(tmp_path):
    out = tmp_path / "out"
    database = parse_profiles([COMPILED_TRACE], out)
    # Before: CompiledFunction.csv / CompiledFunctionBackward.csv, the whole graph's inputs joined into one row.
    assert not {"CompiledFunction", "CompiledFunctionBackward"} & set(database.kernel_types)
    triton = [e for e in _device_events(COMPILED_TRACE) if e["name"].startswith("triton")]
    triton_types = sorted({e["name"] for e in triton})
    assert triton_types == [t for t in database.kernel_types if t.startswith("triton")]
    rows = [r for t in triton_types for r in read_csv(out / f"{t}.csv")]
    # Inductor's Triton kernels, replayed from the region's CUDA graph, are rows by kernel name (no shapes recorded).
    assert {(r["OP State"], r["Input Shapes"]) for r in rows} == {("graph", "")}
    assert sum(int(r["Profiling Sample Count"]) for r in rows) == len(triton) == 15
    account = _account(out)
    # The region's other kernels (cutlass GEMMs) have templated names: named as not replayable.
    assert account["unattributed"][UNATTRIBUTED_COMPILED + NOT_A_KERNEL_TYPE] == {"us": 19629.0, "activities": 12}
    assert account["rows_us"] == pytest.approx(_rows_us(out), abs=1e-3)     # means are written to 6 decimals
    assert account["rows_us"] + sum(p["us"] for p in account["unattributed"].values()) == account["device_us"]


def test_trace_without_shapes_is_refused(tmp_path):
    # Before: 10 cudnn_convolution calls of five shapes made one shapeless row with a mixed mean.
    with pytest.raises(OpperfError) as caught:
        parse_profiles([NO_SHAPES_TRACE], tmp_path / "out")
    assert caught.value.field == "Input Dims"
    assert "none of its 359 op events has `Input Dims`" in str(caught.value)
    assert "record_shapes=True" in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_rocm_trace_is_labelled_rocm_and_found_by_a_directory_scan(tmp_path):
    shutil.copy(ROCM_TRACE, tmp_path / ROCM_TRACE.name)
    shutil.copy(TRITON_TRACE, tmp_path / TRITON_TRACE.name)
    (tmp_path / "workload.json").write_text('{"dtype": "float32"}')            # beside a trace: not one
    assert sorted(p.name for p in discover_inputs([tmp_path]).torch_traces) == [ROCM_TRACE.name, TRITON_TRACE.name]
    assert {r["Accelerator Core"] for r in convert_trace(ROCM_TRACE).rows} == {"ROCM"}
    assert {r["Accelerator Core"] for r in convert_trace(TRITON_TRACE).rows} == {"CUDA"}
    assert {r["Accelerator Core"] for r in convert_trace(NCCL_TRACE).rows} == {"CUDA"}


def test_inductor_kernel_record_is_a_row_with_its_shapes(tmp_path):
    out = tmp_path / "out"
    parse_profiles([TRITON_TRACE], out)
    (row,) = read_csv(out / "triton_poi_fused_add_cos_sin_0.csv")
    assert row["Input Shapes"] == "10,10;10,10;10,10;" and row["Input Scalars"] == ";;;100"
    assert row["Profiling Average Duration(us)"] == "1.76"
    assert _account(out)["share"] == 1.0


def test_cpu_trace_keeps_collectives_and_autograd_functions_out(tmp_path):
    conversion = convert_trace(CPU_TRACE)
    assert conversion.accelerator_core == "CPU"
    assert conversion.outcomes[NOT_A_ROW_COLLECTIVE] == 12            # record_param_comms
    assert conversion.outcomes[NOT_A_ROW_NOT_AN_OP] == 6
    out = tmp_path / "out"
    database = parse_profiles([CPU_TRACE], out)
    # Before: All2All_Pooled_Req.csv, the Python autograd function around an all-to-all, as a kernel type.
    assert not {"All2All_Pooled_Req", "All2All_Pooled_Wait", "record_param_comms"} & set(database.kernel_types)
    assert {"addmm", "mm", "bmm", "cat"} <= set(database.kernel_types)
    assert database.attribution == {} and not (out / "trace_attribution.json").exists()   # wall times: no account


def _kernel_time(rows, header):
    return sum(float(r[header.index("Duration(us)")]) for r in rows)


def test_kernel_table_gets_an_account_too(tmp_path):
    out = tmp_path / "out"
    database = parse_profiles([FIXTURE], out)
    header, rows = fixture_table()
    account = database.attribution[str(FIXTURE)]
    assert account["measure"] == "kernel time" and account["share"] == 1.0 and account["unattributed"] == {}
    assert account["device_us"] == round(_kernel_time(rows, header), 3) == account["rows_us"]
    assert not (out / "trace_attribution.json").exists()        # an Ascend database stays CSVs + manifest


def test_kernel_table_account_names_communication_rows(tmp_path):
    header, rows = fixture_table()
    hcom = list(rows[0])
    for column, value in (("Type", "hcom_allReduce_"), ("Duration(us)", "1000"), ("Input Shapes", "N/A")):
        hcom[header.index(column)] = value
    path = write_table(tmp_path / "kernel_details.csv", header, rows + [hcom])
    database = parse_profiles([path], tmp_path / "out")
    account = database.attribution[str(path)]
    assert account["unattributed"] == {SKIPPED_PREFIX + SKIP_COMMUNICATION: {"us": 1000.0, "activities": 1}}
    assert account["rows_us"] == round(_kernel_time(rows, header), 3)
    result = run_parse("--profiling-path", path, "--database-path", tmp_path / "cli")
    assert result.returncode == 0, result.stderr
    assert f"{path}: {100 * account['share']:.2f} % of its kernel time became rows; not in any row: 1000.0 us " \
        f"({100 * 1000.0 / account['device_us']:.2f} %) in 1 {SKIPPED_PREFIX}{SKIP_COMMUNICATION}" in result.stdout


def test_fixture_readme_names_every_fixture():
    readme = (PUBLIC / "README.md").read_text()
    assert "MIT" in readme
    for path in PUBLIC.glob("*.json.gz"):
        assert f"`{path.name}`" in readme
