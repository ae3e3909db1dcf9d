"""Files opperf writes get the user's umask, not mkstemp's 0600: a team shares its databases on one filesystem."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from opperf.io import (atomic_output, created_mode, current_umask, make_temp_dir, staged_directory,
                       write_csv_atomic, write_text_atomic)

REPO = Path(__file__).resolve().parent.parent
UMASKS = (0o022, 0o002)


@pytest.fixture(params=UMASKS, ids=lambda mask: f"umask{mask:04o}")
def umask(request):
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_current_umask_reads_without_changing_it(umask):
    assert current_umask() == umask
    assert current_umask() == umask
    assert created_mode() == 0o666 & ~umask
    assert created_mode(directory=True) == 0o777 & ~umask


def test_every_io_writer_gives_the_umask_mode(tmp_path, umask):
    file_mode, dir_mode = 0o666 & ~umask, 0o777 & ~umask
    write_text_atomic(tmp_path / "new.txt", "x\n")
    (tmp_path / "old.txt").write_text("old\n")
    os.chmod(tmp_path / "old.txt", 0o600)
    write_text_atomic(tmp_path / "old.txt", "new\n")        # a replaced file takes the new file's mode too
    write_csv_atomic(tmp_path / "frame.csv", pd.DataFrame({"a": ["1"]}))
    with atomic_output(tmp_path / "plot.png", "wb") as handle:
        handle.write(b"\x89PNG")
    write_text_atomic(tmp_path / "replay_mm.py", "#!/usr/bin/env python\n", executable=True)
    with staged_directory(tmp_path / "parsed") as staging:
        write_text_atomic(staging / "A.csv", "a\n")
        (staging / "kernel_types.txt").write_text("A\n")
    with staged_directory(tmp_path / "parsed") as staging:     # the existing-directory path: files replaced
        write_text_atomic(staging / "A.csv", "a2\n")
        (staging / "kernel_types.txt").write_text("A\n")
    with staged_directory(tmp_path / "grid", replace_whole=True) as staging:
        write_text_atomic(staging / "B.csv", "b\n")
    with staged_directory(tmp_path / "grid", replace_whole=True) as staging:
        write_text_atomic(staging / "B.csv", "b2\n")
    temp_dir = make_temp_dir(prefix=".profile.", dir=tmp_path)

    for name in ("new.txt", "old.txt", "frame.csv", "plot.png", "parsed/A.csv", "parsed/kernel_types.txt",
                 "grid/B.csv"):
        assert mode(tmp_path / name) == file_mode, name
    for directory in (tmp_path / "parsed", tmp_path / "grid", temp_dir):
        assert mode(directory) == dir_mode, directory
    assert mode(tmp_path / "replay_mm.py") == dir_mode


def test_a_parse_and_its_report_run_under_the_umask_write_nothing_private(tmp_path, umask, ascend_fixture):
    """The real scripts, in a child process that inherits the umask, as under Snakemake."""
    database = tmp_path / "results" / "A3" / "parsed"
    subprocess.run([sys.executable, str(REPO / "scripts" / "parse_kernel_details.py"),
                    "--profiling-path", str(ascend_fixture), "--database-path", str(database),
                    "--trace-dir", str(tmp_path / "traces")], check=True, capture_output=True)
    csvs = sorted(database.glob("*.csv"))
    assert csvs
    subprocess.run([sys.executable, str(REPO / "scripts" / "report.py"), "--csv", *map(str, csvs),
                    "--output-dir", str(tmp_path / "reports"), "--database", "A3/vllm_ascend/v",
                    "--benchmarks-root", str(tmp_path / "none")], check=True, capture_output=True)
    written = [p for p in tmp_path.rglob("*") if p.name != "kernel_details.csv"]
    files = [p for p in written if p.is_file()]
    assert len(files) > len(csvs) + 4
    wrong = {str(p.relative_to(tmp_path)): oct(mode(p)) for p in files if mode(p) != 0o666 & ~umask}
    wrong |= {str(p.relative_to(tmp_path)): oct(mode(p)) for p in written
              if p.is_dir() and mode(p) != 0o777 & ~umask}
    assert not wrong
