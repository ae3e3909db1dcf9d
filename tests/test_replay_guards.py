"""Replay outcomes that must not read as measurements: an all-zero timing, auxiliary outputs a definition
does not check, and the layout of composite ops' device time."""

from __future__ import annotations

import torch

from opperf.replay.definitions import OutputSpec, load_definition
from opperf.replay.engine import STATUS_FAILED_NO_SAMPLES, STATUS_OK, PreparedRow
from opperf.replay.inputs import parse_row_slots
from opperf.replay.methods import TimingResult
from opperf.replay.timing import _ops_in_ranges, _top_level_ops
from opperf.replay.verify import verify_outputs


def test_a_call_timed_at_zero_fails_instead_of_reading_as_free():
    prepared = PreparedRow(case=None, call="aten.clone(...)", expected_outputs="", produced_outputs="")
    zero = prepared.outcome(TimingResult([0.0] * 30, "cuda profiler (CUPTI) device-kernel time per call", "insitu"))
    assert zero.status == STATUS_FAILED_NO_SAMPLES
    assert "every one of the 30 timed calls measured 0 us" in zero.error
    some = prepared.outcome(TimingResult([0.0, 1.5, 1.6], "cuda profiler", "insitu"))
    assert some.status == STATUS_OK


def test_composite_ops_are_timed_through_the_ops_they_call():
    # One call range (0..100 ns on thread 7) holding clone (10..90), which holds copy_ (20..80); an op on another
    # thread and one after the range are not the call's.
    ranges = [(0, 100, 7, 1)]
    ops = [(10, 90, 7, 101), (20, 80, 7, 102), (30, 40, 8, 103), (120, 130, 7, 104)]
    assert [op[3] for op, _ in _top_level_ops(ranges, ops)] == [101]
    assert sorted(op[3] for op, _ in _ops_in_ranges(ranges, ops)) == [101, 102]


def test_outputs_slots_verifies_the_leading_outputs_only(repo):
    definition = load_definition(repo / "config" / "kernels" / "torch" / "_scaled_dot_product_cudnn_attention.yaml")
    assert definition.outputs == OutputSpec(verify=True, extra="ignore", slots=1)
    row = {"Input Shapes": "1,8,4,64;1,8,4,64;1,8,4,64", "Input Data Types": "DT_BF16;DT_BF16;DT_BF16",
           "Input Formats": "ND;ND;ND", "Output Shapes": "1,8,4,64;1,8,4,1", "Output Data Types": "DT_BF16;DT_FLOAT",
           "Output Formats": "ND;ND"}
    slots = parse_row_slots(row)
    # The device's logsumexp (when compute_log_sumexp is False) is not what meta tensors say: not checked.
    produced = (torch.empty(1, 8, 4, 64, dtype=torch.bfloat16), torch.empty(0))
    assert verify_outputs(row, slots, produced, definition.outputs).ok
    assert not verify_outputs(row, slots, produced, OutputSpec(verify=True, extra="ignore")).ok


def test_the_heater_threshold_reaches_the_worker_and_removed_methods_are_refused(tmp_path):
    import subprocess
    import sys

    from opperf.replay.isolation import WorkerSettings

    settings = WorkerSettings(rows_path="rows.csv", kernel_type="mm", definition_path="mm.yaml", backend="cuda",
                              repeat_count=3, warmup_count=1, heater_min_power_w=150.0)
    command = settings.command(tmp_path / "indices", tmp_path / "progress")
    assert command[command.index("--heater-min-power") + 1] == "150.0"
    # One method each (issue 42): the options that chose among measured-and-dropped ones are gone.
    for option in ("--power-policy", "--l2-policy", "--cuda-timing", "--cpu-timing"):
        done = subprocess.run([sys.executable, "scripts/replay.py", option, "x"], capture_output=True, text=True)
        assert done.returncode == 2 and f"unrecognized arguments: {option} x" in done.stderr
