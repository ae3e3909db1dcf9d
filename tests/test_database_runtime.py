"""The database as msmodeling's runtime reads it: spellings, one row per runtime key, op_mapping, the check.

Real rows: tests/data/database/cpu_replayed/ holds five kernel types replayed by the demo job (CPU, torch
2.13.0, 2026-11-24). The opt-in test at the end asks msmodeling's own unmodified lookup code.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from opperf import contract
from opperf.consumer.runtime import RuntimeQuery, find, runtime_receives, runtime_row, runtime_view
from opperf.database.build import build_database_directory, build_op_mapping, finalise_kernel_csv
from opperf.database.report import check_database
from opperf.io import read_database_csv, write_csv_atomic
from opperf.replay.definitions import load_definition

REPO = Path(__file__).resolve().parent.parent
REPLAYED = REPO / "tests" / "data" / "database" / "cpu_replayed"
CPU_VERSION = "torch2.13.0_cpu"


@pytest.fixture(scope="module")
def cpu_database(tmp_path_factory) -> Path:
    database = tmp_path_factory.mktemp("db") / "data" / "CPU" / "torch" / CPU_VERSION
    build_database_directory(REPLAYED, "CPU", database, REPO / "config" / "devices.yaml", REPO / "config" / "kernels")
    return database


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_torch_trace_rows_are_written_in_the_runtime_spelling_with_aligned_slots(cpu_database):
    add = [r for r in _rows(cpu_database / "add.csv") if r[contract.INPUT_SHAPES] == '"1,16,1;;"']
    # x + 1e-6: slot 1 is a 0-d double (a wrapped number) and slot 2 the alpha scalar; the runtime drops both
    # from a query, so their dtypes are left empty and FLOAT stays aligned with the one shape.
    assert len(add) == 1
    assert add[0][contract.INPUT_DTYPES] == "FLOAT;;"
    assert add[0][contract.INPUT_FORMATS] == "ND;;"
    assert add[0][contract.OUTPUT_DTYPES] == "FLOAT"
    # ... and the layouts file (input order) still says what slot 1 was (it is what replay builds).
    layouts = _rows(cpu_database / "layouts" / "add.csv")
    assert layouts[0][contract.INPUT_SHAPES] == '"1,16,1;;"'
    assert layouts[0][contract.INPUT_DTYPES] == "FLOAT;DOUBLE;"


def test_out_slots_are_not_part_of_the_functional_call(cpu_database):
    # sum.IntList_out's `out=` slot (config/kernels/torch/sum.yaml: name out): aten.sum.dim_IntList has one tensor.
    first = [r for r in _rows(cpu_database / "sum.csv") if r[contract.INPUT_SHAPES] == '"1,16,256;;;;"'][0]
    assert first[contract.INPUT_DTYPES] == "FLOAT;;;;"
    assert _rows(cpu_database / "layouts" / "sum.csv")[0][contract.INPUT_SHAPES] == '"1,16,256;;;;1,16,1"'


def test_rows_the_runtime_cannot_tell_apart_become_the_dominant_layout(cpu_database):
    cat = _rows(cpu_database / "cat.csv")
    layouts = _rows(cpu_database / "layouts" / "cat.csv")
    # cat is looked up by its output alone (query_mode elementwise): of two layouts of one output and one input
    # regime, the runtime reads one. A RoPE cat and a KV-cache cat of the same output (lines 3/22, 20/23) are both
    # written: its exact match takes the first, its interpolation keeps them apart (runtime.elementwise_regime).
    assert (len(cat), len(layouts)) == (21, 23)
    # Lines 5 and 17 of the replayed file differ only in Input Strides: the strided layout carried 4 calls,
    # the contiguous generated row none -> the runtime gets the strided one, where the first of them stood.
    merged = [r for r in cat if r[contract.INPUT_SHAPES] == layouts[3][contract.INPUT_SHAPES]]
    assert len(merged) == 1
    assert merged[0]["Runtime Key Rows"] == "2"
    assert merged[0][contract.INPUT_STRIDES] == "4096,16,64,1;32768,32,512,1;"
    assert merged[0][contract.REPLAY_AVERAGE] == "31.8483"
    # copy_ lines 6 and 15: the profiled layout (4 calls) wins over the generated contiguous one.
    copy = _rows(cpu_database / "copy_.csv")
    assert len(copy) == 17 and len(_rows(cpu_database / "layouts" / "copy_.csv")) == 20


def test_each_layouts_row_is_found_at_its_line_of_the_runtimes_csv(cpu_database):
    """runtime_lines, read back from the two files: every row of the runtime's CSV stands for exactly one layouts
    row, the one it was written from (its `out=` slot emptied for sum, its durations the same), and a row of a
    shared runtime key whose layout lost is at no line (None)."""
    from opperf.consumer.runtime import runtime_lines

    for kernel_type, lines_missing in (("cat", 2), ("copy_", 3), ("sum", 0), ("add", 0)):
        view = read_database_csv(cpu_database / f"{kernel_type}.csv")
        every = read_database_csv(cpu_database / "layouts" / f"{kernel_type}.csv")
        lines = runtime_lines(view, every)
        found = [line for line in lines if line is not None]
        assert sorted(found) == list(range(2, len(view) + 2)), kernel_type
        assert lines.count(None) == lines_missing, kernel_type
        for index, line in enumerate(lines):
            if line is not None:
                for column in (contract.REPLAY_AVERAGE, contract.PROFILING_AVERAGE, contract.INPUT_STRIDES):
                    assert view.iloc[line - 2].get(column) == every.iloc[index].get(column), (kernel_type, index, column)
    # cat: replayed lines 5 and 17 share a key, the strided line 5 (4 calls) is the one the runtime reads.
    lines = runtime_lines(read_database_csv(cpu_database / "cat.csv"),
                          read_database_csv(cpu_database / "layouts" / "cat.csv"))
    assert lines[5 - 2] is not None and lines[17 - 2] is None
    # sum: the runtime's row has the `out=` slot emptied, and is still found.
    view = read_database_csv(cpu_database / "sum.csv")
    line = runtime_lines(view, read_database_csv(cpu_database / "layouts" / "sum.csv"))[0]
    assert view.iloc[line - 2][contract.INPUT_SHAPES] == '"1,16,256;;;;"'


def test_of_generated_layouts_the_runtime_gets_the_consumers_own():
    """Three layouts of one runtime key (q·k rope add at 512 tokens): a grid pattern's contiguous row first, the
    consumer model's transposed-q row after it (`Consumer Query`), neither profiled. The runtime gets the
    consumer's layout; a profiled row with calls would still win over both."""
    base = {contract.INPUT_SHAPES: "1,64,512,128;1,64,512,128;", contract.INPUT_DTYPES: "DT_BF16;DT_BF16;",
            contract.INPUT_FORMATS: "ND;ND;", contract.OUTPUT_SHAPES: "1,64,512,128",
            contract.OUTPUT_DTYPES: "DT_BF16", contract.OUTPUT_FORMATS: "ND", contract.SOURCE: "generated"}
    pattern = {**base, contract.INPUT_STRIDES: "", contract.REPLAY_AVERAGE: "8.5", contract.CONSUMER_QUERY: ""}
    consumer = {**base, contract.INPUT_STRIDES: "4194304,128,8192,1;;", contract.REPLAY_AVERAGE: "14.2",
                contract.CONSUMER_QUERY: "aten.add.Tensor"}
    view, every = runtime_view(pd.DataFrame([pattern, consumer]), "cuda")
    assert len(view) == 1 and len(every) == 2
    assert view.iloc[0][contract.REPLAY_AVERAGE] == "14.2" and view.iloc[0]["Runtime Key Rows"] == "2"
    profiled = {**base, contract.SOURCE: "profiled", contract.INPUT_STRIDES: "", contract.REPLAY_AVERAGE: "9.1",
                contract.PROFILING_SAMPLE_COUNT: "10", contract.CONSUMER_QUERY: ""}
    view, _ = runtime_view(pd.DataFrame([pattern, consumer, profiled]), "cuda")
    assert view.iloc[0][contract.REPLAY_AVERAGE] == "9.1" and view.iloc[0]["Runtime Key Rows"] == "3"


def test_no_shape_cell_reads_back_as_nan(cpu_database, tmp_path):
    """pandas with its defaults (as the runtime reads) gets a string in every shape cell, never NaN."""
    scalar_add = tmp_path / "Add.csv"
    shutil.copy(REPO / "tests" / "data" / "database" / "cpu_replayed" / "add.csv", tmp_path / "rows.csv")
    rows = read_database_csv(tmp_path / "rows.csv")
    rows.loc[0, contract.OUTPUT_SHAPES] = ""
    rows.to_csv(tmp_path / "rows.csv", index=False)
    finalise_kernel_csv(tmp_path / "rows.csv", "Add", scalar_add, backend="npu")
    for path in [scalar_add, *cpu_database.glob("*.csv")]:
        frame = pd.read_csv(path)
        for column in (contract.INPUT_SHAPES, contract.OUTPUT_SHAPES):
            assert frame[column].map(lambda v: isinstance(v, str)).all(), (path, column)
    assert (pd.read_csv(scalar_add)[contract.OUTPUT_SHAPES] == '""').sum() == 1


def test_npu_rows_keep_the_profiler_text():
    row = {contract.INPUT_SHAPES: "512,2,4096;512,2,4096", contract.INPUT_DTYPES: "DT_BF16;DT_BF16",
           contract.INPUT_FORMATS: "NCL;NCL", contract.OUTPUT_SHAPES: "", contract.OUTPUT_DTYPES: "FLOAT",
           contract.OUTPUT_FORMATS: "ND"}
    written = runtime_row(row, "npu")
    assert written[contract.INPUT_SHAPES] == '"512,2,4096;512,2,4096"'
    assert written[contract.OUTPUT_SHAPES] == '""'
    assert written[contract.INPUT_DTYPES] == "DT_BF16;DT_BF16" and written[contract.INPUT_FORMATS] == "NCL;NCL"


@pytest.mark.parametrize("framework_op, received, why", [
    ("aten.mm.default", True, ""),
    ("aten.linear.default", False, "decomposes (CompositeImplicitAutograd) before dispatch"),
    ("aten.matmul.default", False, "decomposes (CompositeImplicitAutograd) before dispatch"),
    ("npu.npu_fusion_attention.default", False, "never npu ops"),
    ("tensor_cast.attention.default", True, ""),
    ("aten.no_such_op.default", False, "has no op aten.no_such_op.default"),
])
def test_only_ops_the_runtime_can_receive_are_mapped(framework_op, received, why):
    answer, reason = runtime_receives(framework_op)
    assert answer is received and why in reason


def _op_mapping_of_empty_types(database: Path, device: str, definitions: str, kernel_types) -> dict:
    """op_mapping.yaml of a database directory holding an empty CSV per kernel type."""
    database.mkdir(parents=True)
    for kernel in kernel_types:
        (database / f"{kernel}.csv").write_text(",".join(contract.BASE_COLUMNS) + "\n")
    return build_op_mapping(sorted(database.glob("*.csv")), device, REPO / "config" / "devices.yaml",
                            REPO / "config" / "kernels" / definitions, database / "op_mapping.yaml")


def test_op_mapping_is_what_the_runtime_can_use(cpu_database, tmp_path):
    document = yaml.safe_load((cpu_database / "op_mapping.yaml").read_text())
    mappings = document["operator_mappings"]
    assert sorted(op for op, m in mappings.items() if not m.get("zero_cost")) == [
        "aten.add.Tensor", "aten.cat.default", "aten.copy_.default", "aten.mm.default", "aten.sum.dim_IntList"]
    # Views run no kernel: the runtime answers them 0, as the peer's op_mapping does; a copying op never.
    views = {op for op, m in mappings.items() if m.get("zero_cost")}
    assert {"aten.view.default", "aten.t.default", "aten.transpose.int", "aten.expand.default",
            "aten.slice.Tensor", "aten.split.Tensor", "aten.unsqueeze.default", "aten._unsafe_view.default"} <= views
    assert not views & {"aten.clone.default", "aten.contiguous.default", "aten.reshape.default", "aten.cat.default"}
    assert document["interpolation_policy"] == {"kernel_overrides": {"mm": {"max_interpolation_dim": 1}}}
    # cat is looked up by its output, as msmodeling looks up elementwise ops (config/kernels/torch/cat.yaml).
    assert document["operator_mappings"]["aten.cat.default"]["query_mode"] == "elementwise"
    # A3: attention is what TensorCast issues (tensor_cast.attention.default), never npu_fusion_attention;
    # collectives sit in the runtime's hccl/v{cann}/ directory.
    mapping = _op_mapping_of_empty_types(tmp_path / "data" / "A3" / "vllm_ascend" / "vllm0.18.0_torch2.9.0_cann8.5",
                                         "A3", "npu", ("MatMulV2", "FusedInferAttentionScore", "FlashAttentionScore"))
    assert mapping["communication_data_ref"] == "../../hccl/v8.5"
    ops = mapping["operator_mappings"]
    assert ops["tensor_cast.attention.default"]["query_mode"] == "attention_special"
    assert "aten.linear.default" not in ops and "aten.addmm.default" not in ops
    assert not any(op.startswith("npu.") for op in ops)
    assert ops["aten.view.default"] == {"zero_cost": True, "notes": "a view (its schema's return aliases an input): "
                                                                     "no kernel runs"}
    assert mapping["interpolation_policy"]["kernel_overrides"]["FusedInferAttentionScore"] == {
        "axis_transform": "sqrt_seq"}


def test_the_moe_layers_lookups_between_the_points_are_set_by_their_definitions(tmp_path):
    """msmodeling's generic lookup keys on inputs that carry the token count (a bias first, an index, a list);
    the definitions key those ops on their output (docs/msmodeling.md, "Rows where its runtime looks")."""
    mapping = _op_mapping_of_empty_types(tmp_path / "data" / "CPU" / "torch" / "torch2.13.0_cpu", "CPU", "torch",
                                         ("addmm", "scatter_", "gather", "clone", "stack"))
    overrides = mapping["interpolation_policy"]["kernel_overrides"]
    by_output = {"generic_compute": {"axis": "output_numel"}}
    assert overrides == {"addmm": {"max_interpolation_dim": 1, **by_output}, "gather": by_output,
                         "scatter_": by_output}
    ops = mapping["operator_mappings"]
    assert {op: ops[op]["kernel_type"] for op in ops if op.startswith("aten.scatter_.")} == {
        f"aten.scatter_.{overload}": "scatter_" for overload in ("src", "value", "reduce", "value_reduce")}
    assert ops["aten.clone.default"]["query_mode"] == ops["aten.stack.default"]["query_mode"] == "elementwise"
    # scatter_'s file only adds the policy: its rows are built from the op's schema, as a Type with no file.
    scatter = load_definition(REPO / "config" / "kernels" / "torch" / "scatter_.yaml")
    assert (scatter.schema_op, scatter.reference, scatter.recipe) == ("aten::scatter_", "schema:aten::scatter_",
                                                                      "schema aten::scatter_")


def test_an_op_whose_every_replayed_call_ran_no_device_work_costs_nothing(tmp_path):
    """empty_like on cuda allocates and launches nothing: its replayed calls measure 0 us and fail as no samples.
    Left mapped to those rows (no duration) the runtime would price a MoE router's empty_like at its roofline, and
    the consumer gate failed on it (H200, Mixtral and Qwen3-30B-A3B); it maps zero_cost, as a view does. A type
    with one measured row keeps its mapping."""
    database = tmp_path / "data" / "H200" / "torch" / "torch2.11.0_cuda13.0"
    database.mkdir(parents=True)
    header = [*contract.BASE_COLUMNS, contract.REPLAY_STATUS]
    row = ['"128"', "INT64", "ND", '"128"', "INT64", "ND"]
    for kernel, statuses in (("empty_like", ["failed_no_samples", "failed_no_samples"]),
                             ("fill_", ["failed_no_samples", "ok"])):
        lines = [",".join(header)] + [",".join(["eager", "CUDA", *row, "", s]) for s in statuses]
        (database / f"{kernel}.csv").write_text("\n".join(lines) + "\n")
    ops = build_op_mapping(sorted(database.glob("*.csv")), "H200", REPO / "config" / "devices.yaml",
                           REPO / "config" / "kernels" / "torch", database / "op_mapping.yaml")["operator_mappings"]
    assert ops["aten.empty_like.default"] == {"zero_cost": True,
                                              "notes": "no device work: every replayed call of empty_like measured 0 us"}
    assert ops["aten.fill_.Scalar"]["kernel_type"] == "fill_"


def test_a_schema_replayed_type_of_a_pointwise_op_is_queried_elementwise(tmp_path):
    """A kernel type with no definition maps its op's overloads; an op torch tags pointwise (an in-place one by
    its functional twin) gets the runtime's elementwise mode, whose neighbours follow elements: the generic path
    groups `masked_fill(x[N, D], mask[N, 1])` by the mask's N and never interpolated a MoE router's fills (H200,
    benchmarks/results/e2e_prediction/)."""
    ops = _op_mapping_of_empty_types(tmp_path / "data" / "H200" / "torch" / "torch2.11.0_cuda13.0", "H200", "torch",
                                     ("masked_fill", "masked_fill_", "index"))["operator_mappings"]
    assert ops["aten.masked_fill.Scalar"] == {"kernel_type": "masked_fill", "alternate_kernel_types": [],
                                              "query_mode": "elementwise"}
    assert ops["aten.masked_fill_.Scalar"]["query_mode"] == "elementwise"
    # Not tagged pointwise: the tensor-valued fill, and a gather by indices.
    assert "query_mode" not in ops["aten.masked_fill.Tensor"]
    assert "query_mode" not in ops["aten.index.Tensor"]


def test_the_check_finds_every_row_of_the_cpu_database(cpu_database):
    result = check_database(cpu_database)
    assert result["passed"]
    holdout = result["totals"].pop("holdout")
    assert result["totals"] == {"rows": 102, "rows_with_duration": 102, "findable": 100, "answered_scaled": 2,
                                "not_modelled": 0, "unmapped": 0, "dtype_unmapped": 0, "duplicate_runtime_keys": 0}
    # The demo's replayed CPU rows (a loaded 2-core VM): 18 interior points, errors as printed (the elementwise
    # kernel types and cat are interpolated by the elements they read and write, query_mode: elementwise). Seven of
    # them are predicted with a neighbour on another execution branch (mm rows whose weight is read transposed,
    # Input Strides `;1,256`; cats of strided inputs): ILLEGAL, counted apart.
    assert holdout["count"] == 11
    assert holdout["median"] == pytest.approx(0.1841021, rel=1e-6)
    assert holdout["p90"] == pytest.approx(1.7687454, rel=1e-6)
    assert holdout["cross_branch"]["count"] == 7
    assert "11 points, median 18.41 %, p90 176.87 %; 7 more predictions used a neighbour" in result["table"]


def test_an_elementwise_row_of_another_dtype_is_answered_scaled_and_passes(cpu_database, tmp_path):
    """A bf16 model's float32 upcasts give an elementwise output shape rows of two dtypes: the runtime answers both
    dtypes' calls with the first, scaled by bytes; the other stays its dtype's interpolation point, so the check
    counts it apart and passes (a workflow for a real bf16 model must not stop at its own check)."""
    database = tmp_path / CPU_VERSION
    shutil.copytree(cpu_database, database)
    add = read_database_csv(database / "add.csv")
    bf16 = add.iloc[[0]].assign(**{contract.INPUT_DTYPES: "DT_BF16;DT_BF16;", contract.OUTPUT_DTYPES: "DT_BF16"})
    write_csv_atomic(database / "add.csv", pd.concat([add, bf16], ignore_index=True))
    result = check_database(database)
    assert result["passed"] and result["totals"]["answered_scaled"] == 3       # and cat's 2 rows of other regimes
    assert result["kernel_types"]["add"]["answered_scaled"] == 1
    assert "(+3 elementwise rows whose calls their output shape's first row answers" in result["table"]


def test_the_check_fails_on_rows_the_runtime_cannot_tell_apart(cpu_database, tmp_path):
    broken = tmp_path / CPU_VERSION
    shutil.copytree(cpu_database, broken)
    # Put back the layouts file as the runtime's CSV: cat lines 5/17 and 8/9 then share a key (3/22 and 20/23 share
    # an output but not an input regime: points of their own).
    shutil.copy(broken / "layouts" / "cat.csv", broken / "cat.csv")
    result = check_database(broken)
    assert not result["passed"]
    cat = result["kernel_types"]["cat"]
    assert cat["duplicate_key_lines"] == [[5, 17], [8, 9]]
    assert [(m["line"], m["why"]) for m in cat["misses"]] == [
        (4, "aten.cat.default is answered by cat.csv line 2"), (5, "aten.cat.default is answered by cat.csv line 3"),
        (17, "aten.cat.default is answered by cat.csv line 3")]
    assert "duplicate runtime keys: 2; FAILED" in result["table"]


def test_the_lookup_model_follows_the_runtime_rules():
    header = list(contract.BASE_COLUMNS) + [contract.REPLAY_AVERAGE]

    def table(*rows):
        return pd.DataFrame([dict(zip(header, r)) for r in rows], columns=header)

    mm = table(("", "", '"64,4096;4096,512"', "DT_BF16;DT_BF16", "ND;ND", '"64,512"', "DT_BF16", "ND", "10"),
               ("", "", '"60,4096;4096,512"', "DT_BF16;DT_BF16", "ND;ND", '"60,512"', "DT_BF16", "ND", "9"),
               ("", "", '"1,4096;512,4096"', "DT_BF16;DT_BF16", "ND;ND", '"1,512"', "DT_BF16", "ND", "2"))
    mapping = {"kernel_type": "MatMulV2"}
    bf16 = "DT_BF16"
    query = RuntimeQuery(inputs=(((60, 4096), bf16), ((4096, 512), bf16)), output=None)
    assert find({"MatMulV2": mm}, mapping, query) == ("MatMulV2", 1)        # identity beats padding (line 2)
    query = RuntimeQuery(inputs=(((64, 4096), bf16), ((4096, 512), bf16)), output=None)
    assert find({"MatMulV2": mm}, mapping, query) == ("MatMulV2", 0)
    # (1, 4096) x (4096, 512) against the stored (N, K) weight: batch_strip + transpose, MatMul kernels only.
    query = RuntimeQuery(inputs=(((1, 4096), bf16), ((4096, 512), bf16)), output=None)
    assert find({"MatMulV2": mm}, mapping, query) == ("MatMulV2", 2)
    assert find({"mm": mm}, {"kernel_type": "mm"}, query) is None
    # fp32 queries never match bf16 rows; float16 is asked as DT_BF16.
    query = RuntimeQuery(inputs=(((64, 4096), "FLOAT"), ((4096, 512), "FLOAT")), output=None)
    assert find({"MatMulV2": mm}, mapping, query) is None


def test_an_elementwise_row_of_another_output_dtype_answers_scaled_by_its_bytes():
    """The runtime's elementwise exact path takes the first row of the query's output shape (a leading 1 dropped);
    of another output dtype it answers the row's time times the byte ratio, and of a dtype it has no size for
    (BOOL) it does not match. A MoE router's bf16 -> fp32 `_to_copy` of [12, 128] found a fp32 -> bf16 row of
    [1, 12, 128] first: msmodeling answered 2.08 us, twice the row (H200 Qwen3-30B-A3B database, 84fec85)."""
    from opperf.consumer.runtime import answered_latency

    header = list(contract.BASE_COLUMNS) + [contract.REPLAY_AVERAGE]
    rows = [("", "", '"1,12,128"', "FLOAT", "ND", '"1,12,128"', "DT_BF16", "ND", "1.0422"),
            ("", "", '"12,128"', "DT_BF16", "ND", '"12,128"', "FLOAT", "ND", "2.4629")]
    tables = {"_to_copy": pd.DataFrame([dict(zip(header, r)) for r in rows], columns=header)}
    mapping = {"kernel_type": "_to_copy", "query_mode": "elementwise"}
    to_float = RuntimeQuery(inputs=(((12, 128), "DT_BF16"),), output=((12, 128), "FLOAT"))
    hit = find(tables, mapping, to_float)
    assert hit == ("_to_copy", 0) and answered_latency(tables, mapping, to_float, hit) == pytest.approx(2.0844)
    to_bf16 = RuntimeQuery(inputs=(((12, 128), "FLOAT"),), output=((12, 128), "DT_BF16"))
    assert answered_latency(tables, mapping, to_bf16, find(tables, mapping, to_bf16)) == pytest.approx(1.0422)
    assert find(tables, mapping, RuntimeQuery(inputs=(((12, 128), "DT_BF16"),), output=((12, 128), "BOOL"))) is None


@pytest.mark.skipif(not os.environ.get("OPPERF_MSMODELING_DIR"),
                    reason="set OPPERF_MSMODELING_DIR to a msmodeling checkout (and OPPERF_MSMODELING_PYTHON to "
                           "a Python that imports it) to ask the real runtime")
def test_msmodelings_own_lookup_finds_every_row(cpu_database, tmp_path):
    python = os.environ.get("OPPERF_MSMODELING_PYTHON", sys.executable)
    out = tmp_path / "lookup.json"
    completed = subprocess.run([python, str(REPO / "benchmarks" / "runtime_lookup.py"), "--msmodeling",
                                os.environ["OPPERF_MSMODELING_DIR"], str(cpu_database), "--json", str(out)],
                               capture_output=True, text=True, cwd=REPO)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    totals = json.loads(out.read_text())["results"][0]["totals"]
    # every row its own query finds, but cat's 2 rows of another input regime, which the runtime answers with the
    # first row of their output (as the check counts them: answered_scaled)
    assert (totals["found"], totals["answered_by_output"], totals["rows_with_duration"]) == (100, 2, 102)
    assert totals["exceptions"] == 0 and totals["model_disagrees"] == 0


def test_an_elementwise_row_answered_by_a_row_of_another_rank_counts_as_answered_by_its_output():
    """msmodeling's MoE combine multiplies [1, 1, 6, 2560] by its weights [1, 1, 6, 1]; the elementwise path drops
    the leading 1 and matches the RMSNorm's [2560] * [1, 6, 2560] row of output [1, 6, 2560] first (H200
    ERNIE-4.5-21B-A3B database, mul.csv lines 268 and 271): the check counts the later row answered by its output,
    not a miss."""
    from opperf.database.check import check_findable

    header = list(contract.BASE_COLUMNS) + [contract.REPLAY_AVERAGE]
    rows = [("", "", '"2560;1,6,2560"', "DT_BF16;DT_BF16", "ND;ND", '"1,6,2560"', "DT_BF16", "ND", "2.7"),
            ("", "", '"1,1,6,2560;1,1,6,1"', "DT_BF16;DT_BF16", "ND;ND", '"1,1,6,2560"', "DT_BF16", "ND", "2.6")]
    table = pd.DataFrame([dict(zip(header, r)) for r in rows], columns=header)
    mapping = {"aten.mul.Tensor": {"kernel_type": "mul", "query_mode": "elementwise"}}
    check = check_findable(mapping, {"mul": table})["mul"]
    assert (check.findable, check.scaled, check.misses) == (1, 1, [])
