"""Collective CSV schema, bandwidth conventions, statistics, size grids, and the profiler parsers
(a real torch.profiler CUDA trace of NCCL on 2 H200s; kernel_details rows of HCCL collectives)."""

from __future__ import annotations

from pathlib import Path

import pytest

from opperf.comm.collectives import (COLLECTIVES, collective_file_name, comm_version_dir, op_of_file_name,
                                     reduction_modulus)
from opperf.comm.results import (COLUMNS, CONTRACT_COLUMNS, duration_statistics, per_call_durations,
                                 read_comm_csv, result_row, write_comm_csv)
from opperf.comm.sizes import DTYPES, comm_dtype, format_size, parse_bytes_grid, parse_size
from opperf.comm.timing import (TimedCase, cuda_kernel_durations, hccl_kernel_durations, make_timer,
                                split_kernel_durations)
from opperf.errors import DeviceUnavailableError, OpperfError

DATA = Path(__file__).parent / "data" / "comm"


@pytest.mark.parametrize("op, n, algbw_bytes, factor", [
    ("all_reduce", 2, 1, 1.0), ("all_reduce", 4, 1, 1.5), ("all_reduce", 8, 1, 1.75),
    ("all_gather", 4, 4, 0.75), ("reduce_scatter", 4, 4, 0.75), ("all_to_all", 4, 1, 0.75),
    ("all_gather", 2, 2, 0.5),
])
def test_bus_bandwidth_factors_follow_nccl_tests(op, n, algbw_bytes, factor):
    spec = COLLECTIVES[op]
    assert spec.bus_factor(n) == pytest.approx(factor)
    # 1 GB per rank in 1000 us: algbw = nccl-tests size / time
    assert spec.algbw_gbps(10**9, n, 1000.0) == pytest.approx(1000.0 * algbw_bytes)
    assert spec.busbw_gbps(10**9, n, 1000.0) == pytest.approx(1000.0 * algbw_bytes * factor)


def test_result_row_has_contract_columns_first_and_exact_values():
    row = result_row(op="all_gather", message_bytes=1 << 20, num_devices=4, dtype_csv="DT_BF16", topology_tier=1,
                     samples_us=[10.0, 20.0, 30.0, 40.0, 50.0], backend="nccl", bench_mode="kernel",
                     timing_method="cuda_profiler_kernel", group_ranks=[0, 1, 2, 3], grid_shape="1x8",
                     device="H200", collected_at="2026-11-22T07:30:00Z")
    assert tuple(row)[:6] == CONTRACT_COLUMNS == ("message_bytes", "num_devices", "dtype", "topology_tier",
                                                   "Duration(us)", "bandwidth_gbps")
    assert tuple(row) == COLUMNS
    assert row["Duration(us)"] == "30.000"
    assert row["bandwidth_gbps"] == f"{(1 << 20) / 30e3:.4f}"            # the peer's: bytes / time
    assert row["algbw_gbps"] == f"{4 * (1 << 20) / 30e3:.4f}"
    assert row["busbw_gbps"] == f"{4 * (1 << 20) / 30e3 * 0.75:.4f}"
    assert (row["Duration P10(us)"], row["Duration P90(us)"], row["sample_count"]) == ("14.000", "46.000", "5")
    assert row["group_ranks"] == "0 1 2 3" and row["verified"] == "true"


def test_per_call_duration_is_slowest_rank_for_events_and_last_arrival_for_kernels():
    rank0, rank1 = [465421.285, 121.951, 129.471], [193.344, 25.632, 24.896]
    assert per_call_durations([rank0, rank1], "event") == rank0
    assert per_call_durations([rank0, rank1], "kernel") == rank1
    with pytest.raises(OpperfError, match="different numbers of calls"):
        per_call_durations([[1.0], [1.0, 2.0]], "event")


def test_real_nccl_trace_kernels_and_launch_skew():
    """Rank 0 entered the profiled loop ~0.5 s before rank 1: its first NCCL kernel spun 465 ms waiting.
    The last-arriving rank's kernel time is the collective's own; fill_ kernels are not counted."""
    rank0 = cuda_kernel_durations(DATA / "nccl_trace_rank0.json")
    rank1 = cuda_kernel_durations(DATA / "nccl_trace_rank1.json")
    assert rank0 == [465421.285, 121.951, 129.471]
    assert rank1 == [193.344, 25.632, 24.896]
    calls = per_call_durations([rank0, rank1], "kernel")
    assert max(calls) < 200


def test_split_kernel_durations_drops_preroll_and_groups_kernels_per_call():
    cases = [TimedCase(case=None, iterations=2, preroll=1), TimedCase(case=None, iterations=1, preroll=1)]
    kernels = [9, 9, 1, 1, 2, 2, 8, 8, 3, 3]            # 2 kernels per call, 5 calls
    assert split_kernel_durations(kernels, cases, "test") == [[2, 4], [6]]
    with pytest.raises(OpperfError, match="found 7 collective kernels for 5 calls"):
        split_kernel_durations(kernels[:7], cases, "test")


def test_hccl_rows_of_kernel_details_exclude_aiv_duplicates_in_start_order():
    path = DATA / "kernel_details_hcom.csv"
    assert hccl_kernel_durations(path, "hcom_allReduce_") == [38.5, 39.0, 40.12]
    assert hccl_kernel_durations(path, "hcom_allGather_") == [55.0]
    assert hccl_kernel_durations(path, "hcom_alltoallv_") == []


def test_hccl_kernel_details_without_duration_column_names_the_field(tmp_path):
    bad = tmp_path / "kernel_details.csv"
    bad.write_text("Name,Type\nhcom_allReduce__1,hcom_allReduce_\n")
    with pytest.raises(OpperfError, match="Duration") as error:
        hccl_kernel_durations(bad, "hcom_allReduce_")
    assert error.value.path == str(bad)


def test_what_a_back_end_cannot_time_is_said_plainly():
    with pytest.raises(OpperfError, match="gloo \\(CPU\\) runs no device kernels"):
        make_timer("gloo", "kernel", "all_reduce", lambda: None)
    with pytest.raises(DeviceUnavailableError, match="needs torch_npu"):
        make_timer("hccl", "event", "all_reduce", lambda: None)
    assert make_timer("gloo", "event", "all_reduce", lambda: None).timing_method == "host_wall_clock"


def test_duration_statistics_reject_non_positive_samples():
    assert duration_statistics([3.0, 1.0, 2.0])["median"] == 2.0
    with pytest.raises(OpperfError, match="positive and finite"):
        duration_statistics([1.0, 0.0])


def _row(message_bytes, duration="10.000"):
    return result_row(op="all_reduce", message_bytes=message_bytes, num_devices=2, dtype_csv="DT_BF16",
                      topology_tier=2, samples_us=[float(duration)], backend="gloo", bench_mode="event",
                      timing_method="host_wall_clock", group_ranks=[0, 1], grid_shape="48x8x2", device="CPU")


def test_write_sorts_by_size_and_reads_back_typed(tmp_path):
    path = tmp_path / "hcom_allReduce_.csv"
    write_comm_csv(path, [_row(4096), _row(1024), _row(65536)])
    frame = read_comm_csv(path)
    assert list(frame.columns) == list(COLUMNS)
    assert frame["message_bytes"].tolist() == [1024, 4096, 65536]
    assert frame["Duration(us)"].dtype == "float64"


def test_an_empty_collective_file_keeps_its_header(tmp_path):
    path = tmp_path / "all_to_all.csv"
    write_comm_csv(path, [])
    assert path.read_text().strip() == ",".join(COLUMNS)


def test_repeated_point_is_refused_and_nothing_is_written(tmp_path):
    path = tmp_path / "all_reduce.csv"
    with pytest.raises(OpperfError, match="two rows for the same point"):
        write_comm_csv(path, [_row(1024), _row(1024)])
    assert list(tmp_path.iterdir()) == []


def test_reading_the_peers_contract_only_file_and_bad_values(tmp_path):
    good = tmp_path / "hcom_allGather_.csv"
    good.write_text("message_bytes,num_devices,dtype,topology_tier,Duration(us),bandwidth_gbps\n"
                    "1024,16,DT_BF16,1,50.12,0.02\n")
    assert read_comm_csv(good)["Duration(us)"].tolist() == [50.12]
    bad = tmp_path / "bad.csv"
    bad.write_text("message_bytes,num_devices,dtype,topology_tier,Duration(us),bandwidth_gbps\n"
                   "1024,16,DT_BF16,1,50.12,0.02\n2048,sixteen,DT_BF16,1,60,0.03\n")
    with pytest.raises(OpperfError) as error:
        read_comm_csv(bad)
    assert (error.value.row, error.value.field) == (3, "num_devices")
    missing = tmp_path / "missing.csv"
    missing.write_text("message_bytes,num_devices,dtype\n1,2,DT_BF16\n")
    with pytest.raises(OpperfError, match="missing required column"):
        read_comm_csv(missing)


def test_bytes_grid_default_units_and_ranges():
    default = parse_bytes_grid(None)
    assert (default[0], default[-1], len(default)) == (128, 512 << 20, 23)
    assert parse_bytes_grid(["1KiB..8KiB", "4096", "3MiB"]) == [1024, 2048, 4096, 8192, 3 << 20]
    assert parse_size("2MB") == 2 << 20 and format_size(1 << 20) == "1MiB" and format_size(1536) == "1536B"
    for bad in ("1.5KiB", "12XB", "0"):
        with pytest.raises(OpperfError, match="bytes-grid|message size"):
            parse_bytes_grid([bad])
    with pytest.raises(OpperfError, match="not a power of two"):
        parse_bytes_grid(["1KiB..3KiB"])


def test_dtypes_use_the_contract_spelling():
    assert {name: d.csv_name for name, d in DTYPES.items()} == {
        "bfloat16": "DT_BF16", "float16": "DT_FP16", "float32": "DT_FLOAT", "int8": "DT_INT8"}
    assert comm_dtype("torch.float16").element_bytes == 2
    with pytest.raises(OpperfError, match="unsupported dtype"):
        comm_dtype("float64")


def test_reductions_stay_exact_or_refuse():
    assert reduction_modulus(2, DTYPES["bfloat16"]) == 16
    assert reduction_modulus(64, DTYPES["bfloat16"]) == 5            # 4 * 64 = 256, exact in bf16
    with pytest.raises(OpperfError, match="cannot be checked exactly"):
        reduction_modulus(200, DTYPES["int8"])


def test_file_names_per_back_end_are_one_function_and_invertible():
    assert [collective_file_name("hccl", op) for op in COLLECTIVES] == [
        "hcom_allReduce_.csv", "hcom_allGather_.csv", "hcom_reduceScatter_.csv", "hcom_alltoallv_.csv"]
    assert collective_file_name("nccl", "all_to_all") == "all_to_all.csv"
    for backend in ("hccl", "nccl", "gloo"):
        for op in COLLECTIVES:
            assert op_of_file_name(backend, collective_file_name(backend, op)) == op
    with pytest.raises(OpperfError, match="not a gloo collective file"):
        op_of_file_name("gloo", "hcom_allReduce_")
    from opperf.versions import installed_torch_version

    assert comm_version_dir("gloo") == f"torch{installed_torch_version()}"


def test_first_call_errors_unsupported_is_recorded_anything_else_raises():
    from opperf.comm.bench import unsupported_reason

    assert unsupported_reason("all_to_all", [None, None]) is None
    gloo = "RuntimeError: ProcessGroupGloo does not support alltoall_base\nmore"
    assert unsupported_reason("all_to_all", [gloo, gloo]) == "RuntimeError: ProcessGroupGloo does not support alltoall_base"
    with pytest.raises(OpperfError, match="failed on the first call: RuntimeError: connection reset"):
        unsupported_reason("all_reduce", [None, "RuntimeError: connection reset"])
