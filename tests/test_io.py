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
