"""A replay that measured nothing fails; one whose rows failed one by one does not; a long job says how far it is.

- the replay process cannot start (a broken install): the job exits non-zero with the reason, writes nothing,
  and Snakemake marks it failed;
- a persistent replay server that cannot start, likewise;
- a server started from a checkout that was since replaced at the same path (identical files and mtimes) is not
  reused, and a job's relative paths are its own working directory's, whatever directory served it;
- progress lines (rows done / total, rate) appear in the job's output.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from snakemake_api import run_workflow, tiny_cpu_replay_workflow

from conftest import REPO

CHECKOUT_PARTS = ("opperf", "scripts", "config", "templates")
BROKEN_TIMING = 'raise ImportError("planted: this install cannot start a replay process")\n'


def _checkout(destination: Path) -> Path:
    """A copy of the code a replay job runs (mtimes kept, as a tree replaced by rsync -a or a re-checkout)."""
    destination.mkdir(parents=True)
    for part in CHECKOUT_PARTS:
        shutil.copytree(REPO / part, destination / part, ignore=shutil.ignore_patterns("__pycache__"))
    return destination


def _rows(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "neg.csv"
    pd.DataFrame({"OP State": ["eager"] * 2, "Accelerator Core": ["CPU"] * 2, "Input Shapes": ["16,8", "4,8"],
                  "Input Data Types": ["DT_FLOAT"] * 2, "Input Formats": ["ND"] * 2, "Output Shapes": ["16,8", "4,8"],
                  "Output Data Types": ["DT_FLOAT"] * 2, "Output Formats": ["ND"] * 2,
                  "Profiling Average Duration(us)": ["3", "2"]}).to_csv(path, index=False)
    return path


def _replay(checkout: Path, cwd: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """scripts/replay.py of `checkout`, run from `cwd` with paths relative to it."""
    environment = {**os.environ, "OPPERF_PROGRESS_INTERVAL_S": "0", "OPPERF_REPLAY_SERVER_IDLE_S": "15",
                   **(env or {})}
    environment.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, str(checkout / "scripts" / "replay.py"), "--rows", "neg.csv",
                           "--kernel", "neg", "--output", "out.csv", "--backend", "cpu", "--repeat-count", "2",
                           "--warmup-count", "1", "--definitions", str(checkout / "config" / "kernels"),
                           "--devices-catalog", str(checkout / "config" / "devices.yaml"),
                           "--slots-dir", str(cwd / "slots"), *extra],
                          cwd=cwd, env=environment, capture_output=True, text=True, timeout=600)


def _server_socket(checkout: Path) -> str:
    code = ("import os, sys; from opperf.replay.server import socket_path; "
            "print(socket_path('cpu', None, sys.argv[1], {}))")
    return subprocess.run([sys.executable, "-c", code, str(checkout / "slots")], cwd=checkout, check=True,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(checkout)}).stdout


@pytest.mark.slow
@pytest.mark.parametrize("persistent", [False, True], ids=["child", "server"])
def test_a_job_whose_replay_process_cannot_start_exits_non_zero_and_writes_nothing(tmp_path, persistent):
    checkout = _checkout(tmp_path / "checkout")
    (checkout / "opperf" / "replay" / "timing.py").write_text(BROKEN_TIMING)
    job = tmp_path / "job"
    _rows(job)
    done = _replay(checkout, job, "--persistent-worker" if persistent else "--no-persistent-worker")
    assert done.returncode == 2, done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("error: neg.csv: no row of 2 could be attempted: never started:")
    assert "planted: this install cannot start a replay process" in done.stderr
    assert not (job / "out.csv").exists()


@pytest.mark.slow
def test_a_server_of_a_replaced_checkout_is_not_reused_and_relative_paths_are_the_jobs(tmp_path):
    checkout = _checkout(tmp_path / "checkout")
    first_socket = _server_socket(checkout)
    first = tmp_path / "first"
    _rows(first)
    done = _replay(checkout, first, "--persistent-worker")
    assert done.returncode == 0, done.stderr
    assert "progress replay neg: 2/2 rows (100.0 %)" in done.stderr
    # The tree is replaced by an identical one (same content, same mtimes), as a redeploy does.
    shutil.rmtree(checkout)
    _checkout(checkout)
    assert _server_socket(checkout) != first_socket
    second = tmp_path / "second"
    _rows(second)
    done = _replay(checkout, second, "--persistent-worker")
    assert done.returncode == 0, done.stderr
    written = pd.read_csv(second / "out.csv", dtype=str, keep_default_na=False)
    assert written["Replay Status"].tolist() == ["ok", "ok"], written["Replay Error"].tolist()
    assert written["Replay Recipe"].tolist() == ["definition config/kernels/torch/neg.yaml"] * 2


@pytest.mark.workflow
def test_the_workflow_fails_a_replay_job_that_could_attempt_no_row(tmp_path):
    workdir, config, root = tiny_cpu_replay_workflow(tmp_path / "wf")
    (workdir / "opperf" / "replay" / "timing.py").write_text(BROKEN_TIMING)
    target = f"results/{root}/replayed/mm.csv"
    with pytest.raises(Exception):
        run_workflow(workdir, [target], config=config)
    log = (workdir / "logs" / "replay" / root / "mm.log").read_text()
    assert "no row of" in log and "could be attempted: never started" in log
    assert not (workdir / target).exists()
