"""The queries msmodeling's own runner issues over a scenario space, recorded in one process, and the rows laid for
them: TensorCast's paged attention and cache write as PagedAttention / ReshapeAndCache rows msmodeling's own data
source answers EXACT, every other op as the grid lays a consumer query (the rotary index_select / cat in the runner's
shapes, bfloat16; the RMSNorm's float32 ops float32).

Needs msmodeling's checkout (`$OPPERF_MSMODELING_DIR`, else the pinned copy in ../shared/msmodeling) and its Python
dependencies (the `msmodeling` extra, part of `.[test]`); elsewhere these tests skip and say why."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest

from opperf.consumer.msmodeling_env import find_msmodeling
from opperf.consumer.msmodeling_queries import (AS_RECORDED, ATTENTION_OP, CACHE_WRITE_OP, RECORDER, ask_msmodeling,
                                                attention_call, lookup_attention_calls, record_model_queries,
                                                rows_from_calls, scenario_texts)
from opperf.contract import (CONSUMER_QUERY, INPUT_DTYPES, INPUT_SHAPES, REPLAY_AVERAGE, TORCH_TO_PROFILER_DTYPE,
                             order_columns)
from opperf.errors import OpperfError
from opperf.consumer.scenarios import load_scenario_space

REPO = Path(__file__).resolve().parent.parent
INSTALL = find_msmodeling()
pytestmark = pytest.mark.skipif(INSTALL is None, reason="no msmodeling checkout: set OPPERF_MSMODELING_DIR or lay "
                                                         "the pinned copy in ../shared/msmodeling")
TINY_DENSE = REPO / "tests" / "data" / "workload" / "tiny_mistral.json"
SPACE = ["prefill:16", "prefill:64", "decode:4x512", "decode:2x1000"]
DEPTH = 6        # the config's own depth; msmodeling runs 2 layers (--num-hidden-layers-override)


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    """tiny_mistral (hidden 64, 4 heads, 2 KV heads, head_dim 16) at 6 layers: a config.json file, not a directory."""
    path = tmp_path_factory.mktemp("models") / "tiny_dense.json"
    path.write_text(json.dumps({**json.loads(TINY_DENSE.read_text()), "num_hidden_layers": DEPTH}))
    return path


@pytest.fixture(scope="module")
def recorded(config):
    return record_model_queries(INSTALL, config, SPACE, timeout_s=600)      # one recorder process for all four


@pytest.fixture(scope="module")
def laid(recorded):
    return rows_from_calls(recorded, "CPU")


def calls_of(scenario, op: str) -> list[dict]:
    return [call for call in scenario.calls if call["op"] == op]


def test_one_process_runs_each_scenario_as_msmodelings_cli_runs_it(recorded, config):
    assert [s.name for s in recorded.scenarios] == SPACE
    assert [s.msmodeling_args for s in recorded.scenarios] == [
        ["--num-queries", "1", "--query-length", "16"], ["--num-queries", "1", "--query-length", "64"],
        ["--num-queries", "4", "--query-length", "1", "--context-length", "512", "--decode"],
        ["--num-queries", "2", "--query-length", "1", "--context-length", "1000", "--decode"]]
    assert recorded.msmodeling_args_common == ["--device", "TEST_DEVICE", "--num-devices", "1", "--tp-size", "1",
                                               "--quantize-linear-action", "DISABLED",
                                               "--num-hidden-layers-override", "2"]
    assert (recorded.model, recorded.device, recorded.layers, recorded.depth) == ("hf_tiny_dense", "TEST_DEVICE", 2,
                                                                                   DEPTH)
    assert (recorded.msmodeling_commit, recorded.msmodeling_commit_source) == (INSTALL.commit, INSTALL.commit_source)
    # A scenario recorded beside others is the scenario recorded alone: the runs share the process, nothing else.
    [alone] = record_model_queries(INSTALL, config, ["decode:2x1000"], timeout_s=600).scenarios
    assert alone.calls == recorded.scenarios[3].calls


def test_calls_are_counted_per_step_at_the_models_own_depth(recorded):
    decode = recorded.scenarios[2]
    [attention] = calls_of(decode, ATTENTION_OP)
    assert (attention["count"], attention["full_depth_count"]) == (2, DEPTH)           # one per layer
    [embedding] = calls_of(decode, "aten.embedding.default")
    assert (embedding["count"], embedding["full_depth_count"]) == (1, 1)
    # The RMSNorm: two per layer and the final norm.
    assert {(c["count"], c["full_depth_count"]) for c in calls_of(decode, "aten.rsqrt.default")} == {(5, 2 * DEPTH + 1)}


def test_paged_attention_rows_are_the_runners_calls(laid):
    rows = laid.rows["PagedAttention"]
    assert [(r[INPUT_SHAPES], r["Runtime avg_seq_len"], r["Runtime batch_size"]) for r in rows] == [
        ("16,64;1,128,2,16;1,128,2,16;;1,1;2;1;1", "16", "1"),
        ("64,64;1,128,2,16;1,128,2,16;;1,1;2;1;1", "64", "1"),
        ("4,64;17,128,2,16;17,128,2,16;;4,5;5;4;4", "513", "4"),       # 4 x 512 context + the new token
        ("2,64;16,128,2,16;16,128,2,16;;2,8;3;2;2", "1001", "2"),
        # Where msmodeling's lookup looks between them: prefill every 16 tokens, decode every batch at each context.
        ("32,64;1,128,2,16;1,128,2,16;;1,1;2;1;1", "32", "1"),
        ("48,64;1,128,2,16;1,128,2,16;;1,1;2;1;1", "48", "1"),
        ("2,64;9,128,2,16;9,128,2,16;;2,5;3;2;2", "513", "2"),
        ("3,64;13,128,2,16;13,128,2,16;;3,5;4;3;3", "513", "3"),
        ("3,64;24,128,2,16;24,128,2,16;;3,8;4;3;3", "1001", "3"),
        ("4,64;32,128,2,16;32,128,2,16;;4,8;5;4;4", "1001", "4")]
    assert laid.lookup_rows == {"PagedAttention": 6}
    assert rows[2] == {
        "OP State": "eager", "Accelerator Core": "CPU", INPUT_SHAPES: "4,64;17,128,2,16;17,128,2,16;;4,5;5;4;4",
        INPUT_DTYPES: "DT_BF16;DT_BF16;DT_BF16;;INT64;INT64;INT64;INT64", "Input Formats": "ND;ND;ND;;ND;ND;ND;ND",
        "Output Shapes": "4,64", "Output Data Types": "DT_BF16", "Output Formats": "ND",
        "Runtime avg_seq_len": "513", "Runtime sparse_mode": "3", "Runtime num_heads": "4",
        "Runtime num_key_value_heads": "2", "Runtime input_layout": "TND", "Runtime batch_size": "4",
        "Runtime block_size": "128", "Runtime actual_seq_lengths_values": "1,1,1,1",
        "Runtime actual_seq_lengths_kv_values": "513,513,513,513", "source": "generated",
        CONSUMER_QUERY: ATTENTION_OP}
    assert rows[1]["Runtime actual_seq_lengths_values"] == rows[1]["Runtime actual_seq_lengths_kv_values"] == "64"


def test_reshape_and_cache_rows_carry_their_steps_lengths(laid):
    rows = laid.rows["ReshapeAndCache"]
    assert [(r[INPUT_SHAPES], r[INPUT_DTYPES]) for r in rows] == [
        ("16,32;16,32;2,1,128,2,16;16", "DT_BF16;DT_BF16;DT_BF16;INT64"),
        ("64,32;64,32;2,1,128,2,16;64", "DT_BF16;DT_BF16;DT_BF16;INT64"),
        ("4,32;4,32;2,17,128,2,16;4", "DT_BF16;DT_BF16;DT_BF16;INT64"),
        ("2,32;2,32;2,16,128,2,16;2", "DT_BF16;DT_BF16;DT_BF16;INT64")]
    assert {k: v for k, v in rows[3].items() if k.startswith("Runtime") or k.startswith("Output")} == {
        "Output Shapes": "", "Output Data Types": "", "Output Formats": "", "Runtime batch_size": "2",
        "Runtime block_size": "128", "Runtime actual_seq_lengths_values": "1,1",
        "Runtime actual_seq_lengths_kv_values": "1001,1001"}


def test_the_rotary_path_in_the_runners_shapes_bfloat16_and_the_norms_float32_stay_float32(laid):
    index_select = {(r[INPUT_SHAPES], r[INPUT_DTYPES]) for r in laid.rows["index_select"]}
    # The cos/sin cache ([max positions, head_dim]) by each step's positions.
    assert {("512,16;;16", "DT_BF16;;DT_INT64"), ("512,16;;64", "DT_BF16;;DT_INT64"),
            ("512,16;;4", "DT_BF16;;DT_INT64"), ("512,16;;2", "DT_BF16;;DT_INT64")} <= index_select
    cat = {(r[INPUT_SHAPES], r[INPUT_DTYPES], r["Input Strides"]) for r in laid.rows["cat"]}
    # rotate_half of the queries (4 heads) and keys (2 heads) of decode 4 x 512: [1, heads, tokens, head_dim / 2].
    assert ("1,4,4,8;1,4,4,8;", "DT_BF16;DT_BF16;", "128,8,32,1;256,16,64,1;") in cat
    assert ("1,2,4,8;1,2,4,8;", "DT_BF16;DT_BF16;", "64,8,16,1;128,16,32,1;") in cat
    for op in ("pow", "mean", "rsqrt"):
        assert {r[INPUT_DTYPES].split(";")[0] for r in laid.rows[op]} == {"DT_FLOAT"}
    assert {(r[INPUT_DTYPES].split(";")[0], r["Output Data Types"]) for r in laid.rows["_to_copy"]} == {
        ("DT_BF16", "DT_FLOAT"), ("DT_FLOAT", "DT_BF16")}
    assert not any("DT_FLOAT16" in r[INPUT_DTYPES] for rows in laid.rows.values() for r in rows)


def _tensor_slots(call: dict) -> tuple:
    found = []
    for value in [*call["args"], *call["kwargs"].values()]:
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict) and item.get("shape"):
                dtype = AS_RECORDED.get(item["dtype"], item["dtype"])
                found.append((",".join(map(str, item["shape"])), TORCH_TO_PROFILER_DTYPE[dtype]))
    return tuple(sorted(found))


def test_every_query_has_one_row_in_a_deterministic_order(recorded, laid):
    calls = [c for s in recorded.scenarios for c in s.calls if not c["view"] and c["op"].startswith("aten.")]
    expected = {(c["op"], _tensor_slots(c)) for c in calls}
    aten_rows = [r for kernel_type, rows in laid.rows.items() for r in rows
                 if kernel_type not in ("PagedAttention", "ReshapeAndCache")]
    got = [(r[CONSUMER_QUERY], tuple(sorted((shape, dtype) for shape, dtype in zip(
        r[INPUT_SHAPES].split(";"), r[INPUT_DTYPES].split(";")) if shape))) for r in aten_rows]
    assert set(got) == expected and len(got) == len(expected)
    assert (len(laid.rows["PagedAttention"]), len(laid.rows["ReshapeAndCache"])) == (4 + 6, 4)   # + lookup rows
    assert laid.not_laid_out == {} and laid.over_hbm_budget == 0
    assert laid.queries == len(expected) + 8
    again = rows_from_calls(recorded, "CPU")
    assert again.rows == laid.rows and list(again.rows) == list(laid.rows)
    reversed_order = rows_from_calls(recorded.scenarios[::-1], "CPU")
    assert sorted(map(str, (sorted(r.items()) for rows in reversed_order.rows.values() for r in rows))) == sorted(
        map(str, (sorted(r.items()) for rows in laid.rows.values() for r in rows)))


def test_msmodelings_own_data_source_answers_each_paged_and_rotary_call_exact(recorded, laid, tmp_path):
    """A database of these rows, in the runtime's text (the database build's runtime_row), answers every recorded
    tensor_cast.attention, reshape_and_cache and rotary index_select / cat call from the row laid for it."""
    from opperf.consumer.runtime import runtime_row

    ops = {"PagedAttention": ATTENTION_OP, "ReshapeAndCache": CACHE_WRITE_OP,
           "index_select": "aten.index_select.default", "cat": "aten.cat.default"}
    latency = {}
    for number, kernel_type in enumerate(ops):
        rows = []
        for index, row in enumerate(laid.rows[kernel_type]):
            latency[(kernel_type, row[INPUT_SHAPES], row.get("Runtime actual_seq_lengths_kv_values"))] = (
                duration := float(100 * number + index + 1))
            rows.append({**runtime_row(row, "cpu"), REPLAY_AVERAGE: str(duration)})
        with open(tmp_path / f"{kernel_type}.csv", "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, order_columns([c for r in rows for c in r]))
            writer.writeheader()
            writer.writerows(rows)
    (tmp_path / "op_mapping.yaml").write_text(
        "operator_mappings:\n"
        f"  {ATTENTION_OP}: {{kernel_type: PagedAttention, query_mode: attention_special}}\n"
        f"  {CACHE_WRITE_OP}: {{kernel_type: ReshapeAndCache}}\n"
        "  aten.index_select.default: {kernel_type: index_select}\n"
        "  aten.cat.default: {kernel_type: cat}\n"
        "query_selection_policy: {kernel_overrides: {PagedAttention: {require_semantic_unique: true}}}\n")
    asked = [(s, c) for s in recorded.scenarios for c in s.calls if c["op"] in ops.values()]
    answers = ask_msmodeling(INSTALL, tmp_path, [c for _, c in asked], timeout_s=600)
    # per step: attention, cache write, rotate_half's cat of the queries and of the keys, the rotary index_select
    # (and a prefill's index_select of its last token for the head)
    assert len(answers) == len(asked) == 4 + 4 + 4 * 2 + 4 + 2
    by_row = {ATTENTION_OP: "PagedAttention", CACHE_WRITE_OP: "ReshapeAndCache"}
    for (scenario, call), answer in zip(asked, answers):
        assert answer["exact"] is not None and answer["source"] == "MEASURED", (scenario.name, call["op"], answer)
        if call["op"] in by_row:
            row = next(r for r in laid.rows[by_row[call["op"]]] if r[INPUT_SHAPES].split(";")[0] == ",".join(
                map(str, call["args"][0]["shape"])))
            key = (by_row[call["op"]], row[INPUT_SHAPES], row["Runtime actual_seq_lengths_kv_values"])
            assert answer["exact"] == latency[key], (scenario.name, call["op"])


def test_a_space_of_config_scenarios_yaml_is_its_points():
    space = load_scenario_space(REPO / "config" / "scenarios.yaml", "default")
    texts = scenario_texts(space)
    assert texts[:3] == ["prefill:1", "prefill:2", "prefill:4"] and texts[17] == "prefill:8192"
    assert texts[18:20] == ["decode:1x1024", "decode:2x1024"] and texts[-1] == "decode:64x4096"
    assert len(texts) == 18 + 9 * 2


@pytest.mark.parametrize("scenarios, extra, message", [
    (["prefill:16", "decode:4"], (), "scenarios.*not a scenario: 'decode:4'"),
    (["prefill:16", "prefill:16"], (), "scenario prefill:16 is given twice"),
    (["prefill:16"], ("--num-hidden-layers-override", "4"), "--num-hidden-layers-override is set by "
                                                             "record_model_queries itself"),
    (["prefill:16"], ("--decode",), "--decode is set by record_model_queries itself"),
])
def test_bad_scenarios_and_arguments_are_refused_before_msmodeling_runs(scenarios, extra, message):
    with pytest.raises(OpperfError, match=message):
        record_model_queries(INSTALL, TINY_DENSE, scenarios, extra_args=extra)


def test_the_recorder_refuses_a_scenario_option_among_the_shared_ones(tmp_path):
    done = subprocess.run([INSTALL.python, str(RECORDER), str(INSTALL.directory), "--output", str(tmp_path / "q.json"),
                           "--scenario", "prefill:8", "--", str(tmp_path), "--decode"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and not (tmp_path / "q.json").exists()
    assert done.stderr.strip() == ("msmodeling_record.py: --decode is set by each --scenario, not among the shared "
                                   "options")


def test_lookup_attention_calls_are_laid_as_the_runner_lays_its_own(recorded, config):
    """attention_call rebuilds each recorded call from another of the model's (the cache's block count and block
    table are the runner's, at block boundaries too: a 127-token context fills a 128-token block with the new
    token, and the runner keeps a slot for one more)."""
    edges = record_model_queries(INSTALL, config, ["decode:1x127", "decode:3x128", "prefill:128",
                                                              "prefill:129"], layers=1, timeout_s=600)
    calls = [c for s in [*recorded.scenarios, *edges.scenarios] for c in calls_of(s, ATTENTION_OP)]
    template = calls[0]
    for call in calls:
        made = attention_call(template, call["args"][6]["values"], call["args"][7]["values"])
        assert (made["args"], made["out"]) == (call["args"], call["out"])
    # Between the recorded points: every 16 prefill tokens up to the longest, every batch at each context.
    laid = lookup_attention_calls(calls_of(recorded.scenarios[0], ATTENTION_OP)
                                  + calls_of(recorded.scenarios[2], ATTENTION_OP))
    assert [(c["args"][6]["values"], c["args"][7]["values"]) for c in laid] == [([16], [16]), ([513] * 4, [1] * 4)]
