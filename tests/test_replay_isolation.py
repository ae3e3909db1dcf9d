"""Crash isolation: a row that aborts or hangs costs that row (and that job), never the others."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from opperf import contract
from opperf.replay.engine import STATUS_FAILED_CRASH, STATUS_FAILED_TIMEOUT, STATUS_NOT_RUN, STATUS_OK
from opperf.replay.job import ReplaySettings, replay_kernel_csv

HOOKS = Path(__file__).parent / "data" / "replay" / "misbehaving"


@pytest.fixture
def hook_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HOOKS), os.environ.get("PYTHONPATH", "")]))


def write_rows(path: Path, first_dims: list[int]) -> Path:
    rows = [{contract.OP_STATE: "eager", contract.ACCELERATOR_CORE: "CPU", contract.INPUT_SHAPES: f"{m},8;8,4",
             contract.INPUT_DTYPES: "DT_FLOAT;DT_FLOAT", contract.INPUT_FORMATS: "ND;ND",
             contract.OUTPUT_SHAPES: f"{m},4", contract.OUTPUT_DTYPES: "DT_FLOAT", contract.OUTPUT_FORMATS: "ND",
             contract.PROFILING_AVERAGE: "1"} for m in first_dims]
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def write_definition(directory: Path, kernel_type: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{kernel_type}.yaml"
    path.write_text(textwrap.dedent(f"""\
        type: {kernel_type}
        backends: [cpu]
        category: matmul
        hook: misbehaving_hooks
        """))
    return path


def run(tmp_path, kernel_type, first_dims, **settings):
    definitions = tmp_path / "kernels"
    write_definition(definitions, kernel_type)
    rows = write_rows(tmp_path / f"{kernel_type}_in.csv", first_dims)
    output = tmp_path / f"{kernel_type}_out.csv"
    job = replay_kernel_csv(rows, kernel_type, definitions, output,
                            ReplaySettings(repeat_count=2, warmup_count=1, **settings), version_dir=None)
    return job, pd.read_csv(output, dtype=str, keep_default_na=False)


@pytest.fixture(params=[False, True], ids=["child-per-job", "persistent-server"])
def worker_mode(request, tmp_path, monkeypatch):
    """Both ways a job replays: a child process of its own, or the slot's persistent replay server."""
    monkeypatch.setenv("OPPERF_REPLAY_SERVER_IDLE_S", "5")     # test servers leave soon after their job
    return {"persistent_worker": request.param, "slots_dir": tmp_path / "slots"}


def test_abort_and_hang_cost_their_rows_and_the_others_replay(tmp_path, hook_path, worker_mode):
    # 10 s, not less: the row after the abort waits for a fresh child's torch import, seconds on a loaded host.
    job, written = run(tmp_path, "Misbehaving", [4, 1, 5, 2, 6], timeout_s=10, **worker_mode)
    assert written[contract.REPLAY_STATUS].tolist() == [STATUS_OK, STATUS_FAILED_CRASH, STATUS_OK,
                                                        STATUS_FAILED_TIMEOUT, STATUS_OK]
    errors = written[contract.REPLAY_ERROR].tolist()
    assert "SIGABRT" in errors[1] and "timeout of 10 s" in errors[3]
    assert written[contract.REPLAY_AVERAGE].tolist()[1] == "" and written[contract.REPLAY_AVERAGE].tolist()[4] != ""
    assert len(written) == 5


def test_after_max_restarts_the_rest_is_recorded_not_run(tmp_path, hook_path, worker_mode):
    job, written = run(tmp_path, "Aborting", [1, 1 + 0, 4], max_restarts=0, timeout_s=30, **worker_mode)
    # rows 1 and 2 are one call (same signature): one abort, then no restart is left for row 3
    assert written[contract.REPLAY_STATUS].tolist() == [STATUS_FAILED_CRASH, STATUS_FAILED_CRASH, STATUS_NOT_RUN]
    assert "failed 1 times" in written[contract.REPLAY_ERROR].tolist()[2]


def test_an_unimportable_hook_is_a_build_failure_of_the_row(tmp_path):
    from opperf.replay.definitions import load_definition
    from opperf.replay.engine import STATUS_FAILED_BUILD, replay_row
    from opperf.replay.timing import CpuProfilerTimer

    definition = load_definition(write_definition(tmp_path, "NoHook"))
    row = {contract.INPUT_SHAPES: "4,8;8,4", contract.INPUT_DTYPES: "DT_FLOAT;DT_FLOAT"}
    outcome = replay_row(definition, row, backend="cpu", device="cpu", timer=CpuProfilerTimer())
    assert outcome.status == STATUS_FAILED_BUILD
    assert "cannot import hook module 'misbehaving_hooks'" in outcome.error


def test_fail_fast_stops_at_the_first_failure_and_writes_nothing(tmp_path, hook_path):
    from opperf.errors import OpperfError

    with pytest.raises(OpperfError, match="--fail-fast: failed_crash") as error:
        run(tmp_path, "FailFast", [4, 1, 5], fail_fast=True, timeout_s=30)
    assert error.value.row == 3
    assert not (tmp_path / "FailFast_out.csv").exists()


def test_a_child_replay_process_ends_when_its_job_dies(tmp_path):
    """The child runs in its own session (for group kills on timeout) yet must not outlive a killed job."""
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "child.pid"
    child = ("import os, time, pathlib; from opperf.replay.worker import die_with_parent; die_with_parent(); "
             f"pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid())); time.sleep(60)")
    job = ("import subprocess, sys, time; "
           f"subprocess.Popen([sys.executable, '-c', {child!r}], start_new_session=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", job], cwd=Path(__file__).resolve().parents[1])
    for _ in range(300):
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.05)
    child_pid = int(pid_file.read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    for _ in range(100):
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(child_pid, signal.SIGKILL)
    raise AssertionError("the child replay process outlived its killed parent")
