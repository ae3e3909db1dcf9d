"""Parse stage on the real Ascend fixture: exact values, every header variant, directories, re-parse, traces."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opperf.contract import BASE_COLUMNS, canonical_field
from opperf.parse import parse_profiles
from opperf.stats import format_number
from test_parse_helpers import (FIXTURE, expected_groups, expected_number, fixture_table, parsed_groups, read_csv,
                                read_header, run_parse, write_table)

FIXTURE_TYPES = ["Add", "FlashAttentionScore", "FlashAttentionScoreGrad", "MatMulV2", "MatMulV3"]


def _counters(header: list[str]) -> list[str]:
    return header[header.index("Context ID") + 1:]


def test_fixture_exact_values_match_an_independent_computation(tmp_path):
    parse_profiles([FIXTURE], tmp_path / "out")
    header, rows = fixture_table()
    expected = expected_groups(header, rows, _counters(header))
    got = parsed_groups(tmp_path / "out")
    assert set(got) == set(expected)
    for key, values in expected.items():
        for column, value in values.items():
            assert got[key][column] == value, (key, column)


def test_fixture_matmulv2_by_hand(tmp_path):
    parse_profiles([FIXTURE], tmp_path / "out")
    (row,) = read_csv(tmp_path / "out" / "MatMulV2.csv")
    durations = [185.504, 186.823, 187.724, 190.544]
    assert row["Profiling Average Duration(us)"] == "187.64875"            # sum 750.595 / 4
    assert row["Profiling Median Duration(us)"] == "187.2735"              # (186.823 + 187.724) / 2
    assert row["Profiling Std Duration(us)"] == "1.848645"                 # population std, 6 decimals
    assert abs(statistics.pstdev(durations) - 1.848645) < 5e-7
    assert row["Profiling Average aicore_time(us)"] == "184.89375"         # (183.87+183.728+184.904+187.073)/4
    assert row["Profiling Average aic_total_cycles"] == "5324941.5"
    assert row["Profiling Sample Count"] == "4"
    assert row["Input Shapes"] == "81920,4096;8192,512" and row["Output Shapes"] == "4096,512"
    assert row["source"] == "profiled"


def test_fixture_layout_and_slots(tmp_path):
    out = tmp_path / "out"
    parse_profiles([FIXTURE], out)
    assert (out / "kernel_types.txt").read_text() == "".join(f"{t}\n" for t in FIXTURE_TYPES)
    assert sorted(p.name for p in out.iterdir()) == sorted([f"{t}.csv" for t in FIXTURE_TYPES] + ["kernel_types.txt"])
    header, _ = fixture_table()
    columns = read_header(out / "MatMulV2.csv")
    assert columns == [*BASE_COLUMNS, "Profiling Average Duration(us)", "Profiling Median Duration(us)",
                       "Profiling Std Duration(us)", *[f"Profiling Average {c}" for c in _counters(header)],
                       "source", "Profiling Sample Count"]
    add = read_csv(out / "Add.csv")
    scalar_add = [r for r in add if r["Input Shapes"] == ";"]
    assert len(scalar_add) == 1                        # `""";"""`: two empty slots, kept
    assert scalar_add[0]["Output Shapes"] == ""         # `""""""`: no shape at all
    assert scalar_add[0]["Input Data Types"] == "FLOAT;FLOAT"            # the profiler's spelling, kept
    assert scalar_add[0]["Profiling Average Duration(us)"] == "1.48"     # (1.38+1.46+1.5+1.58)/4
    fa = read_csv(out / "FlashAttentionScore.csv")
    assert fa[0]["Input Shapes"] == "4096,2,512;4096,2,512;4096,2,512;;;;4096,4096;;;;;"   # 12 slots, 6 empty
    assert len(fa[0]["Input Data Types"].split(";")) == 12
    matmul_v3 = read_csv(out / "MatMulV3.csv")
    assert [r["Input Shapes"] for r in matmul_v3] == ["81920,1536;8192,4096", "8192,15365;8192,4096"]   # first seen
    assert matmul_v3[1]["Profiling Sample Count"] == "4" and matmul_v3[1]["Profiling Std Duration(us)"] == "0"
    for path in out.glob("*.csv"):
        assert '"""' not in path.read_text()


def _drop(name):
    def change(header, rows):
        i = header.index(name)
        return header[:i] + header[i + 1:], [r[:i] + r[i + 1:] for r in rows]
    return change


def _rename(**names):
    def change(header, rows):
        return [names.get(h.replace(" ", "_").replace("(", "").replace(")", ""), h) for h in header], rows
    return change


def _rename_exact(mapping):
    def change(header, rows):
        return [mapping.get(h, h) for h in header], rows
    return change


def _add_device_id(header, rows):
    return ["Device_id", *header], [["0", *r] for r in rows]


def _old_spellings(header, rows):
    dtype_columns = [header.index(c) for c in ("Input Data Types", "Output Data Types")]
    format_columns = [header.index(c) for c in ("Input Formats", "Output Formats")]
    new_rows = []
    for row in rows:
        row = list(row)
        for i in dtype_columns:
            row[i] = ";".join(s.removeprefix("DT_") for s in row[i].split(";"))
        for i in format_columns:
            row[i] = ";".join(f"FORMAT_{s}" if s else s for s in row[i].split(";"))
        new_rows.append(row)
    return header, new_rows


def _no_trailing_tab(header, rows):
    i = header.index("Start Time(us)")
    return header, [[*r[:i], r[i].strip(), *r[i + 1:]] for r in rows]


def _compose(*changes):
    def change(header, rows):
        for step in changes:
            header, rows = step(header, rows)
        return header, rows
    return change


OP_SUMMARY_NAMES = {"Name": "Op Name", "Type": "OP Type", "Accelerator Core": "Task Type",
                    "Start Time(us)": "Task Start Time(us)", "Duration(us)": "Task Duration(us)",
                    "Wait Time(us)": "Task Wait Time(us)", "Block Dim": "Block Num", "Mix Block Dim": "Mix Block Num"}

VARIANTS = {
    "no_step_id": _drop("Step Id"),
    "with_device_id": _add_device_id,
    "no_model_id": _drop("Model ID"),
    "no_hf32_eligible": _drop("HF32 Eligible"),
    "block_num": _rename_exact({"Block Dim": "Block Num", "Mix Block Dim": "Mix Block Num"}),
    "old_spellings": _old_spellings,
    "no_trailing_tab": _no_trailing_tab,
    "cann7_like": _compose(_drop("Step Id"), _drop("HF32 Eligible"), _add_device_id, _old_spellings,
                           _rename_exact({"Block Dim": "Block Num"})),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_header_variants_give_the_same_database(tmp_path, variant):
    header, rows = VARIANTS[variant](*fixture_table())
    write_table(tmp_path / "kernel_details.csv", header, rows)
    parse_profiles([FIXTURE], tmp_path / "base")
    parse_profiles([tmp_path / "kernel_details.csv"], tmp_path / "variant")
    spelled = ("Input Data Types", "Input Formats", "Output Data Types", "Output Formats")
    for kernel_type in FIXTURE_TYPES:
        variant_rows = read_csv(tmp_path / "variant" / f"{kernel_type}.csv")
        base_rows = read_csv(tmp_path / "base" / f"{kernel_type}.csv")
        if variant in ("old_spellings", "cann7_like"):
            # Older spellings are written as the file has them (FLOAT16, FORMAT_ND) and only canonicalised
            # for matching: the rows are the same once each is canonicalised.
            first_formats = [r["Input Formats"].split(";")[0] for r in variant_rows]
            assert first_formats == ["FORMAT_" + r["Input Formats"].split(";")[0] for r in base_rows]
            variant_rows = [{c: canonical_field(c, v) if c in spelled else v for c, v in r.items()}
                            for r in variant_rows]
            base_rows = [{c: canonical_field(c, v) if c in spelled else v for c, v in r.items()} for r in base_rows]
        assert variant_rows == base_rows


@pytest.mark.parametrize("how", ["bom", "quote_all"])
def test_encoding_and_quoting_variants(tmp_path, how):
    header, rows = fixture_table()
    write_table(tmp_path / "kernel_details.csv", header, rows, bom=how == "bom", quote_all=how == "quote_all")
    parse_profiles([FIXTURE], tmp_path / "base")
    parse_profiles([tmp_path / "kernel_details.csv"], tmp_path / "variant")
    for kernel_type in FIXTURE_TYPES:
        assert read_csv(tmp_path / "variant" / f"{kernel_type}.csv") == read_csv(tmp_path / "base" / f"{kernel_type}.csv")


def test_without_op_state_column_the_field_is_empty(tmp_path):
    header, rows = _drop("OP State")(*fixture_table())
    write_table(tmp_path / "kernel_details.csv", header, rows)
    parse_profiles([tmp_path / "kernel_details.csv"], tmp_path / "out")
    (row,) = read_csv(tmp_path / "out" / "MatMulV2.csv")
    assert row["OP State"] == "" and row["Profiling Average Duration(us)"] == "187.64875"


def test_other_counter_set_gives_other_counter_columns(tmp_path):
    """--aic-metrics decides the counters: the output follows whatever numeric counters the file has."""
    header, rows = fixture_table()
    keep = header.index("aic_mte2_ratio")
    header, rows = header[:header.index("Context ID") + 1] + ["aic_mte2_ratio", "vec_bankgroup_cflt_ratio"], [
        r[:header.index("Context ID") + 1] + [r[keep], "0.5"] for r in rows]
    write_table(tmp_path / "kernel_details.csv", header, rows)
    parse_profiles([tmp_path / "kernel_details.csv"], tmp_path / "out")
    columns = read_header(tmp_path / "out" / "MatMulV2.csv")
    assert [c for c in columns if c.startswith("Profiling Average ") and "Duration" not in c] == [
        "Profiling Average aic_mte2_ratio", "Profiling Average vec_bankgroup_cflt_ratio"]
    (row,) = read_csv(tmp_path / "out" / "MatMulV2.csv")
    assert row["Profiling Average aic_mte2_ratio"] == expected_number((0.964 + 0.967 + 0.967 + 0.968) / 4)
    assert row["Profiling Average vec_bankgroup_cflt_ratio"] == "0.5"


def test_msprof_op_summary(tmp_path):
    header, rows = _rename_exact(OP_SUMMARY_NAMES)(*fixture_table())
    path = write_table(tmp_path / "PROF_000001_20250109_aaa" / "mindstudio_profiler_output" /
                       "op_summary_20250109.csv", header, rows)
    parse_profiles([path], tmp_path / "from_file")
    parse_profiles([tmp_path], tmp_path / "from_dir")
    parse_profiles([FIXTURE], tmp_path / "base")
    for kernel_type in FIXTURE_TYPES:
        base = read_csv(tmp_path / "base" / f"{kernel_type}.csv")
        assert read_csv(tmp_path / "from_file" / f"{kernel_type}.csv") == base
        assert read_csv(tmp_path / "from_dir" / f"{kernel_type}.csv") == base


def test_torch_npu_bundle_is_not_counted_twice(tmp_path):
    """A bundle holds kernel_details.csv and the op_summary it was made from: the same launches, used once."""
    header, rows = fixture_table()
    bundle = tmp_path / "profiles" / "node0_1234_20250109_ascend_pt"
    write_table(bundle / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv", header, rows)
    summary_header, summary_rows = _rename_exact(OP_SUMMARY_NAMES)(header, rows)
    write_table(bundle / "PROF_000001_x" / "mindstudio_profiler_output" / "op_summary_1.csv", summary_header,
                summary_rows)
    write_table(bundle / "PROF_000001_x" / "device_0" / "summary" / "op_summary_0_1.csv", summary_header,
                summary_rows)
    parse_profiles([tmp_path / "profiles"], tmp_path / "out")
    (row,) = read_csv(tmp_path / "out" / "MatMulV2.csv")
    assert row["Profiling Sample Count"] == "4"


def test_standalone_prof_dir_uses_one_export(tmp_path):
    header, rows = _rename_exact(OP_SUMMARY_NAMES)(*fixture_table())
    prof = tmp_path / "PROF_000002_y"
    write_table(prof / "mindstudio_profiler_output" / "op_summary_2.csv", header, rows)
    write_table(prof / "device_0" / "summary" / "op_summary_0_1.csv", header, rows)
    parse_profiles([tmp_path], tmp_path / "out")
    (row,) = read_csv(tmp_path / "out" / "MatMulV2.csv")
    assert row["Profiling Sample Count"] == "4"


def test_several_profiles_merge_into_one_database(tmp_path):
    header, rows = fixture_table()
    second = write_table(tmp_path / "b" / "kernel_details_1.csv", header, rows)
    parse_profiles([FIXTURE, second], tmp_path / "out")
    (row,) = read_csv(tmp_path / "out" / "MatMulV2.csv")
    assert row["Profiling Sample Count"] == "8"
    assert row["Profiling Average Duration(us)"] == "187.64875"
    assert row["Profiling Std Duration(us)"] == "1.848645"     # the same values twice: same population std


def test_reparse_replaces_outputs_and_drops_stale_kernel_types(tmp_path):
    out = tmp_path / "out"
    parse_profiles([FIXTURE], out)
    header, rows = fixture_table()
    type_column = header.index("Type")
    only_matmul = write_table(tmp_path / "kernel_details.csv", header, [r for r in rows if r[type_column] == "MatMulV2"])
    (out / "notes.txt").write_text("not ours")
    parse_profiles([only_matmul], out)
    assert (out / "kernel_types.txt").read_text() == "MatMulV2\n"
    assert sorted(p.name for p in out.iterdir()) == ["MatMulV2.csv", "kernel_types.txt", "notes.txt"]
    assert not list(tmp_path.glob(".out.*"))


def test_parse_traces_per_kernel_type(tmp_path):
    parse_profiles([FIXTURE], tmp_path / "out", trace_dir=tmp_path / "traces", task_id="T1")
    files = sorted(p.name for p in (tmp_path / "traces" / "MatMulV2").iterdir())
    assert files == ["IT1_S01_MatMulV2_PARSE_error_log.txt", "IT1_S01_MatMulV2_PARSE_result.txt",
                     "IT1_S01_MatMulV2_PARSE_spec.txt"]
    spec = (tmp_path / "traces" / "MatMulV2" / "IT1_S01_MatMulV2_PARSE_spec.txt").read_text()
    assert f"{FIXTURE}\t4 rows" in spec
    result = (tmp_path / "traces" / "MatMulV2" / "IT1_S01_MatMulV2_PARSE_result.txt").read_text()
    assert "1 groups from 4 rows" in result and "187.64875" in result


def test_cli_derives_the_database_directory(tmp_path):
    done = run_parse("--profiling-path", FIXTURE, "--device", "ATLAS_800_A3_752T_128G_DIE", "--vllm-version", "0.18.0",
                     "--torch-version", "2.9.0", "--cann-version", "8.5", "--data-root", tmp_path / "data",
                     "--log-level", "warning")
    assert done.returncode == 0, done.stderr
    out = tmp_path / "data" / "A3" / "vllm_ascend" / "vllm0.18.0_torch2.9.0_cann8.5"
    assert (out / "kernel_types.txt").read_text().split() == FIXTURE_TYPES
    assert "wrote 5 kernel type CSV(s)" in done.stdout


def test_cli_help_explains_inputs():
    done = run_parse("--help")
    assert done.returncode == 0
    for flag in ("--profiling-path", "--database-path", "--device", "--vllm-version", "--trace-dir"):
        assert flag in done.stdout


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["MatMulV2", "Add", "muls_add_kernel_1", "muls_add_kernel"]),
                          st.sampled_from(["4,8;8,16", "2,2", ";"]),
                          st.integers(min_value=0, max_value=10_000_000)), min_size=1, max_size=40))
def test_statistics_match_python_statistics(tmp_path_factory, samples):
    directory = tmp_path_factory.mktemp("prop")
    header = ["Type", "OP State", "Accelerator Core", "Duration(us)", "Input Shapes", "Input Data Types",
              "Input Formats", "Output Shapes", "Output Data Types", "Output Formats", "aicore_time(us)"]
    rows = [[t, "dynamic", "AI_CORE", f"{d / 1000:.3f}", f'"{s}"', "DT_BF16", "ND", '"1"', "DT_BF16", "ND",
             f"{d / 2000:.4f}"] for t, s, d in samples]
    write_table(directory / "kernel_details.csv", header, rows)
    parse_profiles([directory / "kernel_details.csv"], directory / "out")
    got = parsed_groups(directory / "out")
    groups: dict = {}
    for t, s, d in samples:
        groups.setdefault(("muls_add_kernel" if t.startswith("muls_add") else t, s), []).append(d)
    assert len(got) == len(groups)
    for (t, s), ds in groups.items():
        row = got[(t, s, "1")]
        values = [d / 1000 for d in ds]
        for column, exact in (("Profiling Average Duration(us)", statistics.mean(values)),
                              ("Profiling Median Duration(us)", statistics.median(values)),
                              ("Profiling Std Duration(us)", statistics.pstdev(values))):
            assert abs(float(row[column]) - exact) <= 5.1e-7 + 1e-12 * abs(exact), column
        assert row["Profiling Sample Count"] == str(len(ds))


@given(st.floats(min_value=-1e12, max_value=1e12, allow_nan=False))
def test_number_format(value):
    assert format_number(value) == expected_number(value)
    assert abs(float(format_number(value)) - value) <= 5e-7 * max(1.0, abs(value) / 1e6)


def test_number_format_examples():
    assert [format_number(v) for v in (187.64875, 5295467.0, 0.0, -0.0, 1e-9, 2.5, None, float("nan"))] == [
        "187.64875", "5295467", "0", "0", "0", "2.5", "", ""]


@pytest.mark.parametrize("block_bytes", [100, 700, 4096])     # 100: lines longer than a block
def test_block_reading_gives_the_same_database(tmp_path, monkeypatch, block_bytes):
    """Large files are read a block of lines at a time: lines cut by a block boundary must not matter."""
    import opperf.parse.kernel_details as kernel_details

    header, rows = fixture_table()
    path = write_table(tmp_path / "kernel_details.csv", header, rows * 7, bom=True)
    parse_profiles([path], tmp_path / "whole")
    monkeypatch.setattr(kernel_details, "BLOCK_BYTES", block_bytes)
    parse_profiles([path], tmp_path / "blocks")
    for kernel_type in FIXTURE_TYPES:
        assert (tmp_path / "blocks" / f"{kernel_type}.csv").read_text() == \
            (tmp_path / "whole" / f"{kernel_type}.csv").read_text()
    (row,) = read_csv(tmp_path / "blocks" / "MatMulV2.csv")
    assert row["Profiling Sample Count"] == "28"
