"""TensorCast's paged-cache ops as kernel types: rows of `PagedAttention` and `ReshapeAndCache` (the calls
msmodeling's runner issues for a tiny dense model: 4 heads, 2 KV heads, head_dim 16, blocks of 128) replay on the
cpu through their definitions, build into a database, and msmodeling's own data sources answer the runner's calls
from those rows exactly, with the replayed durations."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from opperf import contract
from opperf.consumer.msmodeling_env import find_msmodeling
from opperf.consumer.msmodeling_queries import ask_msmodeling
from opperf.replay.definitions import DEFAULT_DEFINITIONS_DIR, load_definition
from opperf.replay.engine import STATUS_FAILED_BUILD, STATUS_OK, plan_work, replay_row
from opperf.replay.inputs import build_case
from opperf.replay.timing import CpuProfilerTimer
from opperf.versions import cpu_version_dir

REPO = Path(__file__).resolve().parent.parent
DEFINITIONS = DEFAULT_DEFINITIONS_DIR / "torch"
HEADS, KV_HEADS, HEAD_DIM, BLOCK = 4, 2, 16, 128
SEQ_LENS, QUERY_LENS = "Runtime actual_seq_lengths_kv_values", "Runtime actual_seq_lengths_values"


def attention_row(seq_lens: list[int], query_lens: list[int], blocks: int) -> dict[str, str]:
    """A PagedAttention row as laid for msmodeling's call (docs/replay.md, "TensorCast's paged-cache ops")."""
    batch, tokens, width = len(seq_lens), sum(query_lens), -(-max(seq_lens) // BLOCK)
    cache = f"{blocks},{BLOCK},{KV_HEADS},{HEAD_DIM}"
    return {contract.OP_STATE: "dynamic", contract.ACCELERATOR_CORE: "CPU",
            contract.INPUT_SHAPES: f"{tokens},{HEADS * HEAD_DIM};{cache};{cache};;{batch},{width};{batch + 1};{batch};"
                                   f"{batch}",
            contract.INPUT_DTYPES: "DT_BF16;DT_BF16;DT_BF16;;INT64;INT64;INT64;INT64",
            contract.INPUT_FORMATS: "ND;ND;ND;;ND;ND;ND;ND",
            contract.OUTPUT_SHAPES: f"{tokens},{HEADS * HEAD_DIM}", contract.OUTPUT_DTYPES: "DT_BF16",
            contract.OUTPUT_FORMATS: "ND",
            "Runtime avg_seq_len": str(sum(seq_lens) // batch), "Runtime sparse_mode": "3",
            "Runtime num_heads": str(HEADS), "Runtime num_key_value_heads": str(KV_HEADS), "Runtime input_layout": "TND",
            "Runtime batch_size": str(batch), "Runtime block_size": str(BLOCK),
            QUERY_LENS: ",".join(map(str, query_lens)), SEQ_LENS: ",".join(map(str, seq_lens))}


def cache_write_row(tokens: int, blocks: int, seq_lens: list[int] | None = None,
                    query_lens: list[int] | None = None) -> dict[str, str]:
    width = KV_HEADS * HEAD_DIM
    row = {contract.OP_STATE: "dynamic", contract.ACCELERATOR_CORE: "CPU",
           contract.INPUT_SHAPES: f"{tokens},{width};{tokens},{width};2,{blocks},{BLOCK},{KV_HEADS},{HEAD_DIM};{tokens}",
           contract.INPUT_DTYPES: "DT_BF16;DT_BF16;DT_BF16;INT64", contract.INPUT_FORMATS: "ND;ND;ND;ND",
           contract.OUTPUT_SHAPES: "", contract.OUTPUT_DTYPES: "", contract.OUTPUT_FORMATS: "",
           "Runtime batch_size": "", "Runtime block_size": str(BLOCK), QUERY_LENS: "", SEQ_LENS: ""}
    if seq_lens is not None:
        row.update({"Runtime batch_size": str(len(seq_lens)), QUERY_LENS: ",".join(map(str, query_lens)),
                    SEQ_LENS: ",".join(map(str, seq_lens))})
    return row


# decode 4 x 512 (msmodeling sizes the cache by tokens: ceil(4 * 513 / 128) = 17 blocks), decode 4 x 519 (every
# shape the same, other lengths), prefill 64; the cache writes of the decode 4 x 512 step and of the prefill.
DECODE, DECODE_519, PREFILL = (attention_row([513] * 4, [1] * 4, 17), attention_row([520] * 4, [1] * 4, 17),
                               attention_row([64], [64], 1))
CACHE_WRITE_DECODE, CACHE_WRITE_PREFILL = cache_write_row(4, 17, [513] * 4, [1] * 4), cache_write_row(64, 1)


def definition(kernel_type: str):
    return load_definition(DEFINITIONS / f"{kernel_type}.yaml")


def test_the_rows_become_the_runners_calls_with_each_sequence_in_blocks_of_its_own():
    case = build_case(definition("PagedAttention"), DECODE, "cpu")
    kwargs = case.kwargs
    assert kwargs["query"].shape == (4, 64) and str(kwargs["query"].dtype) == "torch.bfloat16"
    assert kwargs["seq_lens"].tolist() == [513] * 4 and kwargs["query_lens"].tolist() == [1] * 4
    assert kwargs["query_start_loc"].tolist() == [0, 1, 2, 3, 4]
    # 5 blocks a sequence: 20 > the 17 recorded, and the recipe says so
    assert kwargs["block_table"].tolist() == [list(range(5 * s, 5 * s + 5)) for s in range(4)]
    assert kwargs["key_cache"].shape == kwargs["value_cache"].shape == (20, BLOCK, KV_HEADS, HEAD_DIM)
    assert case.recipe == ("definition config/kernels/torch/PagedAttention.yaml; block table and slots laid as a "
                           "serving engine lays them (msmodeling records them without values): each sequence its own "
                           "5 consecutive blocks of 128, its new tokens after its context, the cache grown from the "
                           "recorded 17 to 20 blocks to hold them")
    # decode reads context written in earlier steps: the caches are cold, with storages of their own to copy
    warm = {id(t) for t in case.warm}
    assert id(kwargs["query"]) in warm and not {id(kwargs["key_cache"]), id(kwargs["value_cache"])} & warm
    assert kwargs["key_cache"].untyped_storage().data_ptr() != kwargs["value_cache"].untyped_storage().data_ptr()
    prefill = build_case(definition("PagedAttention"), PREFILL, "cpu")
    assert id(prefill.kwargs["key_cache"]) in {id(t) for t in prefill.warm}     # written just before
    # The decode step's new token of sequence s lands at position 512: its 5th block's first slot.
    write = build_case(definition("ReshapeAndCache"), CACHE_WRITE_DECODE, "cpu")
    assert write.kwargs["slot_mapping"].tolist() == [(5 * s + 4) * BLOCK for s in range(4)]
    assert [id(t) for t in write.warm] == [id(write.kwargs[k]) for k in ("key", "value", "slot_mapping")]
    unknown = build_case(definition("ReshapeAndCache"), CACHE_WRITE_PREFILL, "cpu")
    assert unknown.kwargs["slot_mapping"].tolist() == list(range(64))
    assert unknown.recipe.endswith("no Runtime actual_seq_lengths_values: the 64 tokens written to 64 distinct "
                                   "consecutive slots (one sequence's prefill)")


@pytest.mark.parametrize(("kernel_type", "row", "error"), [
    ("PagedAttention", {**DECODE, QUERY_LENS: "1,1,1,2"},
     f"field {QUERY_LENS!r}: query_lens [1, 1, 1, 2] sum to 5 new tokens; Input Shapes' query has 4"),
    ("PagedAttention", {**DECODE, SEQ_LENS: "513,513,513"},
     f"field {SEQ_LENS!r}: seq_lens [513, 513, 513] has 3 lengths; the Input Shapes hold 4 sequences"),
    ("PagedAttention", {**DECODE, SEQ_LENS: "700,700,700,700"},
     f"field {SEQ_LENS!r}: {SEQ_LENS} [700, 700, 700, 700] need 6 blocks of 128; the block table [4, 5] has 5 "
     "columns"),
    ("PagedAttention", {**DECODE, "Runtime avg_seq_len": "512"},
     "field 'Runtime avg_seq_len': Runtime avg_seq_len is 512; the row's Input Shapes and lengths give 513"),
    ("PagedAttention", {**DECODE, SEQ_LENS: ""},
     f"field {SEQ_LENS!r}: the row has no {SEQ_LENS}: the seq_lens values the call ran with (shapes do not carry "
     "them)"),
    ("ReshapeAndCache", {**CACHE_WRITE_DECODE, QUERY_LENS: "2,2,2,2"},
     f"field {QUERY_LENS!r}: query_lens [2, 2, 2, 2] sum to 8 new tokens; Input Shapes' key has 4"),
])
def test_a_row_whose_shapes_disagree_with_its_lengths_is_refused_naming_the_column(kernel_type, row, error):
    outcome = replay_row(definition(kernel_type), row, backend="cpu", device="cpu", timer=CpuProfilerTimer(threads=1),
                         repeat_count=1, warmup_count=1)
    assert (outcome.status, outcome.error) == (STATUS_FAILED_BUILD, error)
    assert contract.REPLAY_AVERAGE not in outcome.columns


def test_two_steps_of_one_shape_at_two_contexts_are_two_calls():
    """Decode 4 x 512 and 4 x 519 share every shape (17 blocks, 5 columns): their lengths tell them apart."""
    assert len(plan_work([DECODE, DECODE_519, {**DECODE, SEQ_LENS: "513, 513, 513, 513"}], "PagedAttention",
                         "all")) == 2
    assert len(plan_work([CACHE_WRITE_DECODE, {**CACHE_WRITE_DECODE, SEQ_LENS: "520,520,520,520"}],
                         "ReshapeAndCache", "all")) == 2


def _run(*command: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, *command], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def replayed_database(root: Path, tables: dict[str, list[dict]]) -> Path:
    """Rows per kernel type replayed on the cpu by scripts/replay.py through their torch definitions, built into a
    database under `root` by scripts/build_database.py."""
    rows, replayed = root / "rows", root / "replayed"
    rows.mkdir()
    for kernel_type, table in tables.items():
        pd.DataFrame(table).to_csv(rows / f"{kernel_type}.csv", index=False)
        _run("scripts/replay.py", "--rows", str(rows / f"{kernel_type}.csv"), "--kernel", kernel_type,
             "--definition", str(DEFINITIONS / f"{kernel_type}.yaml"), "--backend", "cpu", "--version-dir",
             cpu_version_dir(), "--device", "CPU", "--output", str(replayed / f"{kernel_type}.csv"), "--trace-dir",
             str(root / "traces"), "--repeat-count", "5", "--cpu-threads", "1")
    output = root / "db" / cpu_version_dir()
    _run("scripts/build_database.py", "directory", "--rows-dir", str(replayed), "--device", "CPU", "--output",
         str(output))
    return output


@pytest.fixture(scope="module")
def database(tmp_path_factory) -> Path:
    """The rows replayed on the cpu by scripts/replay.py, built into a database by scripts/build_database.py."""
    return replayed_database(tmp_path_factory.mktemp("tensor_cast"),
                             {"PagedAttention": [DECODE, DECODE_519, PREFILL],
                              "ReshapeAndCache": [CACHE_WRITE_DECODE, CACHE_WRITE_PREFILL]})


def _read(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def test_each_row_replays_on_the_cpu_through_its_definition(database):
    for kernel_type, count in (("PagedAttention", 3), ("ReshapeAndCache", 2)):
        rows = _read(database / "layouts" / f"{kernel_type}.csv")
        assert len(rows) == count
        assert rows[contract.REPLAY_STATUS].tolist() == [STATUS_OK] * count, rows[contract.REPLAY_ERROR].tolist()
        assert all(float(d) > 0 for d in rows[contract.REPLAY_AVERAGE])
        assert all(r.startswith(f"definition config/kernels/torch/{kernel_type}.yaml; ")
                   for r in rows[contract.REPLAY_RECIPE])
    # Two decode steps of one shape at two contexts are two calls, each replayed, both kept for the runtime
    attention = _read(database / "PagedAttention.csv")
    assert sorted(attention["Runtime avg_seq_len"]) == ["513", "520", "64"]


def test_op_mapping_maps_tensor_casts_ops_to_them_with_the_runtimes_attention_rules(database):
    document = yaml.safe_load((database / "op_mapping.yaml").read_text())
    mappings = document["operator_mappings"]
    assert mappings["tensor_cast.attention.default"] == {"kernel_type": "PagedAttention", "alternate_kernel_types": [],
                                                         "category": "attention", "query_mode": "attention_special"}
    # The cache write is looked up by its new keys alone (tc_input_count 1), not the cache it writes into.
    assert mappings["tensor_cast.reshape_and_cache.default"] == {"kernel_type": "ReshapeAndCache",
                                                                 "alternate_kernel_types": [], "category": "kv_cache",
                                                                 "tc_input_count": 1}
    assert document["query_selection_policy"] == {"kernel_overrides": {"PagedAttention":
                                                                       {"require_semantic_unique": True}}}


INSTALL = find_msmodeling()
# The runner's calls (msmodeling_record.py's form: float16 tensors on the meta device, lengths with their values).
F16, I64 = "float16", "int64"


def _tensor(shape, dtype=F16, values=None):
    return {"shape": shape, "dtype": dtype, **({"values": values} if values is not None else {})}


def _attention_call(seq_lens, query_lens, blocks):
    batch, tokens, width = len(seq_lens), sum(query_lens), -(-max(seq_lens) // BLOCK)
    starts = [0]
    for count in query_lens:
        starts.append(starts[-1] + count)
    cache = _tensor([blocks, BLOCK, KV_HEADS, HEAD_DIM])
    return {"op": "tensor_cast.attention.default", "kwargs": {}, "out": _tensor([tokens, HEADS * HEAD_DIM]), "args": [
        _tensor([tokens, HEADS * HEAD_DIM]), cache, cache, None, _tensor([batch, width], I64),
        _tensor([batch + 1], I64, starts), _tensor([batch], I64, seq_lens), _tensor([batch], I64, query_lens)]}


def _cache_write_call(tokens, blocks):
    width = KV_HEADS * HEAD_DIM
    return {"op": "tensor_cast.reshape_and_cache.default", "kwargs": {}, "out": None, "args": [
        _tensor([tokens, width]), _tensor([tokens, width]), _tensor([2, blocks, BLOCK, KV_HEADS, HEAD_DIM]),
        _tensor([tokens], I64)]}


@pytest.mark.skipif(INSTALL is None, reason="no msmodeling checkout: set OPPERF_MSMODELING_DIR or lay the pinned copy "
                                            "in ../shared/msmodeling")
def test_msmodeling_answers_the_runners_calls_exactly_with_the_replayed_durations(database):
    calls = [_attention_call([513] * 4, [1] * 4, 17), _attention_call([520] * 4, [1] * 4, 17),
             _attention_call([64], [64], 1), _cache_write_call(4, 17), _cache_write_call(64, 1)]
    answers = ask_msmodeling(INSTALL, database, calls, timeout_s=300)
    layouts = {k: _read(database / "layouts" / f"{k}.csv") for k in ("PagedAttention", "ReshapeAndCache")}
    replayed = [float(d) for d in [*layouts["PagedAttention"][contract.REPLAY_AVERAGE],
                                   *layouts["ReshapeAndCache"][contract.REPLAY_AVERAGE]]]
    assert [a["source"] for a in answers] == ["MEASURED"] * 5, answers
    assert [a["rule"] for a in answers[:3]] == ["attention"] * 3
    assert [a["exact"] for a in answers] == [a["latency_us"] for a in answers] == pytest.approx(replayed, rel=1e-9)
