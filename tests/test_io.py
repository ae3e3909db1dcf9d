"""Atomic writes: a file or a directory of CSVs is the old one or the complete new one, never a mix."""

from __future__ import annotations

import pytest

from opperf.io import atomic_output, staged_directory


def test_atomic_output_leaves_the_old_file_on_error(tmp_path):
    target = tmp_path / "db.csv"
    target.write_text("old\n")
    with pytest.raises(RuntimeError):
        with atomic_output(target) as handle:
            handle.write("half")
            raise RuntimeError("crash mid-write")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["db.csv"]


def test_staged_directory_publishes_files_and_removes_types_the_manifest_dropped(tmp_path):
    target = tmp_path / "parsed"
    with staged_directory(target) as staging:
        (staging / "A.csv").write_text("a1\n")
        (staging / "B.csv").write_text("b1\n")
        (staging / "kernel_types.txt").write_text("A\nB\n")
    (target / "notes.txt").write_text("a user's file\n")
    with staged_directory(target) as staging:
        (staging / "A.csv").write_text("a2\n")
        (staging / "kernel_types.txt").write_text("A\n")
    assert sorted(p.name for p in target.iterdir()) == ["A.csv", "kernel_types.txt", "notes.txt"]
    assert (target / "A.csv").read_text() == "a2\n"
    assert [p.name for p in tmp_path.iterdir()] == ["parsed"]


def test_staged_directory_publishes_nothing_on_error(tmp_path):
    target = tmp_path / "grid"
    with staged_directory(target, replace_whole=True) as staging:
        (staging / "A.csv").write_text("a1\n")
    with pytest.raises(RuntimeError):
        with staged_directory(target, replace_whole=True) as staging:
            (staging / "A.csv").write_text("a2\n")
            raise RuntimeError("generation failed")
    assert (target / "A.csv").read_text() == "a1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["grid"]


def test_replace_whole_drops_files_the_new_content_lacks(tmp_path):
    target = tmp_path / "grid"
    target.mkdir()
    (target / "stale.csv").write_text("x\n")
    with staged_directory(target, replace_whole=True) as staging:
        (staging / "A.csv").write_text("a\n")
    assert sorted(p.name for p in target.iterdir()) == ["A.csv"]
    assert [p.name for p in tmp_path.iterdir()] == ["grid"]


# --- faults: one OutputError, nothing half-written, temporaries of killed runs cleared ---------------------

def test_an_os_error_while_writing_names_the_output_not_the_temporary(tmp_path):
    import errno

    from opperf.errors import OutputError

    target = tmp_path / "db.csv"
    with pytest.raises(OutputError) as error:
        with atomic_output(target) as handle:
            handle.write("half")
            raise OSError(errno.ENOSPC, "No space left on device")     # what write() raises on a full disk
    assert str(error.value) == f"{target}: cannot write: No space left on device (ENOSPC)"
    assert list(tmp_path.iterdir()) == []


def test_an_os_error_in_a_staged_directory_names_the_file_it_was_for(tmp_path):
    import errno

    from opperf.errors import OutputError

    target = tmp_path / "parsed"
    with pytest.raises(OutputError) as error:
        with staged_directory(target) as staging:
            raise OSError(errno.EROFS, "Read-only file system", str(staging / "MatMulV2.csv"))
    assert str(error.value) == f"{target / 'MatMulV2.csv'}: cannot write: Read-only file system (EROFS)"
    assert list(tmp_path.iterdir()) == []


def test_the_next_write_removes_what_killed_writers_left_and_nothing_else(tmp_path):
    import os
    import subprocess
    import sys
    import time

    from opperf.io import FOREIGN_TEMP_STALE_AFTER_S, _host, temp_prefix

    target = tmp_path / "MatMulV2.csv"
    killed = subprocess.run([sys.executable, "-c", "import os\nfrom opperf.io import atomic_output\n"
                             f"with atomic_output({str(target)!r}) as handle:\n    handle.write('half')\n"
                             "    os.kill(os.getpid(), 9)\n"], capture_output=True)
    assert killed.returncode == -9
    (dead,) = list(tmp_path.glob(".MatMulV2.csv.*.tmp"))
    host = _host()
    live = tmp_path / f"{temp_prefix(target)}live1234.tmp"                           # this process: still writing
    legacy = tmp_path / ".MatMulV2.csv.a1b2c3d4.tmp"                                  # named before writers were tagged
    foreign_fresh = tmp_path / f".MatMulV2.csv.{os.getpid()}@not-{host}.fresh123.tmp"  # another host, just now
    foreign_old = tmp_path / f".MatMulV2.csv.{os.getpid()}@not-{host}.old12345.tmp"    # another host, a day ago
    other_target = tmp_path / ".Other.csv.1@x.abcd1234.tmp"
    for path in (live, legacy, foreign_fresh, foreign_old, other_target):
        path.write_text("x")
    day_ago = time.time() - FOREIGN_TEMP_STALE_AFTER_S - 60
    os.utime(foreign_old, (day_ago, day_ago))
    with atomic_output(target) as handle:
        handle.write("whole\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [target.name, live.name, foreign_fresh.name, other_target.name])
    assert not dead.exists() and target.read_text() == "whole\n"


def test_a_failed_run_removes_what_it_created_and_keeps_what_it_replaced(tmp_path):
    from opperf.io import all_or_nothing, write_text_atomic

    kept = tmp_path / "db" / "mm.csv"
    kept.parent.mkdir()
    kept.write_text("old\n")
    with pytest.raises(RuntimeError):
        with all_or_nothing():
            write_text_atomic(kept, "new, complete\n")                 # an in-place update that finished
            write_text_atomic(tmp_path / "traces" / "mm" / "spec.txt", "spec\n")
            with staged_directory(tmp_path / "parsed") as staging:
                (staging / "A.csv").write_text("a\n")
            raise RuntimeError("the next write failed")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["db", "db/mm.csv"]
    assert kept.read_text() == "new, complete\n"


def test_check_writable_stops_before_the_work_and_leaves_nothing(tmp_path):
    from opperf.errors import OutputError
    from opperf.io import check_writable

    blocker = tmp_path / "not_a_directory"
    blocker.write_text("x")
    with pytest.raises(OutputError) as error:
        check_writable(blocker / "out.csv")
    assert str(error.value) == f"{blocker / 'out.csv'}: cannot write: Not a directory (ENOTDIR)"
    check_writable(tmp_path / "new" / "out.csv")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["new", "not_a_directory"]
