"""FusedInferAttentionScore runtime metadata: profile shapes at parse time, JSONL backfill afterwards."""

from __future__ import annotations

import subprocess
import sys

import pytest

from opperf.errors import OpperfError
from opperf.parse import parse_profiles
from opperf.parse.fia_metadata import RUNTIME_COLUMNS, fill_fia_runtime_metadata
from test_parse_helpers import REPO, fixture_table, read_csv, read_header, write_table

# Input slots as aclnnFusedInferAttentionScore orders them: q, k, v, pse_shift, atten_mask, actual_seq_lengths,
# actual_seq_lengths_kv, ..., block_table (slot 14); 16 slots here.
DECODE_SHAPES = "8,1,4096;2048,128,512;2048,128,512;;8,1,2048;8;8;;;;;;;;8,16;"
PREFILL_SHAPES = "2048,32,128;2048,128,512;2048,128,512;;2048,2048;4;4;;;;;;;;4,64;"
OPERATOR_DECODE_SHAPES = "8,1,4096;2048,128,512;2048,128,512;;8,1,2048;16;16;;;;;;;;8,32;"


def _fia_profile(tmp_path):
    header, rows = fixture_table()
    col = {name: i for i, name in enumerate(header)}
    fia_rows = []
    for shapes, duration in ((DECODE_SHAPES, "50.5"), (PREFILL_SHAPES, "900.25"), (DECODE_SHAPES, "51.5")):
        row = list(rows[0])
        row[col["Type"]], row[col["Name"]] = "FusedInferAttentionScore", "aclnnFusedInferAttentionScoreV3_x"
        row[col["Input Shapes"]] = f'"{shapes}"'
        row[col["Input Data Types"]] = ";".join(["DT_BF16"] * 16)
        row[col["Input Formats"]] = ";".join(["ND"] * 16)
        row[col["Output Shapes"]] = '"8,1,4096"' if shapes == DECODE_SHAPES else '"2048,32,128"'
        row[col["Duration(us)"]] = duration
        fia_rows.append(row)
    bundle = tmp_path / "profiles" / "node0_77_ascend_pt"
    write_table(bundle / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv", header, rows + fia_rows)
    write_table(bundle / "ASCEND_PROFILER_OUTPUT" / "operator_details.csv", ["Name", "Input Shapes", "Output Shapes"],
                [["aten::add", "4,4", "4,4"],
                 ["npu::npu_fused_infer_attention_score", OPERATOR_DECODE_SHAPES, "8,1,4096"],
                 ["npu::npu_fused_infer_attention_score", PREFILL_SHAPES, "2048,32,128"],
                 ["npu::npu_fused_infer_attention_score", OPERATOR_DECODE_SHAPES, "8,1,4096"]])
    (bundle / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").write_text('{"traceEvents": []}')
    return tmp_path / "profiles"


def test_parse_fills_profile_shapes_from_the_bundle(tmp_path):
    parse_profiles([_fia_profile(tmp_path)], tmp_path / "out")
    columns = read_header(tmp_path / "out" / "FusedInferAttentionScore.csv")
    assert columns[-2:] == ["source", "Profiling Sample Count"]
    assert [c for c in columns if c.startswith("Runtime ")] == RUNTIME_COLUMNS
    decode, prefill = read_csv(tmp_path / "out" / "FusedInferAttentionScore.csv")
    assert decode["Profiling Sample Count"] == "2" and decode["Profiling Average Duration(us)"] == "51"
    assert decode["Runtime source_profile"] == "node0_77_ascend_pt"
    # operator_details (paired in launch order) has the operator-level view: 16 sequences, 32 blocks per row
    assert (decode["Runtime actual_seq_lengths_shape"], decode["Runtime actual_seq_lengths_kv_shape"],
            decode["Runtime block_table_shape"]) == ("16", "16", "8,32")
    assert (prefill["Runtime actual_seq_lengths_shape"], prefill["Runtime block_table_shape"]) == ("4", "4,64")
    assert decode["Runtime metadata_completeness"] == "profile_shapes_only"
    assert decode["Runtime actual_seq_lengths_kv_values"] == ""
    assert "Runtime source_profile" not in read_header(tmp_path / "out" / "MatMulV2.csv")


def test_without_operator_details_the_kernel_shapes_are_used(tmp_path):
    profiles = _fia_profile(tmp_path)
    next(profiles.rglob("operator_details.csv")).unlink()
    parse_profiles([profiles], tmp_path / "out")
    decode, _ = read_csv(tmp_path / "out" / "FusedInferAttentionScore.csv")
    assert (decode["Runtime actual_seq_lengths_shape"], decode["Runtime block_table_shape"]) == ("8", "8,16")


def _runtime_log(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_backfill_from_jsonl(tmp_path):
    parse_profiles([_fia_profile(tmp_path)], tmp_path / "out")
    csv_path = tmp_path / "out" / "FusedInferAttentionScore.csv"
    log = _runtime_log(tmp_path / "fia.jsonl", [
        f'{{"input_shapes": "{DECODE_SHAPES}", "actual_seq_lengths": [1,1,1,1,1,1,1,1], '
        f'"actual_seq_lengths_kv": [100,200,300,400,500,600,700,801], "num_heads": 32, "input_layout": "BSH"}}',
        f'{{"input_shapes": "{DECODE_SHAPES}", "actual_seq_lengths": [1,1,1,1,1,1,1,1], '
        f'"actual_seq_lengths_kv": [100,200,300,400,500,600,700,801], "num_heads": 32, "input_layout": "BSH"}}',
        "",
        f'{{"input_shapes": "{DECODE_SHAPES}", "actual_seq_lengths": [1,1,1,1,1,1,1,1], '
        f'"actual_seq_lengths_kv": [5,5,5,5,5,5,5,5], "num_heads": 32, "input_layout": "BSH"}}',
    ])
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "fill_fia_runtime_metadata.py"), "--csv-path",
                           str(csv_path), "--jsonl-path", str(log)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "backfilled 1/2 rows" in done.stdout and "1 unmatched" in done.stdout
    decode, prefill = read_csv(csv_path)
    assert decode["Runtime actual_seq_lengths_kv_values"] == "100,200,300,400,500,600,700,801"   # 2 of 3 calls
    assert decode["Runtime actual_seq_lengths_kv_shape"] == "8" and decode["Runtime actual_seq_lengths_shape"] == "8"
    assert decode["Runtime avg_seq_len"] == "450.125000"                    # 3601 / 8
    assert decode["Runtime num_heads"] == "32" and decode["Runtime input_layout"] == "BSH"
    assert decode["Runtime metadata_completeness"] == "runtime_values_dumped"
    assert decode["Runtime payload_count"] == "2"
    assert decode["Profiling Average Duration(us)"] == "51"                 # the profile's numbers untouched
    assert prefill["Runtime actual_seq_lengths_kv_values"] == ""            # unmatched: left as it was
    assert prefill["Runtime metadata_completeness"] == "profile_shapes_only"


def test_backfill_peer_record_form(tmp_path):
    parse_profiles([_fia_profile(tmp_path)], tmp_path / "out")
    csv_path = tmp_path / "out" / "FusedInferAttentionScore.csv"
    log = _runtime_log(tmp_path / "fia.jsonl", [
        '{"query_shape": [2048,32,128], "key_shape": [2048,128,512], "value_shape": [2048,128,512], '
        '"atten_mask_shape": [2048,2048], "block_table_shape": [4,64], "actual_seq_lengths": [512,512,512,512], '
        '"actual_seq_lengths_kv": [512,512,512,512]}'])
    result = fill_fia_runtime_metadata(csv_path, log, tmp_path / "filled.csv")
    assert (result.matched, result.unmatched) == (1, 1)
    _, prefill = read_csv(tmp_path / "filled.csv")
    assert prefill["Runtime actual_seq_lengths_values"] == "512,512,512,512"
    assert prefill["Runtime avg_seq_len"] == "512.000000"


@pytest.mark.parametrize("bad_line, field", [
    ('{"input_shapes": "1,2", "actual_seq_lengths": [1, "x"]}', "actual_seq_lengths"),
    ('[1, 2, 3]', None),
    ('{"input_shapes": ', None),
    ('{"input_shapes": [[1, 2], 3]}', "input_shapes"),
    ('{"query_shape": 5}', "query_shape"),
    ('{"query_shape": ["a"]}', "query_shape"),
    ('{"query_shape": [1, 2], "actual_seq_lengths_kv": 5}', "actual_seq_lengths_kv"),
])
def test_bad_jsonl_names_the_line_and_writes_nothing(tmp_path, bad_line, field):
    parse_profiles([_fia_profile(tmp_path)], tmp_path / "out")
    csv_path = tmp_path / "out" / "FusedInferAttentionScore.csv"
    before = csv_path.read_bytes()
    log = _runtime_log(tmp_path / "fia.jsonl", ['{"input_shapes": "1,2"}', bad_line])
    with pytest.raises(OpperfError) as info:
        fill_fia_runtime_metadata(csv_path, log)
    assert info.value.path == str(log) and info.value.row == 2 and info.value.field == field
    assert csv_path.read_bytes() == before
    assert not list(csv_path.parent.glob(".*.tmp"))
