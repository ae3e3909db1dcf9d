"""Real 2-process gloo runs: every collective through torchrun and the script, the known-pattern check
catching wrong and unwritten results, and the script's plain errors."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from opperf.cli import run_cli
from opperf.comm.collectives import OPS, CollectiveCase
from opperf.comm.results import COLUMNS
from opperf.comm.sizes import DTYPES

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "generate_comm_microbench.py"
pytestmark = pytest.mark.slow


def _torchrun(*args: str, nproc: int = 2, timeout: int = 120) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               str(SCRIPT), "--do-run", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_every_collective_runs_checked_on_two_gloo_processes(tmp_path):
    result = _torchrun("--backend", "gloo", "--device", "CPU", "--grid-shape", "48", "8", "2",
                       "--bytes-grid", "1KiB", "64KiB", "--warmup-iters", "1", "--min-iters", "3",
                       "--max-iters", "5", "--target-seconds", "0.001", "--output-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    for op in OPS:
        frame = pd.read_csv(tmp_path / f"{op}.csv", dtype=str, keep_default_na=False)
        assert list(frame.columns) == list(COLUMNS)
        assert frame["message_bytes"].tolist() == ["1024", "65536"]
        assert set(frame["num_devices"]) == {"2"} and set(frame["topology_tier"]) == {"2"}   # dies of a node
        assert set(frame["dtype"]) == {"DT_BF16"} and set(frame["verified"]) == {"true"}
        assert set(frame["backend"]) == {"gloo"} and set(frame["timing_method"]) == {"host_wall_clock"}
        assert all(3 <= int(n) <= 5 for n in frame["sample_count"])
        durations = frame["Duration(us)"].astype(float)
        assert (durations > 0).all()
        assert (frame["Duration P10(us)"].astype(float) <= durations).all()
        assert (frame["Duration P90(us)"].astype(float) >= durations).all()


def _check_worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    group = dist.new_group([0, 1])
    found = {}
    for dtype in ("bfloat16", "int8", "float16", "float32"):
        for op in OPS:
            # all_to_all: one element more than 2 equal chunks hold, to see the rounding down
            extra = DTYPES[dtype].element_bytes if op == "all_to_all" else 0
            case = CollectiveCase(op, 4096 + extra, DTYPES[dtype], group, [0, 1], rank, "cpu")
            case.fill()
            case.run()
            right = case.check()
            case.output[rank] += 1                  # one wrong element on each rank
            wrong = case.check()
            case.fill()                             # fresh pattern, no call: outputs keep their poison
            unwritten = case.check() if case.output is not case.input else "in place"
            found[f"{dtype} {op}"] = [right, wrong, unwritten, case.message_bytes]
    dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(found))


def test_the_known_pattern_check_accepts_right_and_catches_wrong_results(tmp_path):
    mp.spawn(_check_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        found = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for key, (right, wrong, unwritten, message_bytes) in found.items():
            assert right is None, (key, right)
            assert wrong and "1 of" in wrong and f"group rank {rank}" in wrong, (key, wrong)
            assert unwritten, key
        # all_to_all of 4096 B + 1 element: rounded down to 2 equal chunks, the bytes sent recorded
        assert {found[f"{dtype} all_to_all"][3] for dtype in ("bfloat16", "int8", "float16", "float32")} == {4096}


def _load_script():
    spec = importlib.util.spec_from_file_location("generate_comm_microbench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_script(argv: list[str], capsys) -> tuple[int, str, str]:
    module = _load_script()
    code = run_cli(module.build_parser(), module.main, argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


TORCHRUN_ENV = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "localhost", "MASTER_PORT": "1"}


def test_without_do_run_the_plan_and_launch_lines_are_printed(capsys):
    code, _, err = _run_script(["--num-devices", "16", "2", "--topology-tier", "1", "2"], capsys)
    assert code == 2 and "cannot hold a tier-2 group of 16 devices" in err
    code, out, err = _run_script(["--device", "A3", "--num-devices", "16", "2"], capsys)
    assert code == 0, err
    assert "grid 48x8x2" in out and "processes needed: 16" in out
    assert "torchrun --standalone --nproc-per-node 16" in out
    assert "--nnodes $NNODES" in out and "--master-addr $MASTER_ADDR" in out
    assert "grid 128x8" in _run_script(["--device", "A2", "--num-devices", "8"], capsys)[1]


@pytest.mark.parametrize("args, env, message", [
    (["--ops", "all_reduce", "all_gather", "--output-csv", "x.csv", "--do-run"], {},
     "--output-csv holds one collective"),
    (["--do-run", "--output-dir", "x"], None, "must be launched by torchrun"),
    (["--do-run", "--backend", "gloo", "--output-dir", "x", "--version-dir", "torch0.0"], TORCHRUN_ENV,
     "refusing to write gloo numbers"),
    (["--do-run", "--backend", "gloo", "--bench-mode", "kernel", "--output-dir", "x"], TORCHRUN_ENV,
     "gloo (CPU) runs no device kernels"),
    (["--do-run", "--backend", "gloo", "--num-devices", "4", "--output-dir", "x"], TORCHRUN_ENV,
     "torchrun started 2 processes"),
])
def test_bad_requests_are_one_line_errors_with_exit_code_2(args, env, message, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    for variable in TORCHRUN_ENV:
        monkeypatch.delenv(variable, raising=False)
    for variable, value in (env or {}).items():
        monkeypatch.setenv(variable, value)
    code, _, err = _run_script(args, capsys)
    assert code == 2, err
    assert message in err
    assert err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []        # nothing written


def test_groups_of_two_four_and_eight_on_one_eight_device_host(tmp_path):
    """The shape of the 8-GPU H200 run (issue 12), rehearsed with 8 gloo processes: every group size up to 8
    on a host of 8 devices (grid 1 x 8), each group in the intra-node tier, every point verified."""
    result = _torchrun("--backend", "gloo", "--device", "CPU", "--grid-shape", "1", "8", "--num-devices", "2", "4",
                       "8", "--bytes-grid", "1KiB", "--warmup-iters", "1", "--min-iters", "2", "--max-iters", "2",
                       "--target-seconds", "0.001", "--output-dir", str(tmp_path), nproc=8, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    for op in OPS:
        frame = pd.read_csv(tmp_path / f"{op}.csv", dtype=str, keep_default_na=False)
        assert frame["num_devices"].tolist() == ["2", "4", "8"]
        assert set(frame["topology_tier"]) == {"1"} and set(frame["verified"]) == {"true"}
        assert set(frame["message_bytes"]) == {"1024"} and (frame["Duration(us)"].astype(float) > 0).all()
