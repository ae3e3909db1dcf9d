"""Every CPU/CUDA kernel definition replays on the CPU, on a real row of the reference workload's trace.

tests/data/replay/cpu_rows.csv holds one row per definition (made by make_cpu_rows.py from
torch.profiler traces). Each replay is built, verified against the row's outputs and timed.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from opperf import contract
from opperf.replay.definitions import DEFAULT_DEFINITIONS_DIR, load_definitions
from opperf.replay.engine import STATUS_FAILED_VERIFY, STATUS_OK, STATUS_SKIPPED_MEMORY, replay_row
from opperf.replay.timing import METHOD_CPU_PROFILER, CpuProfilerTimer

ROWS_FILE = Path(__file__).parent / "data" / "replay" / "cpu_rows.csv"
DEFINITIONS = load_definitions(DEFAULT_DEFINITIONS_DIR / "torch", "cpu")
with open(ROWS_FILE, newline="") as handle:
    ROWS = {r["Type"]: r for r in csv.DictReader(handle)}


def test_every_cpu_definition_has_a_real_row():
    assert sorted(DEFINITIONS) == sorted(ROWS)


@pytest.mark.parametrize("kernel_type", sorted(DEFINITIONS))
def test_cpu_replay_of_every_definition(kernel_type):
    outcome = replay_row(DEFINITIONS[kernel_type], ROWS[kernel_type], backend="cpu", device="cpu",
                         timer=CpuProfilerTimer(), repeat_count=3, warmup_count=1)
    assert outcome.status == STATUS_OK, outcome.error
    # a call over 20x the median (a busy CI host's preemption) is left out and said so; never half of them
    left_out = re.search(r"(\d+) of 3 timed calls left out as interrupted", outcome.columns[contract.REPLAY_L2_POLICY])
    assert outcome.columns[contract.REPLAY_SAMPLE_COUNT] == str(3 - int(left_out.group(1)) if left_out else 3)
    assert int(outcome.columns[contract.REPLAY_SAMPLE_COUNT]) >= 2
    assert outcome.columns[contract.REPLAY_TIMING_METHOD].startswith(METHOD_CPU_PROFILER + ", ")
    p10, mean, p90 = (float(outcome.columns[c]) for c in (contract.REPLAY_P10, contract.REPLAY_AVERAGE,
                                                         contract.REPLAY_P90))
    assert 0 < p10 <= p90 and mean > 0
    expected = f"{ROWS[kernel_type][contract.OUTPUT_SHAPES]} | {ROWS[kernel_type][contract.OUTPUT_DTYPES]}"
    if ROWS[kernel_type][contract.OUTPUT_DTYPES]:
        assert outcome.expected_outputs == expected == outcome.produced_outputs
    else:       # no output recorded: data-dependent (bincount) or a Python number (_local_scalar_dense)
        assert outcome.expected_outputs == expected


def test_a_row_whose_outputs_differ_fails_verification_and_gets_no_duration():
    row = dict(ROWS["mm"], **{contract.OUTPUT_SHAPES: "16,511"})
    outcome = replay_row(DEFINITIONS["mm"], row, backend="cpu", device="cpu", timer=CpuProfilerTimer(),
                         repeat_count=3)
    assert outcome.status == STATUS_FAILED_VERIFY and outcome.columns == {}
    assert "[16, 512] != expected [16, 511]" in outcome.error


def test_a_row_over_the_memory_budget_is_skipped_before_allocation():
    row = dict(ROWS["mm"], **{contract.INPUT_SHAPES: "4000000,100000;100000,512"})
    outcome = replay_row(DEFINITIONS["mm"], row, backend="cpu", device="cpu", timer=CpuProfilerTimer(),
                         memory_budget_bytes=2**30)
    assert outcome.status == STATUS_SKIPPED_MEMORY and "over the device memory budget of 1.00 GiB" in outcome.error


def _cat_case(shapes: str, scalars: str):
    from opperf.replay.inputs import build_case

    row = {**ROWS["cat"], contract.INPUT_SHAPES: shapes, contract.INPUT_DTYPES: "DT_BF16;DT_BF16;",
           contract.INPUT_FORMATS: "ND;ND;", contract.INPUT_SCALARS: scalars, contract.INPUT_STRIDES: "",
           contract.OUTPUT_DTYPES: "DT_BF16"}
    row[contract.OUTPUT_SHAPES] = ""
    return build_case(DEFINITIONS["cat"], row, "cpu")


def test_the_cache_a_cat_appends_to_is_cold_and_everything_else_warm():
    # Decode's KV-cache append: 512 past positions (written a forward step ago) plus the new one (just written).
    append = _cat_case("16,8,512,128;16,8,1,128;", ";;-2")
    past, new = append.args[0]
    assert [id(t) for t in append.warm_tensors()] == [id(new)] and "member 0 cold" in append.description
    # Two halves of a rotary embedding, both just computed: both warm.
    halves = _cat_case("1,32,128,64;1,32,128,64;", ";;-1")
    assert len(halves.warm_tensors()) == 2 and "cold" not in halves.description
    # Four times the other member, not eight: two activations, no cache.
    joined = _cat_case("16,8,64,128;16,8,16,128;", ";;-2")
    assert len(joined.warm_tensors()) == 2


def test_a_cpu_rows_cold_inputs_take_turns_over_copies_with_its_strides_and_warm_ones_stay_shared():
    """F.linear's weight (mm slot 1, `cache: cold`) was read from memory inside the workload: its calls take turns
    over copies spanning twice the last-level cache, each with the row's strides; an op without cold inputs keeps
    its one case, and the row says which."""
    from opperf.replay.inputs import build_case
    from opperf.replay.timing import cpu_cold_turns

    row = dict(ROWS["mm"], **{contract.INPUT_SHAPES: "1,256;256,1024", contract.INPUT_STRIDES: ";1,256",
                              contract.OUTPUT_SHAPES: "1,1024"})
    case = build_case(DEFINITIONS["mm"], row, "cpu")
    activation, weight = case.tensors()
    turns, policy = cpu_cold_turns(case, 8 * 2**20)        # 1 MiB weight, 8 MiB cache: 16 copies
    assert len(turns) == 16
    assert policy == "cold inputs: 16 copies in turn, 16.0 MiB (last-level cache 8 MiB)"
    storages = {t.tensors()[1].untyped_storage().data_ptr() for t in turns}
    assert len(storages) == 16 and all(t.tensors()[1].stride() == weight.stride() == (1, 256) for t in turns)
    assert all(t.tensors()[0] is activation for t in turns)
    add = build_case(DEFINITIONS["add"], ROWS["add"], "cpu")
    assert cpu_cold_turns(add, 8 * 2**20) == ([add], "none")
    outcome = replay_row(DEFINITIONS["mm"], row, backend="cpu", device="cpu", timer=CpuProfilerTimer(),
                         repeat_count=3, warmup_count=1)
    assert outcome.status == STATUS_OK, outcome.error
    assert outcome.columns[contract.REPLAY_L2_POLICY].startswith("cold inputs: ")


def test_a_cpu_rows_measured_reuse_distances_set_its_copies_so_each_copy_sees_the_workloads_distance():
    """With the profile's reuse distances, the calls take turns over 1 + distance/size copies of the reused inputs
    (what the workload touched between two uses of the weight lies between two calls of one copy), whatever the
    definition's cold mark; an input first used in the step is cold (twice the cache); a weight touched again
    before half of itself went by keeps its one case."""
    from opperf.replay.engine import prepare_row
    from opperf.replay.timing import cpu_cold_turns

    def prepared(reuse: str):
        row = dict(ROWS["mm"], **{contract.INPUT_SHAPES: "1,256;256,1024", contract.INPUT_STRIDES: ";1,256",
                                  contract.OUTPUT_SHAPES: "1,1024", contract.PROFILING_INPUT_REUSE: reuse})
        return prepare_row(DEFINITIONS["mm"], row, backend="cpu", device="cpu", timer=CpuProfilerTimer()).case

    case = prepared("0;3.2")                     # 1 MiB weight, 3.2 MiB touched since its last use: 1 + 3 copies
    turns, policy = cpu_cold_turns(case, 32 * 2**20)
    assert len(turns) == 4
    assert policy == "reused inputs (reuse distance 3.2 MiB): 4 copies in turn, 4.0 MiB (last-level cache 32 MiB)"
    assert all(t.tensors()[0] is case.tensors()[0] for t in turns)
    assert len({t.tensors()[1].untyped_storage().data_ptr() for t in turns}) == 4
    assert all(t.tensors()[1].stride() == (1, 256) for t in turns)
    # Past twice the cache the distance is capped there (cold): 1 + 16 copies, not 1 + 100; so is a first use.
    assert len(cpu_cold_turns(prepared("0;100"), 8 * 2**20)[0]) == 17
    first, policy = cpu_cold_turns(prepared("0;inf"), 8 * 2**20)
    assert len(first) == 17 and policy.startswith("reused inputs (first use in the step): 17 copies")
    warm = prepared("0;0.4")
    assert cpu_cold_turns(warm, 8 * 2**20) == ([warm], "reuse distances: none to cover")
