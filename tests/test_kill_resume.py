"""A run killed with SIGKILL in the middle of replay resumes with README's two commands and loses nothing.

The real `snakemake` CLI in a temporary copy of the workflow (a small trace, 3 kernel types, one core so the
replays run one after another): kill the whole process group once one replay has finished and the next
is running, check the rerun refuses the lock, `--unlock`, `--rerun-incomplete`, then check every database
CSV against the rows it was built from.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from opperf import contract
from opperf.io import read_database_csv
from snakemake_api import copy_workflow

pytestmark = pytest.mark.workflow

TRACE = Path(__file__).parent / "data" / "replay" / "tiny_cpu" / "trace.json"
KILL_DEADLINE_S = 240


def snakemake(workdir: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "--configfile", "config/resume.yaml", *args],
                          cwd=workdir, capture_output=True, text=True, **kwargs)


def identities(path: Path) -> Counter:
    """The rows of a CSV as a multiset of their identity (signature in one spelling, strides, source)."""
    frame = read_database_csv(path, required=contract.SIGNATURE_COLUMNS)
    columns = [c for c in (*contract.SIGNATURE_COLUMNS, "Input Strides", contract.SOURCE) if c in frame.columns]
    return Counter(tuple(contract.canonical_field(c, row[c]) for c in columns)
                   for row in frame.to_dict(orient="records"))


def kill_leftovers(workdir: Path) -> list[int]:
    """SIGKILL what still runs in `workdir` after the kill (Linux /proc; elsewhere nothing).

    Replay workers are started in a session of their own (opperf/replay/isolation.py), so they outlive a
    killpg of Snakemake's process group; on a real node failure they die with the node. Here they would
    only compete for the CPU with the rerun.
    """
    killed = []
    for proc in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not proc.name.isdigit():
            continue
        try:
            if Path(os.readlink(proc / "cwd")).is_relative_to(workdir):
                os.kill(int(proc.name), signal.SIGKILL)
                killed.append(int(proc.name))
        except (OSError, ProcessLookupError):
            continue
    return killed


def snakemake_status(workdir: Path) -> dict[str, str]:
    """output file -> Snakemake's own status of it (ok, incomplete, missing, ...), from `--summary`."""
    result = snakemake(workdir, "--summary", check=True)
    header, *rows = [line.split("\t") for line in result.stdout.splitlines() if "\t" in line]
    return {row[0]: row[header.index("status")] for row in rows}


def test_sigkill_mid_replay_then_unlock_and_rerun_incomplete_loses_and_duplicates_nothing(tmp_path):
    from opperf.versions import cpu_version_dir

    workdir = copy_workflow(tmp_path / "wf")
    (workdir / "resources" / "tiny_cpu").mkdir(parents=True)
    shutil.copy(TRACE, workdir / "resources" / "tiny_cpu" / "trace.json")
    version_dir = cpu_version_dir()
    (workdir / "config" / "resume_sources.tsv").write_text(
        f"device\tstack\tversion_dir\tpath\nCPU\ttorch\t{version_dir}\tresources/tiny_cpu/trace.json\n")
    (workdir / "config" / "resume.yaml").write_text(
        "sources: config/resume_sources.tsv\nworkload: {enabled: false}\ncomm: {enabled: false}\n"
        "grid: {enabled: true, rows: 3}\nreplay: {backends: [cpu], repeat_count: 2, warmup_count: 1}\n")
    root = f"CPU/torch/{version_dir}"
    replayed_dir, logs_dir = workdir / "results" / root / "replayed", workdir / "logs" / "replay" / root

    run = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "1", "--configfile", "config/resume.yaml"],
                           cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + KILL_DEADLINE_S
    try:
        while True:       # one replay finished, and another started after it (one core: the first is done)
            done = {p.stem for p in replayed_dir.glob("*.csv")}
            running = {p.stem for p in logs_dir.glob("*.log")} - done
            if done and running:
                break
            assert run.poll() is None, "the run ended before it could be killed mid-replay"
            assert time.monotonic() < deadline, "no replay finished in time"
            time.sleep(0.05)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
        kill_leftovers(workdir)

    locked = snakemake(workdir, "--cores", "1")
    assert locked.returncode != 0 and "LockException" in locked.stdout + locked.stderr
    snakemake(workdir, "--unlock", check=True)
    status = snakemake_status(workdir)
    finished = {p.stem: p.stat().st_mtime_ns for p in replayed_dir.glob("*.csv")
                if status.get(str(p.relative_to(workdir))) == "ok"}
    assert finished, status
    interrupted = running - set(finished)
    assert interrupted, (running, finished)

    rerun = snakemake(workdir, "--cores", "2", "--rerun-incomplete")
    assert rerun.returncode == 0, rerun.stderr[-3000:]

    kernel_types = (workdir / "results" / root / "parsed" / contract.KERNEL_TYPES_MANIFEST).read_text().split()
    assert interrupted | set(finished) <= set(kernel_types)
    for kernel_type in kernel_types:
        database_csv = workdir / "data" / root / f"{kernel_type}.csv"
        rows = identities(workdir / "results" / root / "grid" / f"{kernel_type}.csv")
        # Every row is in the layouts file (the runtime's CSV keeps one per runtime key): none lost or doubled.
        assert identities(workdir / "data" / root / "layouts" / f"{kernel_type}.csv") == rows, kernel_type
        frame = read_database_csv(database_csv)
        assert (frame[contract.REPLAY_AVERAGE] != "").all(), kernel_type
    for kernel_type, mtime_ns in finished.items():                    # finished before the kill: not replayed
        assert (replayed_dir / f"{kernel_type}.csv").stat().st_mtime_ns == mtime_ns, kernel_type
    assert all((replayed_dir / f"{k}.csv").is_file() for k in interrupted)
    assert snakemake(workdir, "--cores", "1", "-n", check=True).stdout.count("Nothing to be done") == 1
    # The killed jobs' temporaries went with the rerun's writes into the same directories.
    assert not [str(p) for p in workdir.rglob(".*.tmp") if ".snakemake" not in p.parts]
