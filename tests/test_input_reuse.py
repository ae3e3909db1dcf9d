"""Input reuse distances: the parse measures, from an execution trace, how much data the device touched between
each input's previous use and the call; replay's insitu cache state holds what an LRU cache would still hold."""

from __future__ import annotations

import csv
import math

import pytest
import torch

from opperf import contract
from opperf.parse.reuse import MIB, reuse_distances
from opperf.replay.inputs import ReplayCase, parse_row_slots
from opperf.replay.residency import parse_reuse, resident_bytes, slot_reuse
from opperf.replay.timing import CacheState


def _tensor(tensor_id: int, storage: int, mib: float, device: str = "cuda:0") -> list:
    return [tensor_id, storage, 0, int(mib * MIB) // 2, 2, device]


def _node(rf_id: int, inputs: list, outputs: list, input_types: list | None = None) -> dict:
    return {"name": "aten::op", "attrs": [{"name": "rf_id", "type": "uint64", "value": rf_id}],
            "inputs": {"values": inputs, "types": input_types or ["Tensor(c10::BFloat16)"] * len(inputs)},
            "outputs": {"values": outputs, "types": ["Tensor(c10::BFloat16)"] * len(outputs)}}


def test_distances_are_the_distinct_data_touched_since_the_last_use():
    # 1: x (2 MiB) written. 2: weight W (8 MiB, never seen) read, y (1 MiB) written. 3: W read again (y touched
    # since), and y (nothing since), z written.
    # 4: add(x, z): x was last used at 1, then W, y and z were touched (W once, however often it was read).
    nodes = {1: _node(1, [], [_tensor(10, 1, 2)]),
             2: _node(2, [_tensor(11, 2, 8)], [_tensor(12, 3, 1)]),
             3: _node(3, [_tensor(13, 2, 8), _tensor(14, 3, 1)], [_tensor(15, 4, 0.5)]),
             4: _node(4, [_tensor(10, 1, 2), _tensor(15, 4, 0.5), 1], [_tensor(16, 5, 2)],
                      ["Tensor(c10::BFloat16)", "Tensor(c10::BFloat16)", "Int"])}
    assert reuse_distances(nodes, [1, 2, 3, 4, 99], "cuda") == [
        "", "inf", "1;0", "9.5;0;", None]


def _slice(tensor_id: int, storage: int, offset_mib: float, mib: float) -> list:
    return [tensor_id, storage, int(offset_mib * MIB) // 2, int(mib * MIB) // 2, 2, "cuda:0"]


def test_views_of_one_storage_are_other_data():
    """A MoE layer's experts are slices of one stacked weight (storage 7): each expert's 24 MiB is read for the
    first time (inf), and the second pass's expert 0 lies behind the other experts' 48 MiB and all that was written
    since (50.5 MiB), not behind the one expert before it. Slices of a fused QKV output read by the next ops are as
    recent as that output was; a slice that shares a 1 MiB block with its neighbour is other data for the bytes it
    does not share."""
    x = _tensor(1, 1, 1)
    experts = {e: _slice(10 + e, 7, 24 * e, 24) for e in range(3)}
    nodes = {1: _node(1, [], [x])}
    for e in range(3):
        nodes[2 + e] = _node(2 + e, [x, experts[e]], [_tensor(20 + e, 20 + e, 0.5)])
    nodes[5] = _node(5, [x, experts[0]], [_tensor(30, 30, 0.5)])
    assert reuse_distances(nodes, [1, 2, 3, 4, 5], "cuda") == [
        "", "0;inf", "24.5;inf", "24.5;inf", "24.5;50.5"]   # 5: expert 0 behind x, experts 1 and 2, 3 outputs
    fused = {1: _node(1, [], [_tensor(1, 3, 3)]),                                  # q, k, v: 1 MiB each
             2: _node(2, [_slice(2, 3, 0, 1)], [_tensor(4, 4, 1)]),               # q
             3: _node(3, [_slice(3, 3, 1, 1)], [_tensor(5, 5, 1)]),               # k: q and q's output since
             4: _node(4, [_slice(6, 8, 0, 1.5)], []),
             5: _node(5, [_slice(7, 8, 1.5, 1.5)], [])}                           # shares block 1 for 0.5 MiB
    assert reuse_distances(fused, [1, 2, 3, 4, 5], "cuda") == ["", "0", "2", "inf", "inf"]


def test_a_grouped_gemms_output_lies_behind_the_weights_it_streamed_after_writing_it():
    """A MoE layer's expert GEMM writes its output while it streams every routed expert's weights: the memcpy that
    clones the output reads it cold, as the workload did (benchmarks/results/small_kernels/copy_state/). Its 3 MiB
    output's middle block lies behind half of the 1 MiB of rows and 32 MiB of weights; a decode step's 2 rows read
    2 of 8 experts' weights; an ordinary GEMM's output stays just written."""
    def grouped(rf_id: int, rows: int, out: list, name: str = "aten::_grouped_mm") -> dict:
        node = _node(rf_id, [_tensor(1, 1, 1), _tensor(2, 2, 32)], [out])
        node["name"] = name
        node["inputs"]["shapes"] = [[rows, 512], [8, 512, 4096], [8]]
        return node

    def clone(rf_id: int, source: list) -> dict:
        return _node(rf_id, [source], [_tensor(rf_id * 10, rf_id * 10, 3)])

    prefill = {1: grouped(1, 1024, _tensor(3, 3, 3)), 2: clone(2, _tensor(3, 3, 3))}
    assert reuse_distances(prefill, [1, 2], "cuda")[1] == "16.5"
    decode = {1: grouped(1, 2, _tensor(3, 3, 3)), 2: clone(2, _tensor(3, 3, 3))}
    assert reuse_distances(decode, [1, 2], "cuda")[1] == "4.5"          # (1 + 32 * 2 / 8) / 2
    dense = {1: grouped(1, 1024, _tensor(3, 3, 3), "aten::mm"), 2: clone(2, _tensor(3, 3, 3))}
    assert reuse_distances(dense, [1, 2], "cuda")[1] == "0"
    read_since = {1: grouped(1, 1024, _tensor(3, 3, 3)), 2: clone(2, _tensor(3, 3, 3)), 3: clone(3, _tensor(3, 3, 3))}
    assert reuse_distances(read_since, [1, 2, 3], "cuda")[2] == "3"      # behind the first clone's output only


def test_a_gather_reads_the_rows_it_returns_not_its_table():
    """A decode step's embedding lookup reads 4 rows of a 4 MiB table: a weight used before and after it lies behind
    those rows (0.25 MiB here), not the whole table. The table's blocks keep their last use: a gather's own table
    is a first use (its rows are other rows each step), and a whole read after a gather lies behind what was touched
    since the last whole read."""
    table, index = _tensor(20, 2, 4), _tensor(21, 4, 0.25)

    def gather(rf_id: int, out_storage: int) -> dict:
        node = _node(rf_id, [table, 0, index], [_tensor(rf_id * 10, out_storage, 0.25)],
                     ["Tensor(c10::BFloat16)", "Int", "Tensor(long int)"])
        node["name"] = "aten::index_select"
        return node

    nodes = {1: _node(1, [_tensor(10, 1, 8)], [_tensor(11, 3, 1)]),      # weight W read, y written
             2: gather(2, 5),                                            # 0.25 MiB of rows, index, output
             3: _node(3, [_tensor(10, 1, 8)], [_tensor(12, 8, 0.5)]),    # W again
             4: _node(4, [table], [_tensor(13, 6, 0.5)]),                # the table read whole (a tied lm_head)
             5: gather(5, 7),
             6: _node(6, [table], [])}
    assert reuse_distances(nodes, [1, 2, 3, 4, 5, 6], "cuda") == [
        "inf", "inf;;inf", "1.75", "inf", "0.5;;13.25", "1.25"]
    ungathered = {**nodes, 2: {**gather(2, 5), "name": "aten::op"}}
    assert reuse_distances(ungathered, [1, 2, 3], "cuda")[2] == "5.5"   # every block of the table counted


def test_a_tensor_list_is_one_slot_per_member_and_host_scalars_are_not_device_data():
    nodes = {1: _node(1, [], [_tensor(1, 1, 1)]),
             2: _node(2, [], [_tensor(2, 2, 3)]),
             3: _node(3, [[_tensor(1, 1, 1), _tensor(2, 2, 3)], -1, _tensor(3, 9, 0.001, "cpu")], [_tensor(4, 4, 4)],
                      ["GenericList[Tensor(c10::BFloat16),Tensor(c10::BFloat16)]", "Int", "Tensor(double)"])}
    assert reuse_distances(nodes, [1, 2, 3], "cuda")[2] == "3;0;;"


def test_the_parse_writes_each_rows_median_distance_per_slot(tmp_path):
    """A real CPU profile of the reference decoder, with its execution trace, parsed: every row has the column, a
    matmul weight is cold (its first use, or a whole forward ago) and its activation was just written."""
    from conftest import REPO
    from opperf.parse import parse_profiles
    from opperf.workload.model import load_model_dims
    from opperf.workload.profile import WorkloadPlan, profile_workload

    profile = tmp_path / "profile"
    profile_workload(load_model_dims(REPO / "config" / "models.yaml", "opperf-tiny"),
                     WorkloadPlan(prefill_lengths=(8,), decode_steps=2, decode_context=8), "cpu", "float32", profile)
    assert (profile / contract.EXECUTION_TRACE).exists()
    database = tmp_path / "db"
    parse_profiles([profile / "trace.json"], database)
    with open(database / "mm.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        activation, weight = parse_reuse(row[contract.PROFILING_INPUT_REUSE])
        # at most a few small tensors (a mask, a scalar) between the activation's write and the matmul
        assert activation < 0.01 and (math.isinf(weight) or weight > 0.1), row
    for path in database.glob("*.csv"):
        with open(path, newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                field = row[contract.PROFILING_INPUT_REUSE]
                assert field.count(";") == row[contract.INPUT_SHAPES].count(";"), (path.name, row)


def test_an_lru_cache_holds_the_tail_its_capacity_leaves():
    assert resident_bytes(10 * MIB, 0.0, 50 * MIB) == 10 * MIB
    assert resident_bytes(30 * MIB, 30.0, 50 * MIB) == 20 * MIB
    assert resident_bytes(4096, 60.0, 50 * MIB) == 0
    assert resident_bytes(4096, math.inf, 50 * MIB) == 0


def test_insitu_rewrites_what_the_reuse_distances_leave_resident():
    row = {contract.INPUT_SHAPES: "256,1024;256,1024;1024,1024", contract.INPUT_DTYPES: "DT_FLOAT;DT_FLOAT;DT_FLOAT",
           contract.INPUT_FORMATS: "ND;ND;ND", contract.OUTPUT_SHAPES: "", contract.OUTPUT_DTYPES: "",
           contract.OUTPUT_FORMATS: "", contract.PROFILING_INPUT_REUSE: "0;1.5;inf"}
    a, b, w = torch.ones(256, 1024), torch.ones(256, 1024), torch.ones(1024, 1024)
    case = ReplayCase(fn=torch.addmm, args=(a, b, w), warm=(a, b, w))
    case.reuse = slot_reuse(case.tensors(), parse_row_slots(row), parse_reuse(row[contract.PROFILING_INPUT_REUSE]))
    assert sorted(case.reuse.values()) == [0.0, 1.5, math.inf]
    _, views, description = CacheState(torch.device("cpu"), 2 * MIB).plan(case)
    # 1 MiB each: a all of it (nothing since), b the last 0.5 MiB (1.5 of 2 MiB taken since), w nothing (first use).
    assert sorted(v.numel() for v in views) == [MIB // 2, MIB]
    assert "1 cold input(s), 3 placed by the workload's reuse distances" in description


def test_a_bad_distance_names_the_field():
    from opperf.errors import OpperfError

    with pytest.raises(OpperfError, match="Profiling Input Reuse Distance.*'-3' is negative"):
        parse_reuse("0;-3;")
    with pytest.raises(OpperfError, match="'warm' is not a number"):
        parse_reuse("warm;")


def test_an_execution_trace_of_another_run_is_refused(tmp_path):
    """The join is by record function id: an execution trace saved beside another run's trace would pair ops with
    other ops' tensors. A few calls of the same op with other shapes are a MoE split that moved between the timed
    pass and the execution-trace pass (opperf.workload.execution_trace); most of them is another run: the parse
    names the file and writes nothing."""
    import shutil
    import subprocess
    import sys

    from conftest import REPO
    from opperf.errors import OpperfError
    from opperf.parse import parse_profiles

    def profile(out, *plan):   # each in its own process, as two runs are: record function ids restart at 1
        subprocess.run([sys.executable, "scripts/profile_workload.py", "--decode-steps", "0", *plan, "--output",
                        str(out)], cwd=REPO, check=True, capture_output=True)

    profile(tmp_path / "first", "--prefill-lengths", "8")
    profile(tmp_path / "second", "--prefill-lengths", "16")
    shutil.copy(tmp_path / "second" / contract.EXECUTION_TRACE, tmp_path / "first" / contract.EXECUTION_TRACE)
    with pytest.raises(OpperfError, match=r"execution_trace.json.*op calls have other tensor shapes in the execution "
                                          r"trace: it is of another run"):
        parse_profiles([tmp_path / "first" / "trace.json"], tmp_path / "db")
    assert not (tmp_path / "db").exists()
