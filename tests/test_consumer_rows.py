"""Rows of the performance model's own queries: recorded like TensorCast records them, laid out like a profile.

The grid's `--consumer-models` turns every op query a dispatch-mode performance model issues for the reference
decoder into a database row; `check_database.py --consumer-models` is the end-to-end gate that none of those
queries falls back to roofline. These tests hold the layout to the real CPU trace of the same decoder, and the
gate to the database a grid stage builds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from opperf.contract import (CONSUMER_QUERY, INPUT_DTYPES, INPUT_FORMATS, INPUT_SCALARS, INPUT_SHAPES, INPUT_STRIDES,
                             OUTPUT_DTYPES, OUTPUT_SHAPES, canonical_strides, row_signature)
from opperf.consumer.queries import profiler_args, reference_queries
from opperf.consumer.runtime import view_framework_ops
from opperf.consumer.scenarios import Scenario
from opperf.grid.queries import query_rows
from opperf.grid.templates import Layout
from opperf.io import read_database_csv

MODELS = "tests/data/parse/models.yaml"
TINY = "opperf-tiny-1layer"
# The trace tests/data/parse/cpu_decoder_trace.json holds: a 4-token prefill, then one decode step.
TRACE_SCENARIOS = [Scenario(TINY, 1, "prefill", 1, 4), Scenario(TINY, 1, "decode", 1, 1, 4)]


def _by_shapes(frame: pd.DataFrame) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for row in frame.to_dict("records"):
        found.setdefault(row[INPUT_SHAPES], []).append(row)
    return found


def _strides(row: dict) -> str:
    return canonical_strides(row.get(INPUT_STRIDES, ""), row[INPUT_SHAPES])


def test_a_recorded_query_is_the_row_a_profiled_call_of_that_op_is(cpu_parsed):
    """The same decoder, profiled on the CPU and recorded on meta tensors: where both hold a call of an op with
    the same input shapes, the two rows agree field by field (slots, dtypes, scalars, strides, outputs)."""
    recorded = reference_queries(MODELS, TRACE_SCENARIOS, dtype=torch.float32, attention="cpu")
    rows = query_rows(recorded, "CPU").rows
    compared = {}
    for kernel_type, generated in rows.items():
        path = cpu_parsed / f"{kernel_type}.csv"
        if not path.is_file():
            continue
        profiled = _by_shapes(read_database_csv(path))
        for row in generated:
            # The profiled call of these shapes in the same memory layout (a trace can hold several layouts).
            twins = [t for t in profiled.get(row[INPUT_SHAPES], []) if _strides(t) == _strides(row)]
            if not twins:
                continue
            twin = twins[0]
            compared[kernel_type] = compared.get(kernel_type, 0) + 1
            if kernel_type == "add" and twin[INPUT_DTYPES] != row[INPUT_DTYPES]:
                # A Python number: the profiler saw the 0-d tensor torch wrapped it in (no value recorded);
                # the query keeps the number itself. Every other field agrees.
                assert twin[INPUT_DTYPES].split(";")[1] == "DT_DOUBLE" and row[INPUT_DTYPES].split(";")[1] == ""
                assert row[INPUT_SCALARS].split(";")[1] == "1e-06"
                continue
            for column in (INPUT_DTYPES, INPUT_FORMATS, INPUT_SCALARS, OUTPUT_SHAPES, OUTPUT_DTYPES):
                assert row.get(column, "") == twin.get(column, ""), (kernel_type, column, row, twin)
    # Every kernel type the trace and the model share, each in a layout the workload used, the GEMMs with the
    # weight's transposed layout included.
    assert set(compared) >= {"mm", "bmm", "mul", "add", "neg", "cat", "silu", "pow", "rsqrt",
                             "_scaled_dot_product_flash_attention_for_cpu"}
    mm = next(r for r in rows["mm"] if r[INPUT_SHAPES] == "4,64;64,128")
    assert mm[INPUT_STRIDES] == ";1,64" and mm[INPUT_SCALARS] == ";"


def test_framework_level_ops_get_kernel_types_of_their_own():
    """What TensorCast records is the op, not the kernel a profile files: clone (a copy_ kernel), embedding
    (index_select), mean (sum + div_ on the CPU) become rows of their own op's type, in its schema's layout."""
    recorded = reference_queries(MODELS, TRACE_SCENARIOS, dtype=torch.float32, attention="cpu")
    result = query_rows(recorded, "CPU")
    assert {"clone", "embedding", "mean"} <= set(result.rows)
    assert result.views > 0 and result.queries == sum(1 for r in recorded if not r.view)
    embedding = {r[INPUT_SHAPES] for r in result.rows["embedding"]}
    assert embedding == {"256,64;1,4;;;", "256,64;1,1;;;"}     # weight, ids, padding_idx, scale_grad, sparse
    assert {r[INPUT_SCALARS] for r in result.rows["embedding"]} == {";;-1;False;False"}
    # Each row names the query it answers: the runtime prefers its layout over a grid pattern's.
    assert {r[CONSUMER_QUERY] for r in result.rows["embedding"]} == {"aten.embedding.default"}
    # A view is never a row: op_mapping answers it zero_cost.
    view_ops = {r.query.op_name for r in recorded if r.view}
    assert view_ops and view_ops <= set(view_framework_ops())


def test_profiler_args_fill_defaults_and_record_strides_and_dtype_codes():
    x = torch.empty(2, 8, 4, device="meta").transpose(0, 1)
    args = profiler_args(torch.ops.aten.sum.dim_IntList, (x, [-1], True), {"dtype": torch.bfloat16})
    assert args["Input Dims"] == [[8, 2, 4], [], [], []]
    assert args["Input type"] == ["float", "GenericList", "Scalar", "Scalar"]
    assert args["Concrete Inputs"] == ["", "[-1]", "True", "15"]       # ScalarType code of bfloat16
    assert args["Input Strides"][0] == [4, 32, 1]
    cat = profiler_args(torch.ops.aten.cat.default, ([torch.empty(1, 2, device="meta", dtype=torch.bfloat16)] * 2,),
                        {})
    assert cat["Input type"] == ["TensorList", "Scalar"] and cat["Concrete Inputs"][1] == "0"
    assert cat["List dtype"] == "bfloat16"


def test_grid_adds_the_queries_as_rows_and_new_kernel_types_to_the_manifest(cpu_parsed, tmp_path):
    out = tmp_path / "grid"
    done = subprocess.run([sys.executable, "scripts/generate_shape_grid.py", "--input-dir", str(cpu_parsed),
                           "--output-dir", str(out), "--backend", "cpu", "--max-hbm-gb", "16", "--models", MODELS,
                           "--target-models", TINY, "--consumer-models", TINY, "--consumer-dtype", "float32"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    manifest = (out / "kernel_types.txt").read_text().split()
    assert {"clone", "embedding", "mean"} <= set(manifest) and len(manifest) == len(set(manifest))
    assert "consumer queries:" in done.stderr and "new: clone, embedding, mean" in done.stderr
    recorded = reference_queries(MODELS, [Scenario(TINY, 1, "prefill", 1, 1000)], dtype=torch.float32,
                                 attention="cpu")
    wanted = query_rows(recorded, "CPU").rows
    for kernel_type, rows in wanted.items():
        held = {row_signature(r, kernel_type) for r in read_database_csv(out / f"{kernel_type}.csv").to_dict("records")}
        assert all(row_signature(r, kernel_type) in held for r in rows), kernel_type
    # A query the profile already has a row for adds none: that row answers it and names the query's op (which
    # the database's op_mapping then maps to the type).
    mm = read_database_csv(out / "mm.csv")
    profiled = mm[(mm["source"] == "profiled") & (mm[INPUT_SHAPES] == "4,64;64,128")]
    assert list(profiled[CONSUMER_QUERY]) == ["aten.mm.default"]
    assert (mm[INPUT_SHAPES] == "4,64;64,128").sum() == 1


def test_consumer_rows_need_a_torch_back_end(cpu_parsed, tmp_path):
    done = subprocess.run([sys.executable, "scripts/generate_shape_grid.py", "--input-dir", str(cpu_parsed),
                           "--output-dir", str(tmp_path / "grid"), "--backend", "npu", "--max-hbm-gb", "16",
                           "--models", MODELS, "--consumer-models", TINY], capture_output=True, text=True)
    assert done.returncode == 2
    assert "consumer-query rows are recorded for torch back ends (cpu, cuda); 'npu'" in done.stderr
    assert not (tmp_path / "grid").exists()


def _measured(rows_dir: Path, out: Path) -> Path:
    """A copy of a grid directory whose rows carry a duration (what replay would write), as a database."""
    out.mkdir(parents=True)
    for path in rows_dir.glob("*.csv"):
        frame = read_database_csv(path)
        frame["Average Duration(us)"] = frame["Replay Median Duration(us)"] = "2.5"
        frame["Replay Status"] = "ok"
        frame.to_csv(out / path.name, index=False)
    (out / "kernel_types.txt").write_text((rows_dir / "kernel_types.txt").read_text())
    database = out.parent / "db" / "torch2.13.0_cpu"
    subprocess.run([sys.executable, "scripts/build_database.py", "directory", "--rows-dir", str(out), "--device",
                    "CPU", "--output", str(database)], check=True, capture_output=True)
    return database


def test_end_to_end_gate_fails_on_roofline_fallbacks_and_passes_once_the_queries_are_rows(cpu_parsed, tmp_path):
    plain = _measured(cpu_parsed, tmp_path / "plain" / "rows")
    check = [sys.executable, "scripts/check_database.py", "--consumer-models", TINY, "--consumer-dtype", "float32",
             "--models", MODELS]
    done = subprocess.run([*check, str(plain), "--json", str(tmp_path / "plain.json")], capture_output=True,
                          text=True)
    assert done.returncode == 1
    assert "would fall back to roofline" in done.stdout
    failing = json.loads((tmp_path / "plain.json").read_text())["consumer"]["failing"]
    assert {f["status"] for f in failing} <= {"MISS", "ILLEGAL"} and any(f["op"] == "aten.clone.default"
                                                                        for f in failing)

    grid = tmp_path / "grid"
    subprocess.run([sys.executable, "scripts/generate_shape_grid.py", "--input-dir", str(cpu_parsed), "--output-dir",
                    str(grid), "--backend", "cpu", "--max-hbm-gb", "16", "--models", MODELS, "--target-models", TINY,
                    "--consumer-models", TINY, "--consumer-dtype", "float32"], check=True, capture_output=True)
    full = _measured(grid, tmp_path / "full" / "rows")
    mapping = yaml.safe_load((full / "op_mapping.yaml").read_text())["operator_mappings"]
    assert mapping["aten.view.default"]["zero_cost"] is True and mapping["aten.t.default"]["zero_cost"] is True
    assert mapping["aten.clone.default"]["kernel_type"] == "clone"
    done = subprocess.run([*check, str(full), "--json", str(tmp_path / "full.json")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]
    consumer = json.loads((tmp_path / "full.json").read_text())["consumer"]
    assert consumer["failing"] == [] and consumer["by_status"]["ZERO_COST"]["queries"] > 0
    assert consumer["by_status"]["EXACT"]["queries"] + consumer["by_status"]["ZERO_COST"]["queries"] == \
        consumer["queries"]


@pytest.mark.parametrize(("shape", "strides", "new_shape", "expected"), [
    # RoPE's neg on a slice of a fused QKV buffer (80 heads of 128, half a head read): the slice is kept.
    ((1, 64, 4096, 64), (41943040, 128, 10240, 1), (1, 32, 4096, 64), (25165824, 128, 6144, 1)),
    # mm's weight, transposed: (K, N) read column-major at any K, N.
    ((1024, 5120), (1, 1024), (2048, 6400), (1, 2048)),
    # The expanded KV head of grouped-query attention stays a stride-0 dim.
    ((1, 1, 8, 1, 128), (128, 128, 0, 128, 1), (1, 1, 8, 5, 128), (128, 128, 0, 128, 1)),
])
def test_a_layout_carries_over_to_new_shapes(shape, strides, new_shape, expected):
    layout = Layout.of(shape, strides)
    assert layout.strides(shape)[1:] == tuple(strides)[1:]
    assert layout.strides(new_shape) == expected


def test_dense_tensors_have_no_layout_and_size_one_strides_are_one_spelling():
    assert Layout.of((4, 5), (5, 1)) is None
    assert canonical_strides("51200,51200,1", "1,512,25600") == canonical_strides("26214400,51200,1", "1,512,25600")
    assert canonical_strides("1024,128,1024,1", "1,8,1,64") == "0,128,0,1"
