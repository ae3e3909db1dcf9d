"""The timers' bookkeeping: kernels attributed to the call that launched them, batches of rows per session,
the cache-state plan, and the worker's batching protocol (measured rows get their outcome at collect)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from opperf import contract
from opperf.replay.engine import STATUS_OK
from opperf.replay.inputs import ReplayCase
from opperf.errors import OpperfError
from opperf.replay.isolation import WorkerSettings
from opperf.replay.timing import CacheState, CpuProfilerTimer, range_device_times, storage_bytes_view
from opperf.yaml_files import check_schema

CPU = torch.autograd.DeviceType.CPU
CUDA = torch.autograd.DeviceType.CUDA


@dataclass
class KinetoRecord:
    """The fields of torch's _KinetoEvent that the attribution reads (real sessions need a GPU)."""

    kind: object
    label: str
    start: int
    end: int
    correlation: int
    linked: int = 0

    def device_type(self):
        return self.kind

    def name(self):
        return self.label

    def start_ns(self):
        return self.start

    def end_ns(self):
        return self.end

    def duration_ns(self):
        return self.end - self.start

    def correlation_id(self):
        return self.correlation

    def linked_correlation_id(self):
        return self.linked

    def start_thread_id(self):
        return 1


def test_kernels_count_for_the_call_whose_top_level_op_launched_them():
    prefix = "opperf_replay#"
    events = [
        # call 1 of row token 0: aten::cat launches one kernel itself and copies through a nested copy_
        KinetoRecord(CPU, f"{prefix}0", 100, 200, 1),
        KinetoRecord(CPU, "aten::cat", 110, 190, 2),
        KinetoRecord(CPU, "aten::copy_", 120, 150, 3),
        KinetoRecord(CPU, "cudaLaunchKernel", 125, 130, 90, linked=3),     # runtime call: never a launching op
        KinetoRecord(CUDA, "copy kernel", 1000, 1400, 91, linked=3),         # nested op's kernel: its own row
        KinetoRecord(CUDA, "cat kernel", 1500, 1800, 92, linked=2),
        # between calls: the cache flush, outside any range
        KinetoRecord(CPU, "aten::sum", 210, 220, 4),
        KinetoRecord(CUDA, "flush kernel", 2000, 9000, 93, linked=4),
        # call 2 of token 0 and call 1 of token 1
        KinetoRecord(CPU, f"{prefix}0", 300, 400, 5),
        KinetoRecord(CPU, "aten::cat", 310, 390, 6),
        KinetoRecord(CUDA, "cat kernel", 9500, 9750, 94, linked=6),
        KinetoRecord(CPU, f"{prefix}1", 500, 600, 7),
        KinetoRecord(CPU, "aten::mm", 510, 590, 8),
        KinetoRecord(CUDA, "gemm", 10000, 12000, 95, linked=8),
        KinetoRecord(CUDA, "gemm epilogue", 12000, 12500, 96, linked=8),
    ]
    assert range_device_times(events, prefix) == {0: [0.3, 0.25], 1: [2.5]}


def test_storage_view_spans_exactly_the_bytes_a_strided_input_reads():
    base = torch.arange(64, dtype=torch.float32)
    view = base.as_strided((4, 3), (8, 2), 5)
    bytes_view = storage_bytes_view(view)
    assert bytes_view.dtype == torch.uint8 and bytes_view.numel() == (3 * 8 + 2 * 2 + 1) * 4
    assert bytes_view.data_ptr() == view.data_ptr()
    bytes_view.mul_(1)                       # the insitu touch leaves values unchanged
    assert torch.equal(base, torch.arange(64, dtype=torch.float32))


def test_insitu_plan_touches_warm_inputs_once_and_describes_the_state():
    state = CacheState(torch.device("cpu"), 1 << 20)
    storage = torch.randn(10, 8)
    gate, up = storage[:, :4], storage[:, 4:]                  # two views of one buffer: one touch each
    weight = torch.randn(4, 4)
    case = ReplayCase(fn=torch.add, args=(gate, up, weight), warm=(gate, up))
    cases, views, text = state.plan(case)
    assert cases == [case] and len(views) == 2
    assert text.startswith("insitu: flush (read 2 MiB), then 2 warm input(s)") and "1 cold input(s)" in text
    twice = ReplayCase(fn=torch.cat, args=([gate, gate, weight],), warm=(gate,))    # one tensor, two inputs
    _, views_twice, text_twice = state.plan(twice)
    assert len(views_twice) == 1 and "2 warm input(s)" in text_twice and "1 cold input(s)" in text_twice
    before = storage.clone()
    state.prepare(views)                     # the flush (a read) and the touches run, values unchanged
    assert torch.equal(storage, before)


def test_insitu_warms_a_sparse_slice_element_wise_and_its_tail_by_reuse():
    """A rotary half of a fused QKV output is rewritten element by element, not through the 36x larger span."""
    state = CacheState(torch.device("cpu"), 1 << 20)
    qkv = torch.randn(64, 576, dtype=torch.bfloat16)
    half = qkv[:, 64:80]                                       # 16 of every 576 elements
    weight = torch.randn(16, 16, dtype=torch.bfloat16)
    _, views, text = state.plan(ReplayCase(fn=torch.mm, args=(half, weight), warm=(half,)))
    (view,) = views
    assert view.dtype == torch.int16 and view.shape == half.shape and view.stride() == half.stride()
    assert view.data_ptr() == half.data_ptr() and "1 warm input(s) (0.00 MiB)" in text
    before = qkv.clone()
    state.prepare(views)                                       # the copy from its twin keeps every bit
    assert torch.equal(qkv.view(torch.int16), before.view(torch.int16))
    # By the workload's reuse distance only the last rows stay resident: the tail along the outermost dimension.
    case = ReplayCase(fn=torch.mm, args=(half, weight), warm=(half,))
    case.reuse = {id(half): (2**20 - 512) / 2**20}             # 512 bytes of the cache left: 16 of the 64 rows
    (tail,), _ = state.plan(case)[1:]
    assert tail.shape == (16, 16) and tail.data_ptr() == half[48:].data_ptr()
    # An expanded view (stride 0) and a dense one keep the byte span, as before.
    expanded = torch.randn(1, 16).expand(64, 16)
    assert storage_bytes_view(expanded).dtype == torch.uint8
    _, (flat,), _ = state.plan(ReplayCase(fn=torch.add, args=(expanded, weight[:1]), warm=(expanded,)))
    assert flat.dtype == torch.uint8 and flat.numel() == 16 * 4


def test_cpu_timer_collects_every_measured_key_once():
    timer = CpuProfilerTimer(threads=1)
    case = ReplayCase(fn=torch.add, args=(torch.ones(4), torch.ones(4)))
    timer.measure(case, 1, 3, "a")
    timer.measure(case, 1, 2, "b")
    results = timer.collect()
    assert sorted(results) == ["a", "b"] and len(results["a"].samples_us) == 3 and len(results["b"].samples_us) == 2
    assert timer.collect() == {}


def test_rows_measured_in_one_batch_all_get_their_outcome(tmp_path, monkeypatch):
    """The worker collects a profiler session every TIMING_BATCH_ROWS measured rows (2 here: three sessions for 5
    rows), and every measured row gets its outcome."""
    from opperf.replay import worker

    rows = [{contract.OP_STATE: "eager", contract.ACCELERATOR_CORE: "CPU", contract.INPUT_SHAPES: f"{m},8;8,4",
             contract.INPUT_DTYPES: "DT_FLOAT;DT_FLOAT", contract.INPUT_FORMATS: "ND;ND",
             contract.OUTPUT_SHAPES: f"{m},4", contract.OUTPUT_DTYPES: "DT_FLOAT", contract.OUTPUT_FORMATS: "ND",
             contract.PROFILING_AVERAGE: "1"} for m in (1, 2, 3, 4, 5)]
    path = tmp_path / "mm.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    indices, progress = tmp_path / "indices", tmp_path / "progress"
    indices.write_text("0\n1\n2\n3\n4\n", encoding="utf-8")
    command = WorkerSettings(str(path), "mm", str(Path("config/kernels/torch/mm.yaml").resolve()), "cpu", 2, 1,
                             cpu_threads=1).command(indices, progress)
    monkeypatch.setattr(worker, "TIMING_BATCH_ROWS", 2)
    collects = []
    original = CpuProfilerTimer.collect

    def counted(self):
        collects.append(1)
        return original(self)
    monkeypatch.setattr(CpuProfilerTimer, "collect", counted)
    assert worker.main(command[3:]) == 0
    done = [json.loads(line) for line in progress.read_text(encoding="utf-8").splitlines()]
    outcomes = [record["outcome"] for record in done if record["event"] == "done"]
    assert len(outcomes) == 5 and len(collects) == 3
    assert [outcome["status"] for outcome in outcomes] == [STATUS_OK] * 5
    assert [outcome["columns"][contract.REPLAY_SAMPLE_COUNT] for outcome in outcomes] == ["2"] * 5


def test_insitu_rewrites_warm_inputs_from_twins_and_keeps_their_values():
    state = CacheState(torch.device("cpu"), 1 << 20)
    storage = torch.randn(10, 8)
    gate, up = storage[:, :4], storage[:, 4:]
    case = ReplayCase(fn=torch.add, args=(gate, up), warm=(gate, up))
    _, views, text = state.plan(case)
    assert len(views) == 2 and text.startswith("insitu: flush (read 2 MiB), then 2 warm input(s)")
    assert "rewritten into L2, 2 by a copy from a twin (its producer's reads interleaved), 0 in place" in text
    before = storage.clone()
    storage.zero_()                          # the twins were taken at plan time: prepare restores those bytes
    state.prepare(views)
    assert torch.equal(storage, before)


def test_rewrite_makes_the_warm_inputs_resident_without_a_flush(monkeypatch):
    """What the in-order phase replay runs before each call: the warm inputs from their twins, and the rest of the
    cache as the calls before it left it (no flush)."""
    state = CacheState(torch.device("cpu"), 1 << 20)
    activation, weight = torch.randn(10, 4), torch.randn(10, 4)
    case = ReplayCase(fn=torch.add, args=(activation, weight), warm=(activation,))
    _, views, text = state.plan(case)
    assert len(views) == 1 and "1 warm input(s)" in text and "1 cold input(s)" in text
    before = activation.clone()
    activation.zero_()
    monkeypatch.setattr(state, "flush", lambda: pytest.fail("rewrite flushed the cache"))
    state.rewrite(views)
    assert torch.equal(activation, before)


def test_cold_input_copies_give_a_rows_calls_fresh_cold_inputs_and_share_the_rest():
    """In order, a row's calls take turns over copies of its cold inputs (different weights of one shape in the
    workload); the warm inputs, the recorded-value inputs and an input sharing storage with another stay shared."""
    from opperf.replay.timing import cold_input_copies

    activation, weight, bias = torch.randn(4, 64), torch.randn(64, 64), torch.randn(64)
    offsets = torch.tensor([1, 3, 4], dtype=torch.int32)
    storage = torch.randn(8, 8)
    left, right = storage[:, :4], storage[:, 4:]
    case = ReplayCase(fn=torch.addmm, args=(bias, activation, weight, offsets, left, right),
                      warm=(activation,), value_variants=[(offsets, [offsets.clone(), offsets + 1])])
    state = CacheState(torch.device("cpu"), 1 << 20)
    state.plan(case)
    assert [id(t) for t in state.cold] == [id(bias), id(weight), id(offsets), id(left), id(right)]
    cases = cold_input_copies(case, state.cold, 1 << 20, calls=3)
    assert len(cases) == 3 and cases[0] is case                       # one per call, within 2 x 1 MiB of copies
    for copy in cases[1:]:
        bias_copy, activation_copy, weight_copy, offsets_copy = copy.args[:4]
        assert activation_copy is activation and offsets_copy is offsets      # warm, recorded: shared
        assert copy.args[4] is left and copy.args[5] is right                   # one storage, two inputs: shared
        assert weight_copy is not weight and torch.equal(weight_copy, weight)   # cold: a fresh copy, same values
        assert bias_copy is not bias and torch.equal(bias_copy, bias)
        assert copy.value_variants[0][0] is offsets
    assert len({id(c.args[2]) for c in cases}) == 3
    # No more copies than twice the cache holds of them (16.6 KiB of cold inputs, 32 KiB of cache: 4), nor than
    # max_copies.
    assert len(cold_input_copies(case, state.cold, 1 << 15, calls=40)) == 4
    assert len(cold_input_copies(case, state.cold, 1 << 30, calls=40, max_copies=5)) == 5
    assert cold_input_copies(case, [], 1 << 20, calls=3) == [case]


def test_input_copies_keep_each_inputs_layout_offset_and_aliasing():
    """A copy of a strided view (rotate_half's `x[..., 64:]`, a KV-cache slice) keeps its strides and offset over a
    storage of the same size: `Tensor.clone` makes it contiguous, and the contiguous kernel ran 0.55-0.68x on the
    H200. Two inputs over one storage share the copy's storage."""
    from opperf.replay.timing import _clone_case, cold_input_copies, storage_bytes

    base = torch.randn(2, 8, 128)
    half = base[..., 64:]                                       # not dense: clone() would make it contiguous
    cache = torch.randn(4, 8, 16)
    slot, other = cache[:, :, 2:10], cache[:, :, 10:]
    case = ReplayCase(fn=torch.neg, args=(half, slot, other))
    copy = _clone_case(case, {id(t) for t in case.args})
    for original, copied in zip(case.args, copy.args):
        assert copied.stride() == original.stride() and copied.storage_offset() == original.storage_offset()
        assert copied.untyped_storage().nbytes() == original.untyped_storage().nbytes()
        assert copied.untyped_storage().data_ptr() != original.untyped_storage().data_ptr()
        assert torch.equal(copied, original)
    assert copy.args[1].untyped_storage().data_ptr() == copy.args[2].untyped_storage().data_ptr()
    assert storage_bytes([half, slot, other]) == (2 * 8 * 128 + 4 * 8 * 16) * 4
    turns = cold_input_copies(ReplayCase(fn=torch.neg, args=(half,)), [half], 1 << 20, calls=2)
    assert len(turns) == 2 and turns[1].args[0].stride() == (1024, 128, 1)
    assert turns[1].args[0].storage_offset() == 64


def test_insitu_leaves_inputs_with_recorded_value_variants_to_the_in_place_rewrite():
    offsets = torch.tensor([1, 3, 4], dtype=torch.int32)
    tokens = torch.randn(4, 8)
    case = ReplayCase(fn=torch.add, args=(tokens, offsets), warm=(tokens, offsets),
                      value_variants=[(offsets, [torch.tensor([1, 3, 4], dtype=torch.int32),
                                                 torch.tensor([2, 2, 4], dtype=torch.int32)])])
    state = CacheState(torch.device("cpu"), 1 << 20)
    _, views, text = state.plan(case)
    assert len(views) == 2 and "1 by a copy from a twin (its producer's reads interleaved), 1 in place" in text
    case.next_values()                       # the second recorded call's offsets, then the cache preparation
    state.prepare(views)
    assert offsets.tolist() == [2, 2, 4]     # not put back to the first call's values by a twin


@pytest.mark.parametrize("key", ["l2_policy", "cpu_timing", "target_rel_error"])
def test_the_config_schema_refuses_the_removed_replay_methods(key):
    """One method each (issue 42): a config that still chooses a cache policy, a cpu timer or a spread target is
    refused by the schema, not silently ignored."""
    path = Path(__file__).resolve().parents[1] / "config" / "config.yaml"
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    config["replay"][key] = "insitu"
    with pytest.raises(OpperfError, match=key):
        check_schema(config, "config.schema.yaml", path, set_defaults=True)
