"""Workload stage: the reference decoder runs under torch.profiler and leaves the ops a decoder launches."""

from __future__ import annotations

import json

import pytest

from conftest import REPO

from opperf.errors import DeviceUnavailableError, OpperfError
from opperf.workload.model import load_model_dims
from opperf.workload.profile import WorkloadPlan, profile_workload, torch_device_for


@pytest.fixture(scope="module")
def tiny_trace(tmp_path_factory, repo=None):
    from conftest import REPO

    dims = load_model_dims(REPO / "config" / "models.yaml", "opperf-tiny")
    out = tmp_path_factory.mktemp("workload") / "profile"
    plan = WorkloadPlan(prefill_lengths=(8,), decode_steps=2, decode_context=8)
    profile_workload(dims, plan, "cpu", "float32", out)
    return dims, json.loads((out / "trace.json").read_text())


def cpu_ops(trace):
    return [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op"]


def test_profile_has_every_decoder_step_with_shapes(tiny_trace):
    dims, trace = tiny_trace
    names = {e["name"] for e in cpu_ops(trace)}
    assert {"aten::mm", "aten::embedding", "aten::rsqrt", "aten::pow", "aten::mean", "aten::silu", "aten::cat",
            "aten::neg", "aten::add", "aten::mul", "aten::scaled_dot_product_attention"} <= names
    labels = {e["name"] for e in trace["traceEvents"] if e.get("cat") == "user_annotation"}
    assert {"prefill_8", "decode_0", "decode_1"} <= labels
    # The QKV projection of the 8-token prefill: (8, hidden) x (hidden, q + 2 kv).
    qkv = (dims.num_attention_heads + 2 * dims.num_key_value_heads) * dims.head_dim
    dims_seen = [e["args"]["Input Dims"] for e in cpu_ops(trace) if e["name"] == "aten::mm"]
    assert [[8, dims.hidden_size], [dims.hidden_size, qkv]] in dims_seen
    # Decode steps attend over the KV cache: 8 cached + 1 new, then + 2.
    kv_lengths = {e["args"]["Input Dims"][1][2] for e in cpu_ops(trace)
                  if e["name"] == "aten::_scaled_dot_product_flash_attention_for_cpu"}
    assert {8, 9, 10} <= kv_lengths


def test_no_rng_ops_in_the_profile(tiny_trace):
    """Token ids and the decode steps' written KV caches are drawn before the profile; so is nothing else in it: the
    decode steps' context is no prefill either (every op is inside a step's range)."""
    _, trace = tiny_trace
    assert not {"aten::randint", "aten::random_", "aten::randn", "aten::normal_"} & {e["name"] for e in cpu_ops(trace)}
    steps = [e for e in trace["traceEvents"] if e.get("cat") == "user_annotation"]
    assert {s["name"] for s in steps} == {"prefill_8", "decode_0", "decode_1"}
    assert all(any(s["ts"] <= op["ts"] <= s["ts"] + s["dur"] for s in steps) for op in cpu_ops(trace))


def test_missing_accelerators_are_clear_errors():
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(DeviceUnavailableError, match="torch sees no CUDA device"):
            torch_device_for("cuda")
    with pytest.raises(DeviceUnavailableError, match="torch_npu is not installed|no Ascend NPU"):
        torch_device_for("npu")
    with pytest.raises(OpperfError, match="unknown back end 'tpu'"):
        torch_device_for("tpu")


def test_unknown_model_and_incomplete_model_config(tmp_path):
    from conftest import REPO

    with pytest.raises(OpperfError, match="unknown model 'gpt-5'"):
        load_model_dims(REPO / "config" / "models.yaml", "gpt-5")
    bad = tmp_path / "models.yaml"
    bad.write_text("m:\n  hidden_size: 8\n  num_attention_heads: 2\n  vocab_size: 16\n  tp_sizes: [1]\n")
    with pytest.raises(OpperfError, match=f"^{bad}, line 1, field 'm.intermediate_size': model 'm' lacks"):
        load_model_dims(bad, "m")


@pytest.mark.parametrize("line, message", [
    ("  num_key_value_heads: -4", "line 5, field 'opperf-tiny.num_key_value_heads': must be >= 1, got -4"),
    ("  hidden_size: '256x'", "line 5, field 'opperf-tiny.hidden_size': must be an integer, got '256x'"),
])
def test_bad_model_dims_are_refused_by_the_schema_before_torch_sees_them(tmp_path, line, message):
    """Before: torch's RuntimeError / ValueError from inside the model build (issue 16)."""
    from conftest import REPO

    text = (REPO / "config" / "models.yaml").read_text().splitlines()
    start = text.index("opperf-tiny:")
    bad = tmp_path / "models.yaml"
    field = line.split(":")[0].strip()
    body = [t for t in text[start + 1:start + 13] if not t.strip().startswith(f"{field}:")]
    bad.write_text("\n".join(["opperf-tiny:", *body[:3], line, *body[3:]]) + "\n")
    with pytest.raises(OpperfError) as error:
        load_model_dims(bad, "opperf-tiny")
    assert str(error.value) == f"{bad}, {message}"


def test_workload_model_is_found_by_any_case_or_alias_like_the_grid(tmp_path):
    """--model takes what --target-models takes: `Qwen3-32B`, `qwen3_32b` and the alias `QWEN3-32b` agree."""
    from conftest import REPO

    models = REPO / "config" / "models.yaml"
    assert load_model_dims(models, "OPPERF-TINY") == load_model_dims(models, "opperf-tiny")
    exact = load_model_dims(models, "Qwen3-32B")
    assert exact.hidden_size == 5120
    assert load_model_dims(models, "qwen3_32b") == exact == load_model_dims(models, "QWEN3-32b")
    with pytest.raises(OpperfError, match=r"unknown model 'qwen3-33b'.*known: .*Qwen3-32B"):
        load_model_dims(models, "qwen3-33b")


def test_profile_iterations_repeat_every_call(tiny_trace, tmp_path):
    """Three passes under the profiler: every op of one pass is there three times (so each parsed row's profiled
    mean is over three times its calls), and the manifest says how many passes were profiled."""
    from collections import Counter

    from conftest import REPO

    dims, once = tiny_trace
    out = tmp_path / "profile"
    plan = WorkloadPlan(prefill_lengths=(8,), decode_steps=2, decode_context=8, profile_iterations=3)
    profile_workload(load_model_dims(REPO / "config" / "models.yaml", "opperf-tiny"), plan, "cpu", "float32", out)
    thrice = json.loads((out / "trace.json").read_text())

    def calls(trace):
        return Counter((e["name"], json.dumps(e["args"].get("Input Dims"))) for e in cpu_ops(trace))

    assert calls(thrice) == Counter({key: 3 * n for key, n in calls(once).items()})
    assert json.loads((out / "workload.json").read_text())["plan"]["profile_iterations"] == 3


def test_profile_iterations_below_one_are_a_usage_error():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "scripts/profile_workload.py", "--profile-iterations", "0",
                           "--output", "unused"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 2
    assert "--profile-iterations: must be a whole number >= 1, got 0" in done.stderr


def test_a_moe_layer_with_more_experts_than_the_profiler_lists_parses_every_cat_with_its_members(tmp_path):
    """The reference decoder's MoE layer concatenates the outputs of the experts that got tokens. With more than 30
    of them torch.profiler records no member shapes; the profile's recorder keeps them, so every cat call of the
    trace is a row with its members (before: the CPU parse dropped such a call, the CUDA one made a row that replay
    could not build)."""
    import csv
    import subprocess
    import sys

    from conftest import REPO

    models = tmp_path / "models.yaml"
    models.write_text("tiny-moe-40:\n  hidden_size: 128\n  intermediate_size: 256\n  num_attention_heads: 4\n"
                      "  num_key_value_heads: 2\n  head_dim: 32\n  vocab_size: 1024\n  num_hidden_layers: 1\n"
                      "  rms_norm_eps: 1.0e-6\n  rope_theta: 10000.0\n  num_experts: 40\n  num_experts_per_tok: 4\n"
                      "  moe_intermediate_size: 64\n  tp_sizes: [1]\n")
    out = tmp_path / "profile"
    plan = WorkloadPlan(prefill_lengths=(64,), decode_steps=1, decode_context=8, profile_iterations=2)
    profile_workload(load_model_dims(models, "tiny-moe-40"), plan, "cpu", "float32", out)
    trace = json.loads((out / "trace.json").read_text())
    long_cats = [e for e in cpu_ops(trace) if e["name"] == "aten::cat" and e["args"]["Input Dims"][0] == []]
    assert len(long_cats) == 2                                  # the prefill's MoE layer, once per pass
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "parse_kernel_details.py"), "--profiling-path",
                           str(out / "trace.json"), "--database-path", str(tmp_path / "db")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "2 op events: TensorLists of more than 30 tensors (member shapes not in the trace) filled" in done.stderr
    with open(tmp_path / "db" / "cat.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert all(row["Input Shapes"] for row in rows)
    members = [row for row in rows if row["Input Shapes"].count(";") > 30]
    assert sum(int(row["Profiling Sample Count"]) for row in members) == 2
    for row in members:
        sizes = [int(slot.split(",")[0]) for slot in row["Input Shapes"].split(";") if slot]
        assert sum(sizes) == 64 * 4 and row["Output Shapes"] == "256,128"     # every routed token, once


def test_the_timed_pass_runs_under_the_profiler_alone_and_the_execution_trace_is_joined(tmp_path, monkeypatch):
    """The profiled op times are the database's ground truth: nothing but torch.profiler may run inside the ops'
    events of the timed pass. The execution-trace observer serialises every op's inputs inside the op's own event
    (the cpu demo's op times were 3.5x with it), so it records a pass of its own, joined to the timed one by
    order; the parse still finds every call's tensors (input reuse distances) through the record function ids."""
    import torch
    from torch.overrides import _get_current_function_mode_stack
    from torch.profiler import ExecutionTraceObserver
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    import opperf.workload.profile as profile
    from opperf.parse.reuse import load_nodes, same_call

    observers_running = []
    start, stop = ExecutionTraceObserver.start, ExecutionTraceObserver.stop
    monkeypatch.setattr(ExecutionTraceObserver, "start", lambda self: (observers_running.append(self), start(self)))
    monkeypatch.setattr(ExecutionTraceObserver, "stop",
                        lambda self: ([o for o in observers_running if o is self] and observers_running.remove(self),
                                      stop(self)))
    profiler_kwargs = []
    original_profile = torch.profiler.profile

    def recording_profile(*args, **kwargs):
        profiler_kwargs.append(kwargs)
        return original_profile(*args, **kwargs)

    monkeypatch.setattr(profile.torch.profiler, "profile", recording_profile)
    passes = []
    original_iterations = profile.profiled_iterations

    def observed_iterations(*args, **kwargs):
        passes.append({"profiler": torch.autograd.profiler._is_profiler_enabled,
                       "execution_trace": bool(observers_running),
                       "modes": len(_get_current_dispatch_mode_stack()) + len(_get_current_function_mode_stack())})
        return original_iterations(*args, **kwargs)

    monkeypatch.setattr(profile, "profiled_iterations", observed_iterations)
    dims = load_model_dims(REPO / "config" / "models.yaml", "opperf-tiny")
    out = tmp_path / "profile"
    profile.profile_workload(dims, WorkloadPlan(prefill_lengths=(8,), decode_steps=2, decode_context=8),
                             "cpu", "float32", out)

    assert all("execution_trace_observer" not in kwargs for kwargs in profiler_kwargs)
    assert passes == [{"profiler": True, "execution_trace": False, "modes": 0},
                      {"profiler": False, "execution_trace": True, "modes": 0}]
    events = cpu_ops(json.loads((out / "trace.json").read_text()))
    nodes = load_nodes(out / "execution_trace.json")
    assert all(same_call(nodes[e["args"]["Record function id"]], e["name"], e["args"]["Input Dims"]) for e in events)
    overhead = json.loads((out / "workload.json").read_text())["profile_overhead"]
    assert overhead["profiled_pass_s"] > 0 and len(overhead["plain_pass_s"]) == 2
    assert overhead["inflated"] == (overhead["ratio"] > 1 + overhead["floor"])


def test_the_join_leaves_a_call_that_is_not_the_same_op_without_an_id():
    """An op event whose execution-trace call at its position is another op keeps no record function id: the parse
    then treats it as undescribed instead of joining it to another call's tensors. The same op with other shapes
    (a MoE router's split that moved between two GPU passes) is joined and counted."""
    from opperf.workload.execution_trace import join_by_order

    def node(rf_id, name, shapes):
        return {"name": name, "inputs": {"shapes": shapes, "types": ["Tensor(float)"] * len(shapes)},
                "attrs": [{"name": "rf_id", "value": rf_id}, {"name": "scope", "value": 0}]}

    def event(external_id, name, dims):
        return {"cat": "cpu_op", "name": name, "args": {"External id": external_id, "Input Dims": dims,
                                                        "Record function id": 0}}

    events = [event(2, "aten::add", [[4], [4]]), event(1, "aten::mm", [[2, 3], [3, 4]]),
              event(3, "aten::mul", [[8], [8]]), event(4, "aten::cat", [[8]])]
    nodes = [node(11, "aten::add", [[4], [4]]), node(10, "aten::mm", [[2, 3], [3, 4]]),
             node(12, "aten::mul", [[9], [9]]), node(13, "aten::sum", [[8]]),
             {"name": "prefill_8", "attrs": [{"name": "rf_id", "value": 9}, {"name": "scope", "value": 7}]}]
    joined = join_by_order(events, nodes)
    assert (joined.events, joined.calls, joined.joined, joined.reshaped, joined.complete) == (4, 4, 3, 1, False)
    assert [e["args"].get("Record function id") for e in events] == [11, 10, 12, None]


def test_the_workload_log_has_no_profiler_markers_and_keeps_everything_else(tmp_path):
    """torch's C++ side writes `USDT:… profiler_start` / `profiler_stop` and the execution trace observer's
    Enabling/Disabling notes straight to stderr around the profiled block: the workload's log leaves them out,
    and keeps its own lines and any other line written there."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "scripts/profile_workload.py", "--prefill-lengths", "8", "--decode-steps",
                           "1", "--decode-context", "8", "--output", str(tmp_path / "profile")],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "profiler_start" not in done.stderr and "profiler_stop" not in done.stderr
    assert "Execution Trace Observer" not in done.stderr
    assert "span workload.profile done in" in done.stderr and "profile written to" in done.stderr

    script = ("import os, sys\nfrom opperf.log import stderr_without\n"
              "with stderr_without():\n"
              "    os.write(2, b'USDT:2026-11-28 23:45:49 5313:5313 SyncActivityProfilerHandler.cpp:52] profiler_start\\n')\n"
              "    os.write(2, b'[W1128 23:45:49.9 execution_trace_observer.cpp:989] Enabling Execution Trace Observer\\n')\n"
              "    os.write(2, b'[W1128 23:45:50.1 other.cpp:12] a real warning\\n')\n"
              "    print('a Python line', file=sys.stderr)\n"
              "print('after', file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "[W1128 23:45:50.1 other.cpp:12] a real warning\na Python line\nafter\n"


def test_the_join_picks_up_again_after_calls_only_one_pass_ran():
    """A MoE expert that got tokens in the timed pass and none in the execution-trace pass (or the other way) adds
    a few calls to one sequence: the join pairs everything else."""
    from opperf.workload.execution_trace import align_by_name

    timed = list("abcabcXabcabcabcabcabc")
    traced = list("abcabcabcabcYYabcabcabc")
    pairs = align_by_name(timed, traced)
    assert all(timed[i] == traced[j] for i, j in pairs)
    assert len(pairs) == len(timed) - 1 == len(traced) - 2
