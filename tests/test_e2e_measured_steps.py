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
