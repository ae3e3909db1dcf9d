"""Bad input to the parse stage: a one-line error naming file, line and field (exit 2) and no partial output,
or a documented skip that is counted and logged with file, line and field."""

from __future__ import annotations

import pytest

from opperf.errors import OpperfError
from opperf.parse import parse_profiles
from test_parse_helpers import FIXTURE, fixture_table, read_csv, run_parse, write_table


def _error_line(done) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, done.stderr
    return lines[0]


def _assert_no_output(tmp_path, out):
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")], "temporary left behind"


def _with_row_change(tmp_path, row_index, column, value, name="kernel_details.csv"):
    header, rows = fixture_table()
    rows[row_index][header.index(column)] = value
    return write_table(tmp_path / name, header, rows)


def test_missing_required_column(tmp_path):
    header, rows = fixture_table()
    i = header.index("Input Shapes")
    path = write_table(tmp_path / "kernel_details.csv", header[:i] + header[i + 1:], [r[:i] + r[i + 1:] for r in rows])
    out = tmp_path / "out"
    line = _error_line(run_parse("--profiling-path", path, "--database-path", out))
    assert line == (f"error: {path}, line 1, field 'Input Shapes': missing required column(s) ['Input Shapes'] "
                    f"(header has {header[:i] + header[i + 1:]})")
    _assert_no_output(tmp_path, out)


def test_empty_file(tmp_path):
    path = tmp_path / "kernel_details.csv"
    path.write_bytes(b"")
    out = tmp_path / "out"
    line = _error_line(run_parse("--profiling-path", path, "--database-path", out))
    assert line == f"error: {path}, line 1: file is empty (no header row)"
    _assert_no_output(tmp_path, out)


def test_header_without_rows(tmp_path):
    header, _ = fixture_table()
    path = write_table(tmp_path / "kernel_details.csv", header, [])
    with pytest.raises(OpperfError) as info:
        parse_profiles([path], tmp_path / "out")
    assert str(info.value) == f"{path}, line 2: file has a header but no data rows"
    _assert_no_output(tmp_path, tmp_path / "out")


@pytest.mark.parametrize("cut, fields", [("mid_number", 22), ("mid_quoted_field", 15)])
def test_truncated_last_line(tmp_path, cut, fields):
    text = FIXTURE.read_text(encoding="utf-8")
    last_line_start = text.rstrip("\n").rfind("\n") + 1
    if cut == "mid_number":
        truncated = text[:last_line_start + text[last_line_start:].index(",N/A,") + 5]    # stops after Context ID
    else:
        truncated = text[:last_line_start + text[last_line_start:].index('"""') + 2]      # inside a quoted field
    path = tmp_path / "kernel_details.csv"
    path.write_text(truncated, encoding="utf-8")
    out = tmp_path / "out"
    line = _error_line(run_parse("--profiling-path", path, "--database-path", out))
    assert line == f"error: {path}, line 30: truncated last line: {fields} of 46 fields"
    _assert_no_output(tmp_path, out)


def test_non_numeric_duration_is_skipped_and_counted(tmp_path, caplog):
    path = _with_row_change(tmp_path, 2, "Duration(us)", "abc")          # data row 3 = line 4: a MatMulV2 row
    database = parse_profiles([path], tmp_path / "out")
    assert database.skip_counts == {"duration is not a number": 1}
    (row,) = read_csv(tmp_path / "out" / "MatMulV2.csv")
    assert row["Profiling Sample Count"] == "3"
    assert row["Profiling Average Duration(us)"] == "187.924"            # (185.504 + 187.724 + 190.544) / 3
    (skipped,) = database.skipped_examples
    assert (skipped.line, skipped.field, skipped.value) == (4, "Duration(us)", "abc")
    assert f"{path}, line 4, field 'Duration(us)'" in skipped.describe()


def test_skips_are_logged_with_file_line_and_field(tmp_path):
    path = _with_row_change(tmp_path, 2, "Duration(us)", "12us")
    done = run_parse("--profiling-path", path, "--database-path", tmp_path / "out", "--trace-dir", tmp_path / "tr",
                     "--task-id", "T")
    assert done.returncode == 0, done.stderr
    assert "skipped 1 rows: duration is not a number" in done.stderr
    assert f"{path}, line 4, field 'Duration(us)': duration is not a number (value '12us')" in done.stderr
    error_log = (tmp_path / "tr" / "MatMulV2" / "IT_S01_MatMulV2_PARSE_error_log.txt").read_text()
    assert "1 rows skipped" in error_log and "line 4" in error_log


def test_na_shapes_are_skipped(tmp_path):
    header, rows = fixture_table()
    rows[0][header.index("Input Shapes")] = "N/A"
    rows[2][header.index("Output Shapes")] = '"N/A"'
    path = write_table(tmp_path / "kernel_details.csv", header, rows)
    database = parse_profiles([path], tmp_path / "out")
    assert database.skip_counts == {"shape is N/A (unknown)": 2}
    assert sorted((s.line, s.field) for s in database.skipped_examples) == [(2, "Input Shapes"), (4, "Output Shapes")]
    (row,) = read_csv(tmp_path / "out" / "MatMulV2.csv")
    assert row["Profiling Sample Count"] == "2"


def test_malformed_shape_is_skipped(tmp_path):
    path = _with_row_change(tmp_path, 0, "Input Shapes", '"""81920,4096;8192,x"""')
    database = parse_profiles([path], tmp_path / "out")
    assert database.skip_counts == {"malformed shape": 1}


def test_hcom_rows_stay_out_of_compute_csvs(tmp_path):
    header, rows = fixture_table()
    hcom = list(rows[0])
    for column, value in (("Name", "hcom_allReduce__123_0_1"), ("Type", "hcom_allReduce_"), ("OP State", "N/A"),
                          ("Accelerator Core", "HCCL"), ("Input Shapes", "N/A"), ("Output Shapes", "N/A"),
                          ("Input Data Types", "N/A"), ("Input Formats", "N/A")):
        hcom[header.index(column)] = value
    path = write_table(tmp_path / "kernel_details.csv", header, rows + [hcom, hcom])
    database = parse_profiles([path], tmp_path / "out")
    assert database.skip_counts == {
        "communication row (hcom_*, NCCL, c10d, record_param_comms): collectives belong to the comm stage, not to "
        "compute CSVs": 2}
    assert not list((tmp_path / "out").glob("hcom*"))


@pytest.mark.parametrize("hostile", ["../../x", "Mat Mul", "Mät", "a/b", "..", "x\\y"])
def test_hostile_kernel_type_never_creates_a_file(tmp_path, hostile):
    path = _with_row_change(tmp_path / "in", 0, "Type", hostile)
    out = tmp_path / "db" / "out"
    database = parse_profiles([path], out)
    assert database.skip_counts == {"kernel type is not a safe file name": 1}
    created = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert created == ["db/out/Add.csv", "db/out/FlashAttentionScore.csv", "db/out/FlashAttentionScoreGrad.csv",
                       "db/out/MatMulV2.csv", "db/out/MatMulV3.csv", "db/out/kernel_types.txt", "in/kernel_details.csv"]
    assert hostile not in (out / "kernel_types.txt").read_text().split("\n")


def test_directory_without_profiles(tmp_path):
    (tmp_path / "prof").mkdir()
    (tmp_path / "prof" / "notes.csv").write_text("a,b\n1,2\n")
    out = tmp_path / "out"
    line = _error_line(run_parse("--profiling-path", tmp_path / "prof", "--database-path", out))
    assert line == (f"error: {tmp_path / 'prof'}: no kernel_details*.csv, op_summary_*.csv or torch.profiler trace "
                    "(*.json[.gz] with traceEvents) found under this directory")
    _assert_no_output(tmp_path, out)


def test_missing_path(tmp_path):
    line = _error_line(run_parse("--profiling-path", tmp_path / "nope.csv", "--database-path", tmp_path / "out"))
    assert line == f"error: {tmp_path / 'nope.csv'}: profiling path does not exist"
    _assert_no_output(tmp_path, tmp_path / "out")


def test_not_utf8(tmp_path):
    header, rows = fixture_table()
    path = write_table(tmp_path / "kernel_details.csv", header, rows)
    path.write_bytes(path.read_bytes().replace(b"MatMulV2,dynamic", b"MatMul\xe9,dynamic", 1))
    out = tmp_path / "out"
    line = _error_line(run_parse("--profiling-path", path, "--database-path", out))
    assert line == f"error: {path}, line 2, field 'Type': not UTF-8 text: byte 0xe9 in column 6"
    _assert_no_output(tmp_path, out)


def test_a_bad_file_among_good_ones_writes_nothing_and_keeps_the_old_database(tmp_path):
    out = tmp_path / "out"
    parse_profiles([FIXTURE], out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    bad = tmp_path / "bad" / "kernel_details.csv"
    bad.parent.mkdir()
    bad.write_bytes(b"")
    with pytest.raises(OpperfError):
        parse_profiles([FIXTURE, bad.parent], out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]


def test_cli_needs_a_database_path_or_versions(tmp_path):
    line = _error_line(run_parse("--profiling-path", FIXTURE, "--vllm-version", "0.18.0"))
    assert line == ("error: give --database-path, or all of --vllm-version, --torch-version and --cann-version "
                    "(missing: --torch-version, --cann-version)")


def test_unknown_device(tmp_path):
    line = _error_line(run_parse("--profiling-path", FIXTURE, "--device", "TPU9", "--vllm-version", "1",
                                 "--torch-version", "2", "--cann-version", "8", "--data-root", tmp_path))
    assert line == ("error: unknown device 'TPU9'; known: A2, A3, CPU, H100, H200 (or their full names) — add it "
                    "to config/devices.yaml")
    assert list(tmp_path.iterdir()) == []


def test_text_columns_are_no_counters_and_na_counters_are_left_out(tmp_path):
    header, rows = fixture_table()
    header = header + ["Comment"]
    rows = [r + [f"note {i}"] for i, r in enumerate(rows)]
    rows[0][header.index("aicore_time(us)")] = "N/A"                 # a MatMulV2 row
    path = write_table(tmp_path / "kernel_details.csv", header, rows)
    parse_profiles([path], tmp_path / "out")
    (row,) = read_csv(tmp_path / "out" / "MatMulV2.csv")
    assert "Profiling Average Comment" not in row
    assert row["Profiling Average aicore_time(us)"] == "185.235"    # (183.728 + 184.904 + 187.073) / 3
    assert row["Profiling Sample Count"] == "4"


def test_na_duration_is_skipped_with_its_line(tmp_path):
    path = _with_row_change(tmp_path, 4, "Duration(us)", "N/A")       # data row 5 = line 6
    database = parse_profiles([path], tmp_path / "out")
    (skipped,) = database.skipped_examples
    assert (skipped.line, skipped.field, skipped.reason) == (6, "Duration(us)", "duration is not a number")


def test_negative_duration_is_skipped(tmp_path):
    path = _with_row_change(tmp_path, 0, "Duration(us)", "-3.5")
    database = parse_profiles([path], tmp_path / "out")
    assert database.skip_counts == {"duration is negative or not finite": 1}


@pytest.mark.parametrize("name, message", [
    ("trace_view.json", "trace_view.json is a torch_npu bundle's timeline, not a kernel table: give the bundle "
                        "directory or its kernel_details.csv"),
    ("notes.txt", "not a profiler file (expected a .csv kernel table or a .json torch.profiler trace)")])
def test_files_that_are_not_profiles(tmp_path, name, message):
    path = tmp_path / name
    path.write_text("{}")
    with pytest.raises(OpperfError) as info:
        parse_profiles([path], tmp_path / "out")
    assert str(info.value) == f"{path}: {message}"
    _assert_no_output(tmp_path, tmp_path / "out")
