"""torch.profiler traces → per-kernel rows: a real CPU trace of the reference decoder, a CUDA-shaped trace."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

from opperf.errors import OpperfError
from opperf.parse import parse_profiles
from opperf.parse.torch_trace import VIEW_AND_ALLOCATION_OPS, convert_trace, kernel_type_of
from test_parse_helpers import PARSE_DATA, REPO, expected_number, read_csv, read_header

# Made by: python scripts/profile_workload.py --backend cpu --models tests/data/parse/models.yaml
#   --model opperf-tiny-1layer --prefill-lengths 4 --decode-steps 1 --decode-context 4 --output DIR
# (one-layer reference decoder on CPU, torch 2.13), then re-dumped without whitespace.
CPU_TRACE = PARSE_DATA / "cpu_decoder_trace.json"
# The same command with --backend cuda on an NVIDIA H100 (torch 2.11.0+cu130): a real CUDA trace.
CUDA_TRACE = PARSE_DATA / "cuda_decoder_trace.json"


@pytest.fixture(scope="module")
def cpu_database(tmp_path_factory):
    out = tmp_path_factory.mktemp("cpu") / "out"
    parse_profiles([CPU_TRACE], out)
    return out


def _leaf_mm_events():
    events = json.loads(CPU_TRACE.read_text())["traceEvents"]
    return [e for e in events if e.get("cat") == "cpu_op" and e.get("name") == "aten::mm"]


def test_cpu_trace_kernel_types(cpu_database):
    kernel_types = (cpu_database / "kernel_types.txt").read_text().split()
    assert {"mm", "silu", "mul", "add", "rsqrt", "cat"} <= set(kernel_types)
    assert not set(kernel_types) & VIEW_AND_ALLOCATION_OPS      # views/allocations never become rows
    assert "linear" not in kernel_types and "matmul" not in kernel_types   # composites: represented by mm


def test_cpu_trace_mm_values_match_the_trace(cpu_database):
    """aten::mm is always innermost: its group statistics are the events' own durations."""
    by_shapes: dict[str, list[float]] = {}
    for event in _leaf_mm_events():
        dims = event["args"]["Input Dims"]
        by_shapes.setdefault(";".join(",".join(map(str, d)) for d in dims), []).append(event["dur"])
    rows = read_csv(cpu_database / "mm.csv")
    assert {r["Input Shapes"] for r in rows} == set(by_shapes)
    for row in rows:
        durations = by_shapes[row["Input Shapes"]]
        assert row["Profiling Sample Count"] == str(len(durations))
        assert row["Profiling Average Duration(us)"] == expected_number(statistics.mean(durations))
        assert row["Profiling Median Duration(us)"] == expected_number(statistics.median(durations))
        (m, k), (k2, n) = [tuple(map(int, s.split(","))) for s in row["Input Shapes"].split(";")]
        assert k == k2 and row["Output Shapes"] == f"{m},{n}"          # inferred on meta tensors
        assert row["Input Data Types"] == "DT_FLOAT;DT_FLOAT" and row["Output Data Types"] == "DT_FLOAT"
        assert row["Input Formats"] == "ND;ND" and row["Output Formats"] == "ND"
        assert row["OP State"] == "eager" and row["Accelerator Core"] == "CPU"
        assert row["Input Scalars"] == ";"


def test_cpu_trace_scalars_are_slot_aligned(cpu_database):
    rows = read_csv(cpu_database / "pow.csv")
    assert rows and all(r["Input Shapes"].endswith(";") for r in rows)     # (tensor, exponent): 2 slots
    assert {r["Input Scalars"] for r in rows} == {";2"}
    columns = read_header(cpu_database / "pow.csv")
    assert columns[-3:] == ["source", "Input Scalars", "Profiling Sample Count"]


def test_trace_to_csv_round_trip(tmp_path, cpu_database):
    csv_path = tmp_path / "ops.csv"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "trace_to_csv.py"), "--trace", str(CPU_TRACE),
                           "--output", str(csv_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    parse_profiles([csv_path], tmp_path / "out")
    for path in cpu_database.iterdir():
        assert (tmp_path / "out" / path.name).read_text() == path.read_text(), path.name


def _cuda_trace(path):
    """A CUDA-shaped trace: linear → addmm launching two kernels, copy_ launching a memcpy, a view launching none."""
    def op(name, ts, dur, dims, types, concrete):
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
                "args": {"Input Dims": dims, "Input type": types, "Concrete Inputs": concrete}}

    def runtime(ts, correlation):
        return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts, "dur": 2,
                "args": {"correlation": correlation}}

    def device(cat, ts, dur, correlation):
        return {"ph": "X", "cat": cat, "name": f"k{correlation}", "pid": 0, "tid": 7, "ts": ts, "dur": dur,
                "args": {"correlation": correlation, "device": 0}}

    events = [
        op("aten::linear", 100, 100, [[8, 16], [32, 16], [32]], ["c10::BFloat16"] * 3, ["", "", ""]),
        op("aten::t", 105, 3, [[32, 16]], ["c10::BFloat16"], [""]),
        op("aten::addmm", 110, 80, [[32], [8, 16], [16, 32], [], []], ["c10::BFloat16"] * 3 + ["Scalar", "Scalar"],
           ["", "", "", "1", "1"]),
        runtime(120, 11), runtime(130, 12),
        op("aten::view", 300, 2, [[8, 32], []], ["c10::BFloat16", "ScalarList"], ["", "[256]"]),
        op("aten::copy_", 400, 20, [[256], [256], []], ["float", "c10::BFloat16", "Scalar"], ["", "", "False"]),
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 1, "tid": 1, "ts": 405, "dur": 3,
         "args": {"correlation": 13}},
        device("kernel", 500, 5.5, 11), device("kernel", 510, 2.25, 12), device("gpu_memcpy", 520, 1.0, 13),
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 900, "dur": 2,
         "args": {"correlation": 14}},                                   # launched outside any aten op
        device("kernel", 950, 4.0, 14),
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 1, "ts": 1000, "dur": 2,
         "args": {"correlation": 15}},                                   # a CUDA graph replay: two kernels
        {**device("kernel", 1010, 3.0, 15), "name": "void flash_fwd<cutlass::bfloat16_t, 128>(Params)"},
        {**device("kernel", 1020, 1.5, 15), "name": "triton_poi_fused_add_0"},
        {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "pid": 1, "tid": 1, "ts": 1100, "dur": 2,
         "args": {"correlation": 16}},                                   # Triton from Python
        {**device("kernel", 1110, 2.0, 16), "name": "triton_red_fused_mean_1"},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemsetAsync", "pid": 1, "tid": 1, "ts": 1200, "dur": 2,
         "args": {"correlation": 17}},
        device("gpu_memset", 1210, 0.5, 17),
        {"ph": "X", "cat": "kernel", "name": "orphan", "pid": 0, "tid": 7, "ts": 1300, "dur": 0.25, "args": {}},
        {"ph": "f", "cat": "ac2g", "id": 11, "pid": 0, "tid": 7, "ts": 500},
    ]
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_cuda_trace_sums_device_time_per_launching_op(tmp_path):
    conversion = convert_trace(_cuda_trace(tmp_path / "cuda.pt.trace.json"))
    assert conversion.accelerator_core == "CUDA"
    rows = {r["Type"]: r for r in conversion.rows}
    # Kernels no op launched get rows of their own by name where the name can be a Type (k14, the Triton kernels,
    # the graph's Triton kernel); the templated graph kernel, the memset and the unlaunched kernel are named.
    assert set(rows) == {"addmm", "copy_", "k14", "triton_poi_fused_add_0", "triton_red_fused_mean_1"}
    assert rows["triton_poi_fused_add_0"]["OP State"] == "graph" and rows["k14"]["OP State"] == "eager"
    assert rows["triton_red_fused_mean_1"]["Input Shapes"] == "" and rows["k14"]["Duration(us)"] == "4.0"
    assert conversion.outcomes["device activities launched outside any aten op (see the attribution lines)"] == 6
    attribution = conversion.attribution.to_json()
    assert attribution["device_us"] == 20.0 and attribution["rows_us"] == 16.25      # 7.75 + 1 + 4 + 1.5 + 2
    assert attribution["unattributed"] == {
        "kernels replayed from a CUDA graph (cudaGraphLaunch; no op records their shapes) (kernel name not usable "
        "as a Type: not replayable)": {"us": 3.0, "activities": 1},
        "memcpy/memset activities outside any op": {"us": 0.5, "activities": 1},
        "device activities with no launch record in the trace": {"us": 0.25, "activities": 1}}
    assert conversion.attribution.lines()[0].startswith("81.25 % of the trace's device time")
    assert float(rows["addmm"]["Duration(us)"]) == 7.75          # 5.5 + 2.25, not the 80 µs of host time
    assert float(rows["copy_"]["Duration(us)"]) == 1.0
    assert rows["addmm"]["Input Shapes"] == "32;8,16;16,32;;"
    assert rows["addmm"]["Input Data Types"] == "DT_BF16;DT_BF16;DT_BF16;;"
    assert rows["addmm"]["Output Shapes"] == "8,32" and rows["addmm"]["Output Data Types"] == "DT_BF16"
    assert rows["addmm"]["Input Scalars"] == ";;;1;1"
    assert rows["copy_"]["Output Data Types"] == "DT_FLOAT"
    parse_profiles([tmp_path], tmp_path / "out")                  # directories pick up *.pt.trace.json
    (row,) = read_csv(tmp_path / "out" / "addmm.csv")
    assert row["Accelerator Core"] == "CUDA" and row["Profiling Average Duration(us)"] == "7.75"
    written = json.loads((tmp_path / "out" / "trace_attribution.json").read_text())
    assert list(written.values())[0]["share"] == 0.8125


def test_real_cuda_trace_keeps_every_microsecond_of_device_time(tmp_path):
    events = json.loads(CUDA_TRACE.read_text())["traceEvents"]
    device_us = sum(e["dur"] for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    out = tmp_path / "out"
    parse_profiles([CUDA_TRACE], out)
    kernel_types = (out / "kernel_types.txt").read_text().split()
    assert {"mm", "bmm", "silu", "mul", "add", "rsqrt", "index_select"} <= set(kernel_types)
    rows = [r for t in kernel_types for r in read_csv(out / f"{t}.csv")]
    assert all(r["Accelerator Core"] == "CUDA" for r in rows)
    parsed_us = sum(float(r["Profiling Average Duration(us)"]) * int(r["Profiling Sample Count"]) for r in rows)
    assert abs(parsed_us - device_us) < 1e-6 * len(rows) * 4      # every kernel belongs to exactly one row
    launches = sum(1 for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::mm")
    assert sum(int(r["Profiling Sample Count"]) for r in read_csv(out / "mm.csv")) == launches
    for row in read_csv(out / "mm.csv"):
        (m, k), (_, n) = [tuple(map(int, s.split(","))) for s in row["Input Shapes"].split(";")]
        assert row["Output Shapes"] == f"{m},{n}"


def test_gzipped_trace_in_a_directory(tmp_path):
    import gzip

    trace = _cuda_trace(tmp_path / "plain.json")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "worker0.1234.pt.trace.json.gz").write_bytes(gzip.compress(trace.read_bytes()))
    parse_profiles([tmp_path / "dir"], tmp_path / "out")
    (row,) = read_csv(tmp_path / "out" / "addmm.csv")
    assert row["Profiling Average Duration(us)"] == "7.75"


def test_kernel_type_names():
    assert kernel_type_of("aten::mm") == "mm"
    assert kernel_type_of("npu::npu_rms_norm") == "npu.npu_rms_norm"
    assert kernel_type_of("plain") == "plain"


def test_bad_traces(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('{"traceEvents": [\n{"ph": "X",\n')
    with pytest.raises(OpperfError) as info:
        parse_profiles([broken], tmp_path / "out")
    assert info.value.path == str(broken) and info.value.row == 3
    not_a_trace = tmp_path / "other.json"
    not_a_trace.write_text('{"hello": 1}')
    with pytest.raises(OpperfError, match="traceEvents"):
        parse_profiles([not_a_trace], tmp_path / "out")
    assert not (tmp_path / "out").exists()


# A transformers model's trace (tiny Mistral config, bf16, one layer, 16-token prefill, CPU, torch 2.13): made by
# TransformersCausalLM(read_config("tests/data/workload/tiny_mistral.json", num_layers=1), "cpu", torch.bfloat16)
# run under torch.profiler(record_shapes=True), re-dumped without whitespace.
TINY_MISTRAL_BF16_TRACE = PARSE_DATA / "cpu_tiny_mistral_bf16_trace.json"


def test_same_shapes_in_other_dtypes_are_other_rows(tmp_path):
    """RMSNorm's upcast (fp32 <- bf16) and downcast (bf16 <- fp32) copy_ have one shape and two kernels."""
    events = [e for e in json.loads(TINY_MISTRAL_BF16_TRACE.read_text())["traceEvents"]
              if e.get("cat") == "cpu_op" and e.get("name") == "aten::copy_"
              and e["args"]["Input Dims"][:2] == [[1, 16, 64], [1, 16, 64]]]
    parse_profiles([TINY_MISTRAL_BF16_TRACE], tmp_path / "out")
    rows = [r for r in read_csv(tmp_path / "out" / "copy_.csv") if r["Input Shapes"] == "1,16,64;1,16,64;"]
    assert {(r["Input Data Types"], r["Output Data Types"]) for r in rows} == {("DT_FLOAT;DT_BF16;", "DT_FLOAT"),
                                                                                ("DT_BF16;DT_FLOAT;", "DT_BF16")}
    for row in rows:
        durations = [e["dur"] for e in events
                     if e["args"]["Input type"][0] == ("float" if row["Output Data Types"] == "DT_FLOAT"
                                                       else "c10::BFloat16")]
        assert row["Profiling Sample Count"] == str(len(durations)) == "3"
        assert row["Profiling Average Duration(us)"] == expected_number(statistics.mean(durations))


def _profile_string_arguments(directory, execution_trace: bool):
    """A real CPU trace of ops whose string arguments torch.profiler does not record: gelu's `approximate` and
    div's `rounding_mode`; with or without the execution trace beside it."""
    import torch
    from torch.profiler import ExecutionTraceObserver

    directory.mkdir()
    x, y = torch.randn(4, 8), torch.rand(4, 8) + 1
    observer = (ExecutionTraceObserver().register_callback(str(directory / "execution_trace.json"))
                if execution_trace else None)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                execution_trace_observer=observer) as profiler:
        torch.nn.functional.gelu(x, approximate="tanh")
        torch.nn.functional.gelu(x)
        torch.div(x, y, rounding_mode="floor")
    if observer is not None:
        observer.unregister_callback()
    profiler.export_chrome_trace(str(directory / "trace.json"))
    return directory / "trace.json"


def test_string_arguments_come_from_the_execution_trace(tmp_path):
    """torch.profiler leaves string arguments empty; the execution trace recorded beside it has them, so
    `gelu(approximate='tanh')` and the exact gelu are two rows, and stage 4b's conversion (no reuse distances)
    reads them too, so its calls keep the parse's keys. Without an execution trace the slot stays empty and the
    outputs are inferred with the schema's default."""
    from opperf.parse.torch_trace import STRINGS_FROM_EXECUTION_TRACE, STRINGS_NOT_RECORDED

    trace = _profile_string_arguments(tmp_path / "with", execution_trace=True)
    for input_reuse in (True, False):
        conversion = convert_trace(trace, input_reuse=input_reuse)
        rows = {(r["Type"], r["Input Scalars"]): r for r in conversion.rows}
        assert {key for key in rows if key[0] in ("gelu", "div")} == {("gelu", ";tanh"), ("gelu", ";none"),
                                                                      ("div", ";;floor")}
        assert all(rows[key]["Output Shapes"] == "4,8" and rows[key]["Output Data Types"] == "DT_FLOAT"
                   for key in rows if key[0] in ("gelu", "div"))
        assert conversion.outcomes[STRINGS_FROM_EXECUTION_TRACE] == 3
    bare = convert_trace(_profile_string_arguments(tmp_path / "without", execution_trace=False))
    gelu = [r for r in bare.rows if r["Type"] == "gelu"]
    assert [(r["Input Scalars"], r["Output Shapes"], r["Output Data Types"]) for r in gelu] == [(";", "4,8", "DT_FLOAT")] * 2
    assert bare.outcomes[STRINGS_NOT_RECORDED] == 3
