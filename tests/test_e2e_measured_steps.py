"""The end-to-end benchmark's measured step (benchmarks/e2e_prediction.py measured_steps): each kernel's time goes to
the outermost op torch does not decompose around its launch, found through the thread's op nesting (the last op
started by then and its ancestors), per step and per pass."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "e2e_prediction.py"


@pytest.fixture(scope="module")
def e2e():
    spec = importlib.util.spec_from_file_location("e2e_prediction", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _op(name, ts, dur, tid=1):
    return {"cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": tid, "args": {}}


def _launch(ts, correlation, tid=1):
    return {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 1, "tid": tid,
            "args": {"correlation": correlation}}


def _kernel(dur, correlation):
    return {"cat": "kernel", "name": "k", "ts": 10_000 + correlation, "dur": dur, "args": {"correlation": correlation}}


def test_a_kernel_goes_to_the_outermost_op_torch_does_not_decompose_around_its_launch(e2e, tmp_path):
    step = [{"cat": "user_annotation", "name": name, "ts": ts, "dur": 100, "tid": 1}
            for name, ts in (("decode_b2_0", 0), ("decode_b2_0", 1000))]
    events = list(step)
    for base in (0, 1000):                          # two passes of one step
        events += [
            _op("aten::mul", base + 5, 10),             # a sibling that ended before the linear began
            _op("aten::linear", base + 20, 50),         # composite: torch decomposes it into addmm
            _op("aten::t", base + 21, 2),               # a finished child of linear
            _op("aten::addmm", base + 30, 30),
            _launch(base + 7, base + 1), _launch(base + 40, base + 2), _launch(base + 90, base + 3),
            _kernel(4.0, base + 1), _kernel(6.0, base + 2), _kernel(1.0, base + 3)]
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    (measured,) = e2e.measured_steps(trace).values()
    assert measured["passes"] == 2
    assert measured["device_us"] == pytest.approx(11.0)
    # the launch at 90 lies in no op: its kernel still counts to the step
    assert measured["ops_us"] == {"aten.mul": 4.0, "aten.addmm": 6.0, "(no aten op)": 1.0}


def test_the_held_out_steps_are_kept_in_the_record_and_read_back_where_the_traces_are_gone(e2e, tmp_path):
    """A later session rebuilds a database against the held-out steps measured before: the msmodeling stage keeps
    each variant's steps (device_us, ops_us, passes) in the workload's record while the traces are there, reads
    them back when they are not, and stops naming the stage to run where it has neither."""
    work = tmp_path / "hf_model"
    profile = work / "held_out" / "paged" / "decode_c1024"
    profile.mkdir(parents=True)
    (profile / "workload.json").write_text(json.dumps({"plan": {"batch_size": 1, "decode_steps": 1,
                                                                "decode_context": 1024}}))
    events = [{"cat": "user_annotation", "name": "decode_b12_0", "ts": 0, "dur": 100, "tid": 1},
              _op("aten::mm", 10, 20), _launch(12, 1), _kernel(7.5, 1)]
    (profile / "trace.json").write_text(json.dumps({"traceEvents": events}))
    record = {"name": "hf_model", "held_out_profile_date": "2026-12-02"}
    measured = e2e.held_out_measured(work, record)
    assert measured == {"paged": {"decode:12x1024": [{"device_us": 7.5, "ops_us": {"aten.mm": 7.5}, "passes": 1}]},
                        "dynamic": {}, "paged_grouped_mm": {}}
    assert record["held_out_measured"] == measured
    kept = json.loads(json.dumps(record))                     # as state.json keeps it
    (profile / "trace.json").unlink()
    (profile / "workload.json").unlink()
    assert e2e.held_out_measured(work, kept) == measured
    with pytest.raises(SystemExit, match="run the profile stage first"):
        e2e.held_out_measured(work, {"name": "hf_model"})


def test_msmodelings_answers_pair_with_the_measured_ops_and_its_whole_us_rounding_is_told_apart(e2e):
    """msmodeling's trace rounds each call to a whole µs: 128 silu calls of 1 µs each are known to ±64 µs, so
    against 100 µs measured the error 0.28 lies within the rounding; the routing ops pair with the tensor_cast
    experts' ranges, and an op only one side has is a graph difference with its time."""
    predicted = {"aten.silu.default": {"us": 128.0, "calls": 128},
                 "aten.mm.default": {"us": 1000.0, "calls": 4},
                 "tensor_cast.init_routing_v2.default": {"us": 6.0, "calls": 2},
                 "tensor_cast.unpermute_tokens.default": {"us": 6.0, "calls": 2},
                 "aten.slice.Tensor": {"us": 0.0, "calls": 8}}
    measured = {"aten.silu": 100.0, "aten.mm": 900.0, "aten._grouped_mm": 50.0,
                "tensor_cast.init_routing_v2": 5.0, "tensor_cast.unpermute_tokens": 7.0, "aten.sort": 3.0,
                "aten.index": 4.0}
    paired = e2e.pair_ops(predicted, measured)
    by_op = {p["op"]: p for p in paired["per_op"]}
    assert by_op["aten.silu"]["error"] == 0.28 and by_op["aten.silu"]["error_beyond_trace_rounding"] == 0.0
    assert by_op["matmul"]["measured_us"] == 950.0 and by_op["matmul"]["error"] == 0.0526
    assert by_op["matmul"]["error_beyond_trace_rounding"] == round((50 - 2) / 950, 4)
    # ranged: the routing pairs with the ranges, and the sort outside them is the measured step's own
    assert by_op["MoE token routing"]["measured_us"] == 12.0 and by_op["MoE token routing"]["error"] == 0.0
    assert paired["graph_differences"] == {"msmodeling_only": [], "measured_only": [
        {"op": "aten.index", "measured_ops": ["aten.index"], "measured_us": 4.0},
        {"op": "aten.sort", "measured_ops": ["aten.sort"], "measured_us": 3.0}]}
    assert paired["per_op_median_error"] == 0.0526 and paired["per_op_median_error_beyond_trace_rounding"] == 0.0
