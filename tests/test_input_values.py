"""Input values a trace cannot record (opperf.input_values): recorded while the workload runs, joined to the trace's
calls by the parse, cycled through by replay. The fixture is a real H100 profile of tiny_qwen2_moe (1 layer,
prefill 8 and 24, an 8-token context and one decode step) with the input_values.json its first warm-up recorded."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import REPO
from opperf import contract
from opperf.errors import OpperfError
from opperf.input_values import merge_calls, slot_calls, variant_cycle
from opperf.workload.values import ValueRecorder

FIXTURE = REPO / "tests" / "data" / "parse" / "cuda_tiny_qwen2_moe"


def test_the_recorder_keeps_splits_and_histograms_with_their_shapes():
    ids = torch.tensor([0, 1, 1, 3, 3, 3, 2, 0])
    with ValueRecorder() as recorder:
        torch.bincount(ids, minlength=4)
        torch.histc(ids.float(), bins=4, min=0, max=3)
        torch.histc(ids.float(), bins=4)            # the data's own range: not recorded
        torch._grouped_mm(torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(2, 16, 8, dtype=torch.bfloat16),
                          offs=torch.tensor([3, 8], dtype=torch.int32))
        torch.add(ids, 1)                           # no recorded argument
    assert recorder.calls == [
        {"op": "bincount", "shapes": [[8], [], []], "slots": {"0": "2 2 1 3"}},
        {"op": "histc", "shapes": [[8], [], [], []], "slots": {"0": "2 2 1 3"}},
        {"op": "_grouped_mm", "shapes": [[8, 16], [2, 16, 8], [2], [], []], "slots": {"2": "3 8"}},
    ]


def test_the_recorder_keeps_the_members_of_lists_longer_than_the_profiler_records():
    kept = [torch.randn(1, 4, dtype=torch.bfloat16) for _ in range(31)]
    with ValueRecorder() as recorder:
        torch.cat(kept[:30])                        # the profiler records 30 members itself
        torch.cat([kept[0].t(), *kept[1:]][:1] + [k.reshape(4, 1) for k in kept[1:]], dim=1)
    assert recorder.calls == [{"op": "cat", "shapes": [[], []], "slots": {}, "lists": {"0": {
        "shapes": [[4, 1]] * 31, "strides": [[1, 4]] + [[1, 1]] * 30, "dtype": "bfloat16"}}}]


def test_a_value_the_recorder_cannot_read_leaves_the_call_alone(monkeypatch):
    def unreadable(*_):
        raise RuntimeError("no host copy")

    recorder = ValueRecorder()
    monkeypatch.setattr(recorder, "_record", unreadable)
    with recorder:
        counts = torch.bincount(torch.tensor([0, 2, 2]))
    assert counts.tolist() == [1, 0, 2] and not recorder.calls
    assert recorder.failed == {"bincount": "RuntimeError: no host copy"}


def test_a_row_keeps_its_distinct_calls_with_their_counts():
    assert merge_calls([";;3 8;;", ";;3 8;;", ";;2 8;;", "", ";;3 8;;"]) == ";;3 8*3|2 8*1;;"
    cell = ";;3 8*4|2 8*2;;"
    assert slot_calls(cell, 2) == [([3, 8], 4), ([2, 8], 2)]
    assert slot_calls(cell, 0) == [] and slot_calls(cell, 7) == []
    # Each call's share of the timed calls is its share of the row's calls.
    assert variant_cycle(slot_calls(cell, 2)) == [[3, 8], [3, 8], [2, 8]]
    # Past a limit (the device memory the variants may take), the cycle keeps calls spread over the row's.
    assert variant_cycle([([1], 1), ([2], 1), ([3], 1), ([4], 1)], limit=2) == [[1], [3]]
    with pytest.raises(OpperfError, match=r"slot 2 entry '3 8' is not `values\*calls`"):
        slot_calls(";;3 8;;", 2)
    with pytest.raises(OpperfError, match="is not a list of integers"):
        slot_calls(";;3 x*2;;", 2)


@pytest.fixture(scope="module")
def parsed(tmp_path_factory):
    database = tmp_path_factory.mktemp("values") / "db"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "parse_kernel_details.py"), "--profiling-path",
                           str(FIXTURE / "trace.json.gz"), "--database-path", str(database)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "input values of 80 calls from input_values.json" in done.stderr
    return database


def _rows(database, kernel_type):
    with open(database / f"{kernel_type}.csv", newline="") as handle:
        return {row["Input Shapes"]: row for row in csv.DictReader(handle)}


def test_the_parse_gives_each_row_its_calls_values(parsed):
    grouped = _rows(parsed, "_grouped_mm")
    # The 8-token prefill and the decode context's 8-token prefill, two layers each: one row, four splits.
    assert grouped["24,64;6,64,64;6;;"][contract.PROFILING_INPUT_VALUES] == (
        ";;5 10 13 19 22 24*1|5 7 11 15 23 24*1|5 8 13 18 22 24*1|4 8 10 14 21 24*1;;")
    assert grouped["72,32;6,32,64;6;;"][contract.PROFILING_INPUT_VALUES] == ";;11 25 42 52 57 72*1|15 19 37 46 65 72*1;;"
    assert grouped["3,64;6,64,64;6;;"][contract.PROFILING_INPUT_VALUES] == ";;1 1 2 2 3 3*1|0 0 1 2 3 3*1;;"
    histc = _rows(parsed, "histc")
    assert histc["24;;;"][contract.PROFILING_INPUT_VALUES] == "5 5 3 6 3 2*1|5 2 4 4 8 1*1|5 3 5 5 4 2*1|4 4 2 4 7 3*1;;;"
    # transformers' sentinel masks, all False: the trace's masked_fill_ kernels (12 of them run by masked_fill, the
    # call the recorder sees) each got their call's count.
    masks = _rows(parsed, "masked_fill_")
    assert {shapes: row[contract.PROFILING_INPUT_VALUES] for shapes, row in masks.items()} == {
        "24,64;24,1;": ";0*12;", "72,64;72,1;": ";0*6;", "3,64;3,1;": ";0*6;"}
    # The dispatch reads every token (the 8-token prefill's 8 rows, 3 times each), then restores the order with
    # permutations: index through them, and index_put_ (the trace's _index_put_impl_) building the inverse.
    index = _rows(parsed, "index")
    assert index["8,64;24"][contract.PROFILING_INPUT_VALUES] == ";8*4"
    assert index["24,64;72"][contract.PROFILING_INPUT_VALUES] == ";24*2"
    assert index["72,64;72"][contract.PROFILING_INPUT_VALUES] == ";72*2"
    assert _rows(parsed, "_index_put_impl_")["72;72;72;;"][contract.PROFILING_INPUT_VALUES] == ";72*2;;;"
    assert contract.PROFILING_INPUT_VALUES not in next(iter(_rows(parsed, "mm").values()))


def test_a_trace_without_recorded_values_parses_as_before(tmp_path):
    shutil.copy(FIXTURE / "trace.json.gz", tmp_path / "trace.json.gz")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "parse_kernel_details.py"), "--profiling-path",
                           str(tmp_path / "trace.json.gz"), "--database-path", str(tmp_path / "db")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert contract.PROFILING_INPUT_VALUES not in next(iter(_rows(tmp_path / "db", "_grouped_mm").values()))


def test_a_bad_values_file_is_named(tmp_path):
    shutil.copy(FIXTURE / "trace.json.gz", tmp_path / "trace.json.gz")
    (tmp_path / "input_values.json").write_text('{"version": 1, "calls": [{"op": "histc"}]}')
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "parse_kernel_details.py"), "--profiling-path",
                           str(tmp_path / "trace.json.gz"), "--database-path", str(tmp_path / "db")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and not (tmp_path / "db").exists()
    assert "input_values.json" in done.stderr and "call 0 lacks op, shapes or slots" in done.stderr


def _prepared(row, kernel_type):
    from opperf.replay.engine import prepare_row
    from opperf.replay.job import recipe_for
    from opperf.replay.timing import CpuProfilerTimer

    timer = CpuProfilerTimer()
    prepared = prepare_row(recipe_for(kernel_type, "cpu", None), row, backend="cpu", device="cpu", timer=timer)
    assert prepared.case is not None, getattr(prepared, "error", "")
    return prepared, timer


def test_replay_cycles_through_the_recorded_splits(parsed):
    prepared, timer = _prepared(_rows(parsed, "_grouped_mm")["24,64;6,64,64;6;;"], "_grouped_mm")
    assert prepared.recipe == ("schema aten::_grouped_mm.default; 1 input(s) with the workload's recorded values, "
                               "4 call(s) cycled")
    offsets = prepared.case.args[2]
    seen = [offsets.tolist()]
    for _ in range(7):
        prepared.case.next_values()
        seen.append(offsets.tolist())
    assert seen == [[5, 10, 13, 19, 22, 24], [5, 7, 11, 15, 23, 24], [5, 8, 13, 18, 22, 24], [4, 8, 10, 14, 21, 24]] * 2
    timer.measure(prepared.case, 0, 4, "row")
    assert len(timer.collect()["row"].samples_us) == 4


@pytest.mark.parametrize("dtype", [torch.int32, torch.float32])
def test_replay_rebuilds_a_histogram_input_with_its_recorded_counts(parsed, dtype):
    # The workload's histc ran over int32 expert ids (CUDA takes them; the CPU kernel does not, so the tensor is
    # checked here, not the call); a float input gets each bin's centre.
    from opperf.replay.inputs import BuildContext
    from opperf.replay.job import recipe_for

    row = _rows(parsed, "histc")["24;;;"]
    ctx = BuildContext(recipe_for("histc", "cpu", None), row, "cpu")
    values = ctx.recorded_input(0, (24,), dtype, "histc")
    assert values.dtype == dtype and len(ctx.value_variants) == 1
    counts = [torch.histc(variant.float(), bins=6, min=0, max=5).int().tolist() for variant in ctx.value_variants[0][1]]
    assert counts == [[5, 5, 3, 6, 3, 2], [5, 2, 4, 4, 8, 1], [5, 3, 5, 5, 4, 2], [4, 4, 2, 4, 7, 3]]
    # Six bins over [0, 2] are a third wide: the second holds no integer but counted ids, so the recorded values
    # cannot be rebuilt for an int32 input and the balanced draw stays.
    # So can counts of another number of bins than the row's.
    for scalars in (";6;0;2", ";5;0;5"):
        other = dict(row, **{"Input Scalars": scalars})
        assert BuildContext(recipe_for("histc", "cpu", None), other, "cpu").recorded_input(0, (24,), torch.int32,
                                                                                          "histc") is None


def test_a_defined_op_takes_recorded_ids_too():
    from opperf.replay.definitions import DEFAULT_DEFINITIONS_DIR, load_definition
    from opperf.replay.engine import prepare_row
    from opperf.replay.timing import CpuProfilerTimer

    row = {"Input Shapes": "8;;", "Input Data Types": "DT_INT64;;", "Input Formats": "ND;;", "Output Shapes": "4",
           "Output Data Types": "DT_INT64", "Output Formats": "ND", "Input Scalars": ";;4",
           contract.PROFILING_INPUT_VALUES: "2 2 1 3*2;;"}
    definition = load_definition(DEFAULT_DEFINITIONS_DIR / "torch" / "bincount.yaml")
    prepared = prepare_row(definition, row, backend="cpu", device="cpu", timer=CpuProfilerTimer())
    assert prepared.recipe.endswith("1 input(s) with the workload's recorded values, 1 call(s) cycled")
    assert torch.bincount(prepared.case.args[0]).tolist() == [2, 2, 1, 3]


def test_values_that_do_not_fit_the_row_fall_back_to_the_balanced_draw(parsed):
    row = dict(_rows(parsed, "_grouped_mm")["24,64;6,64,64;6;;"])
    for cell in (";;5 8 24*1;;",                       # 3 offsets for 6 experts
                 ";;5 8 8 11 16 30*1;;",               # past the 24 routed rows: out of bounds
                 ";;5 8 4 11 16 24*1;;"):              # decreasing
        row[contract.PROFILING_INPUT_VALUES] = cell
        prepared, _ = _prepared(row, "_grouped_mm")
        assert not prepared.case.value_variants and "recorded" not in prepared.recipe
        assert prepared.case.args[2].tolist()[-1] == 24


def test_input_copies_cycle_through_the_recorded_splits_too(parsed):
    from opperf.replay.timing import _clone_case

    prepared, _ = _prepared(_rows(parsed, "_grouped_mm")["24,64;6,64,64;6;;"], "_grouped_mm")
    copy = _clone_case(prepared.case, {id(prepared.case.args[2])})
    offsets = copy.args[2]
    assert offsets is not prepared.case.args[2] and copy.value_variants[0][0] is offsets
    copy.next_values()
    assert offsets.tolist() == [5, 7, 11, 15, 23, 24]


def test_the_recorder_counts_the_true_elements_of_a_select_mask():
    x = torch.randn(6, 4)
    sentinel = torch.zeros(6, 1, dtype=torch.bool)
    one_row = sentinel.clone()
    one_row[2] = True
    with ValueRecorder() as recorder:
        x.masked_fill(one_row, 0.0)                 # out of place: the trace's kernel is its masked_fill_
        x.masked_fill_(sentinel, 1.0)
        torch.where(x > 0.5, x, torch.zeros_like(x))
        torch.masked_select(x, x > 0.5)
    positive = int((x > 0.5).sum())
    assert recorder.calls == [
        {"op": "masked_fill", "shapes": [[6, 4], [6, 1], []], "slots": {"1": "1"}},
        {"op": "masked_fill_", "shapes": [[6, 4], [6, 1], []], "slots": {"1": "0"}},
        {"op": "where", "shapes": [[6, 4], [6, 4], [6, 4]], "slots": {"0": str(positive)}},
        {"op": "masked_select", "shapes": [[6, 4], [6, 4]], "slots": {"1": str(positive)}},
    ]


def test_an_in_place_trace_call_takes_the_values_of_its_out_of_place_call():
    from opperf.input_values import RecordedValues, shapes_key

    recorded = RecordedValues({shapes_key("masked_fill", [[6, 4], [6, 1], []]): [{1: "1"}, {1: "0"}]})
    cells = [recorded.next_call("masked_fill_", [[6, 4], [6, 1], []], 3) for _ in range(3)]
    assert cells == [";1;", ";0;", ";1;"]
    assert recorded.next_call("masked_fill_", [[6, 4], [7, 1], []], 3) is None


MASK_ROW = {"Input Shapes": "6,4;6,1;", "Input Data Types": "DT_FLOAT;DT_BOOL;", "Input Formats": "ND;ND;",
            "Output Shapes": "6,4", "Output Data Types": "DT_FLOAT", "Output Formats": "ND", "Input Scalars": ";;0."}


@pytest.mark.parametrize(("cell", "trues"), [(";0*3;", [0]), (";6*1;", [6]), (";2*1|0*1;", [2, 0])])
def test_replay_builds_masks_with_the_recorded_number_of_true_elements(cell, trues):
    prepared, _ = _prepared(dict(MASK_ROW, **{contract.PROFILING_INPUT_VALUES: cell}), "masked_fill_")
    assert prepared.recipe.startswith("schema aten::masked_fill_.Scalar")
    assert prepared.recipe.endswith(f"1 input(s) with the workload's recorded values, {len(trues)} call(s) cycled")
    mask = prepared.case.args[1]
    seen = []
    for _ in trues:
        seen.append(int(mask.sum()))
        prepared.case.next_values()
    assert mask.dtype == torch.bool and seen == trues


def test_a_mask_count_past_the_mask_keeps_the_random_draw():
    prepared, _ = _prepared(dict(MASK_ROW, **{contract.PROFILING_INPUT_VALUES: ";7*1;"}), "masked_fill_")
    assert "recorded" not in prepared.recipe and not prepared.case.value_variants


def test_the_recorder_counts_the_distinct_rows_an_index_reads():
    x = torch.randn(8, 4)
    permutation = torch.randperm(8)
    with ValueRecorder() as recorder:
        x[permutation]                              # a MoE layer restoring its token order: every row once
        x[torch.tensor([0, 0, 1, 1, 2, 2])]         # each token twice (top-2)
        torch.zeros(8)[permutation] = torch.arange(8.0)
        x[:, torch.tensor([1, 2])]                  # the list's first member is None: not recorded
    assert recorder.calls == [
        {"op": "index", "shapes": [[8, 4], []], "slots": {"1": "8"}},
        {"op": "index", "shapes": [[8, 4], []], "slots": {"1": "3"}},
        {"op": "index_put_", "shapes": [[8], [], [8], []], "slots": {"1": "8"}},
    ]
    from opperf.input_values import RecordedValues, shapes_key

    # The trace gives index_put_'s kernel to the _index_put_impl_ inside it.
    recorded = RecordedValues({shapes_key("index_put_", [[8], [], [8], []]): [{1: "8"}]})
    assert recorded.next_call("_index_put_impl_", [[8], [], [8], [], []], 5) == ";8;;;"


def test_an_embedding_records_the_distinct_rows_of_the_index_select_inside_it(tmp_path):
    """The mode sees embedding whole; the trace's row is the index_select inside it (every transformers model's
    token embedding): the recorder files the lookup under index_select with the flattened ids, and the parse's
    lookup by the trace's Input Dims finds it."""
    from opperf.input_values import RecordedValues

    weight = torch.randn(16, 4)
    with ValueRecorder() as recorder:
        torch.nn.functional.embedding(torch.tensor([[1, 1, 2], [3, 1, 2]]), weight)
    assert recorder.calls == [{"op": "index_select", "shapes": [[16, 4], [], [6]], "slots": {"2": "3"}}]
    recorder.write(tmp_path)
    recorded = RecordedValues.beside(tmp_path / "trace.json")
    assert recorded.next_call("index_select", [[16, 4], [], [6]], 3) == ";;3"


INDEX_ROW = {"Input Shapes": "4096,64;4096", "Input Data Types": "DT_FLOAT;DT_INT64", "Input Formats": "ND;ND",
             "Output Shapes": "4096,64", "Output Data Types": "DT_FLOAT", "Output Formats": "ND"}


@pytest.mark.parametrize("distinct", [4096, 1024])
def test_replay_builds_an_index_with_the_recorded_number_of_distinct_rows(distinct):
    row = dict(INDEX_ROW, **{contract.PROFILING_INPUT_VALUES: f";{distinct}*2"})
    prepared, _ = _prepared(row, "index")
    assert prepared.recipe.endswith("1 input(s) with the workload's recorded values, 1 call(s) cycled")
    index = prepared.case.args[1][0]
    assert index.shape == (4096,) and int(index.max()) < 4096 and torch.unique(index).numel() == distinct
    # Without the column, replay draws with replacement: about 63 % of the rows.
    drawn = _prepared(INDEX_ROW, "index")[0].case.args[1][0]
    assert 0.55 < torch.unique(drawn).numel() / 4096 < 0.7


def test_defined_index_ops_take_the_recorded_number_of_distinct_rows():
    # The reference decoder's MoE: index_select through `order` (a permutation), index_add_ through `tokens`.
    hidden, order = torch.randn(16, 8), torch.randperm(16)
    with ValueRecorder() as recorder:
        hidden.index_select(0, order)
        torch.zeros(4, 8).index_add_(0, order // 4, hidden)
    assert recorder.calls == [
        {"op": "index_select", "shapes": [[16, 8], [], [16]], "slots": {"2": "16"}},
        {"op": "index_add_", "shapes": [[4, 8], [], [16], [16, 8], []], "slots": {"2": "4"}},
    ]
    from opperf.replay.definitions import DEFAULT_DEFINITIONS_DIR, load_definition
    from opperf.replay.engine import prepare_row
    from opperf.replay.timing import CpuProfilerTimer

    row = {"Input Shapes": "4096,64;;4096", "Input Data Types": "DT_FLOAT;;DT_INT64", "Input Formats": "ND;;ND",
           "Output Shapes": "4096,64", "Output Data Types": "DT_FLOAT", "Output Formats": "ND", "Input Scalars": ";0;",
           contract.PROFILING_INPUT_VALUES: ";;4096*3"}
    definition = load_definition(DEFAULT_DEFINITIONS_DIR / "torch" / "index_select.yaml")
    prepared = prepare_row(definition, row, backend="cpu", device="cpu", timer=CpuProfilerTimer())
    assert prepared.recipe.endswith("1 input(s) with the workload's recorded values, 1 call(s) cycled")
    assert sorted(prepared.case.args[2].tolist()) == list(range(4096))


def test_the_parse_gives_each_cuda_row_the_mean_idle_before_its_calls(parsed):
    """The rotary embedding's cat of prefill ran once, after the GPU had idled 163.876 µs behind the host
    (tests/test_power_state.py has the per-call values)."""
    assert float(_rows(parsed, "cat")["1,24,8;1,24,8;"][contract.PROFILED_IDLE_BEFORE]) == 163.876


class _NoWait:
    """prepare_row's timer on the CPU: nothing to wait for."""

    def synchronize(self):
        return None


def _profile_cats(directory, record: bool):
    """A real CPU profile of three cats: 40 tensors twice (more than torch.profiler records the shapes of), 3 once;
    with `record`, the recorder's pass beside it, as scripts/profile_workload.py writes it."""
    from torch.profiler import ProfilerActivity, profile

    members = [torch.randn(i % 5 + 1, 8) for i in range(40)]
    small = [torch.randn(2, 8) for _ in range(3)]

    def run():
        torch.cat(members, 0)
        torch.cat(small, 0)
        torch.cat(members[::-1], 1 - 1)

    if record:
        with ValueRecorder() as recorder:
            run()
        recorder.write(directory)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as profiler:
        run()
    profiler.export_chrome_trace(str(directory / "trace.json"))
    return directory / "trace.json"


def test_a_list_longer_than_the_profiler_records_takes_its_members_from_the_recorder(tmp_path):
    """torch.profiler keeps the member shapes of a TensorList of at most 30 tensors; a MoE layer's cat of 128
    experts' outputs has none in the trace (the reference decoder's `moe`: one row, 1.8 % of its device time, that
    replay could not build). The recorder keeps them and the parse fills them in, call by call."""
    from opperf.parse.torch_trace import LIST_SHAPES_FROM_VALUES, convert_trace
    from opperf.replay.definitions import DEFAULT_DEFINITIONS_DIR
    from opperf.replay.engine import PreparedRow, prepare_row
    from opperf.replay.job import find_definition, recipe_for

    conversion = convert_trace(_profile_cats(tmp_path, record=True))
    first, small, reversed_ = conversion.rows
    sizes = [i % 5 + 1 for i in range(40)]
    assert first[contract.INPUT_SHAPES] == "".join(f"{n},8;" for n in sizes)
    assert first[contract.INPUT_DTYPES] == "DT_FLOAT;" * 40 and first[contract.OUTPUT_SHAPES] == "120,8"
    assert first[contract.INPUT_SCALARS] == ";" * 40 + "0"
    assert reversed_[contract.INPUT_SHAPES] == "".join(f"{n},8;" for n in reversed(sizes))
    assert small[contract.INPUT_SHAPES] == "2,8;2,8;2,8;"                     # the profiler's own record
    assert conversion.outcomes[LIST_SHAPES_FROM_VALUES] == 2

    definition = recipe_for("cat", "cpu", find_definition("cat", "cpu", DEFAULT_DEFINITIONS_DIR))
    prepared = prepare_row(definition, first, backend="cpu", device="cpu", timer=_NoWait())
    assert isinstance(prepared, PreparedRow) and [t.shape[0] for t in prepared.case.args[0]] == sizes


def test_a_long_list_no_recorder_kept_is_a_warning_and_a_row_replay_names(tmp_path, caplog):
    import logging

    from opperf.parse.torch_trace import LIST_SHAPES_NOT_RECORDED, convert_trace, read_torch_trace
    from opperf.replay.definitions import DEFAULT_DEFINITIONS_DIR
    from opperf.replay.engine import prepare_row
    from opperf.replay.job import find_definition, recipe_for

    trace = _profile_cats(tmp_path, record=False)
    with caplog.at_level(logging.WARNING, logger="opperf"):
        read_torch_trace(trace)
    assert f"2 op events: {LIST_SHAPES_NOT_RECORDED}" in caplog.text
    row = convert_trace(trace).rows[0]
    assert row[contract.INPUT_SHAPES] == "" and row[contract.INPUT_SCALARS] == "0"

    definition = recipe_for("cat", "cpu", find_definition("cat", "cpu", DEFAULT_DEFINITIONS_DIR))
    outcome = prepare_row(definition, row, backend="cpu", device="cpu", timer=_NoWait())
    assert outcome.status == "failed_build"
    assert "a list of at most 30 tensors" in outcome.error and "input_values.json" in outcome.error


def test_a_malformed_recorded_list_names_the_file_and_call(tmp_path):
    from opperf.input_values import RecordedValues

    (tmp_path / "input_values.json").write_text(json.dumps({"version": 1, "calls": [
        {"op": "cat", "shapes": [[], []], "slots": {}, "lists": {"0": {"shapes": [[1, 8]], "strides": [[8, 1]],
                                                                       "dtype": "float32"}}},
        {"op": "cat", "shapes": [[], []], "slots": {}, "lists": {"0": {"shapes": [[1, 8]], "strides": [],
                                                                       "dtype": "float32"}}}]}))
    with pytest.raises(OpperfError, match=r"input_values.json, field 'calls\[1\]': call 1 .* malformed list "
                                          r"\(shapes and strides do not match\)"):
        RecordedValues.beside(tmp_path / "trace.json")
