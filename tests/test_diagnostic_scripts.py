"""Diagnostic scripts of issue 18 on committed data: benchmarks/probes/trace_neighbours.py on a real CUDA trace and
benchmarks/probes/row_history.py on two committed chains."""

from __future__ import annotations

import json

import pytest
from conftest import REPO, benchmark_scripts



@pytest.fixture(scope="module")
def scripts():
    with benchmark_scripts("trace_neighbours") as modules:
        yield modules


def test_trace_neighbours_names_what_a_call_ran_and_what_ran_before(scripts, capsys):
    (trace_neighbours,) = scripts
    trace = REPO / "tests" / "data" / "parse" / "cuda_tiny_qwen2_moe" / "trace.json.gz"
    assert trace_neighbours.main([str(trace), "aten::copy_", "24,64;24,64", "--limit", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "aten::copy_ 24,64;24,64; strides [[64, 1], [64, 1], []]"
    assert "gpu_memcpy Memcpy DtoD (Device -> Device)" in lines[1] and lines[1].strip().startswith("ran")
    assert lines[2].strip().startswith("after") and "(gap " in lines[2]
    # A TensorList op is matched on its members, as the parse lays them out: the rotary embedding's cat of
    # the tiny Qwen2-MoE ran after the GPU had idled 164 µs (at full size, issue 15's cat row missed by 12-18 %).
    assert trace_neighbours.main([str(trace), "aten::cat", "1,24,8;1,24,8;", "--limit", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "aten::cat 1,24,8;1,24,8; strides [[[192, 1, 24], [192, 1, 24]], []]"
    assert "CatArrayBatchedCopy" in lines[1] and lines[2].endswith("(gap 163.876 us)")
    assert trace_neighbours.main([str(trace), "aten::copy_", "99999,1"]) == 1
    assert "no aten::copy_ call with Input Dims starting '99999,1'" in capsys.readouterr().out


def test_row_history_groups_one_calls_profiles_and_replays_across_chains(tmp_path, capsys):
    """The rotary cat of Qwen2-MoE in two committed chains: two profiles, one replay each, exact values."""
    with benchmark_scripts("row_history") as (row_history,):
        chains = REPO / "benchmarks" / "results" / "unseen_gates"
        sources = [str(chains / chain / "qwen2moe" / "databases_recorded.tar.gz")
                   for chain in ("h100_today", "h100_grouped_producer")]
        arguments = ["cat", "1,128,64;1,128,64;", "--dtypes", "DT_FLOAT;DT_FLOAT;", "--sources", *sources]
        assert row_history.main([*arguments, "--json", str(tmp_path / "history.json")]) == 0
        assert ("| H100 | hf_qwen2_moe_60x4 | 2 | 2.20–2.26 | 2.6 % | 2 | 2.53–2.61 | 11.8–18.4 % |"
                in capsys.readouterr().out)
        summary = json.loads((tmp_path / "history.json").read_text())["devices"]["H100"]["hf_qwen2_moe_60x4"]
        assert [(p["profiled_us"], p["calls"], p["replays_us"]) for p in summary["profiles"]] == [
            (2.2018, 5.0, [2.605833]), (2.2594, 5.0, [2.527067])]
        assert row_history.main(["cat", "9,9,9;", "--sources", *sources]) == 1
        assert "no cat row with Input Shapes '9,9,9;' in 2 source(s)" in capsys.readouterr().err


def test_the_chain_script_passes_only_options_its_scripts_accept():
    """benchmarks/lib/chain_run.sh calls benchmarks/cuda_replay.py and scripts/replay.py: every option it can pass is
    one they have (it passed --power-policy after cuda_replay.py lost it), and a POWER_POLICY left set stops it."""
    import re
    import subprocess

    chain = REPO / "benchmarks" / "lib" / "chain_run.sh"
    commands = chain.read_text().replace("\\\n", " ").splitlines()
    for script in ("benchmarks/cuda_replay.py", "scripts/replay.py"):
        accepted = set(re.findall(r"add_argument\(\s*\"(--[a-z][a-z0-9-]*)\"", (REPO / script).read_text()))
        if script == "scripts/replay.py":           # its parser is built by opperf.replay.cli's helpers too
            accepted |= set(re.findall(r"add_argument\(\s*\"(--[a-z][a-z0-9-]*)\"",
                                       (REPO / "opperf" / "replay" / "cli.py").read_text()))
        passed = {option for line in commands if f"python {script}" in line
                  for option in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", line.split(f"python {script}", 1)[1])}
        assert passed, script
        unknown = {o for o in passed if o not in accepted and o.replace("--no-", "--", 1) not in accepted}
        assert not unknown, (script, sorted(unknown))
    stopped = subprocess.run(["bash", str(chain)], env={"POWER_POLICY": "cooldown", "PATH": "/usr/bin:/bin"},
                             cwd=REPO, capture_output=True, text=True, timeout=30)
    assert stopped.returncode == 2 and "replay has one power state, after-gemm" in stopped.stderr


def test_gemm_row_vs_step_sets_each_rows_time_against_its_calls_in_the_steps(tmp_path, capsys):
    """benchmarks/probes/gemm_row_vs_step.py on a work dir laid out as e2e_prediction.py leaves it: one decode step
    whose two [1, 64] x [64, 32] mm calls ran 4 + 1 µs (a GEMM and its split-K reduce) and 5 µs, at 120 W by NVML;
    the database's row of that shape replayed 5.5 µs after the heater: row / step 1.1, and a shape without a row is
    left out."""
    import pandas as pd

    from opperf import contract

    work, model = tmp_path / "e2e", "hf_m"
    database = work / model / "database" / "H200" / "torch" / "torch2.11.0_cuda13.0"
    database.mkdir(parents=True)
    header = [*contract.BASE_COLUMNS, contract.REPLAY_AVERAGE, "Replay Power(W)", "Replay L2 Policy"]
    row = ("", "", '"1,64;64,32"', "DT_BF16;DT_BF16", "ND;ND", '"1,32"', "DT_BF16", "ND", "5.5", "290.5",
           "insitu: flush; power: after-gemm, a 4096^3 bf16 GEMM before each call")
    pd.DataFrame([dict(zip(header, row))], columns=header).to_csv(database / "mm.csv", index=False)
    profile = work / model / "held_out" / "paged" / "decode_c1024"
    profile.mkdir(parents=True)

    def mm(ts, dims):
        return {"cat": "cpu_op", "name": "aten::mm", "ts": ts, "dur": 10, "tid": 1,
                "args": {"Input Dims": dims, "Input type": ["c10::BFloat16", "c10::BFloat16"]}}

    def launched(ts, correlation, dur):
        return [{"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 1, "tid": 1,
                 "args": {"correlation": correlation}},
                {"cat": "kernel", "name": "k", "ts": 1000 + correlation, "dur": dur,
                 "args": {"correlation": correlation}}]

    events = [{"cat": "user_annotation", "name": "opperf::power_sync", "ts": 0, "dur": 1, "tid": 1},
              {"cat": "user_annotation", "name": "decode_b1_0", "ts": 10, "dur": 100, "tid": 1},
              mm(20, [[1, 64], [64, 32]]), *launched(22, 1, 4.0), *launched(25, 2, 1.0),
              mm(40, [[1, 64], [64, 32]]), *launched(42, 3, 5.0),
              mm(60, [[1, 32], [32, 64]]), *launched(62, 4, 3.0)]
    (profile / "trace.json").write_text(json.dumps({"traceEvents": events}))
    (profile / "power_samples.json").write_text(json.dumps({
        "sync_us": 1000.0, "fields": ["t_us", "SM Clock(MHz)", "Power(W)", "Temperature(C)"],
        "samples": [[1000.0 + t, 1980.0, 120.0, 40.0] for t in range(0, 200, 20)]}))
    with benchmark_scripts("gemm_row_vs_step") as (probe,):
        assert probe.main([str(work), model, "--json", str(tmp_path / "out.json")]) == 0
    (entry,) = json.loads((tmp_path / "out.json").read_text())["shapes"]
    assert entry == {"profile": "decode_c1024", "phase": "decode", "shapes": [[1, 64], [64, 32]], "calls": 2,
                     "step_us": 5.0, "row_us": 5.5, "row_over_step": 1.1, "step_power_w": 120.0,
                     "row_power_w": 290.5, "row_heated": True}
    assert "call-weighted median row / step: 1.1000 over 2 calls" in capsys.readouterr().out
