"""Database stage: contract checks, column order, atomic writes, op_mapping.yaml."""

from __future__ import annotations

import pytest
import yaml

from opperf import contract
from opperf.database.build import build_op_mapping, finalise_kernel_csv, write_manifest
from opperf.errors import OpperfError

HEADER = ("OP State,Accelerator Core,Input Shapes,Input Data Types,Input Formats,Output Shapes,"
          "Output Data Types,Output Formats,Profiling Average Duration(us),Profiling Median Duration(us),"
          "Profiling Std Duration(us),Profiling Average aicore_time(us),source,Average Duration(us),"
          "MicroBench aicore_time(us)")
ROWS = [
    "dynamic,AI_CORE,\"81920,4096;8192,512\",DT_BF16;DT_BF16,ND;ND,\"4096,512\",DT_BF16,ND,187.64875,187.2735,"
    "1.8,184.9,profiled,190.1,185.0",
    "dynamic,AI_CORE,\"16,4096;8192,512\",DT_BF16;DT_BF16,ND;ND,\"16,512\",DT_BF16,ND,,,,,generated,,",
    "dynamic,AI_CORE,\"32,4096;8192,512\",DT_BF16;DT_BF16,ND;ND,\"32,512\",DT_BF16,ND,,,,,,,",
]


def write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_kernel_csv_is_written_in_contract_order_without_losing_rows(tmp_path):
    rows = write(tmp_path / "in.csv", [HEADER, *ROWS])
    out = tmp_path / "db" / "MatMulV2.csv"
    assert finalise_kernel_csv(rows, "MatMulV2", out) == 3
    lines = out.read_text().splitlines()
    assert lines[0].split(",")[8:12] == ["Average Duration(us)", "Profiling Average Duration(us)",
                                         "Profiling Median Duration(us)", "Profiling Std Duration(us)"]
    assert lines[0].endswith("MicroBench aicore_time(us),Profiling Average aicore_time(us),source,Runtime Key Rows")
    assert len(lines) == 4
    # Rows with no source are profiled rows; generated stays generated; each row is its own runtime key;
    # the runtime's CSV lists larger calls first (81920 x 4096, then 32 x 4096, then 16 x 4096).
    assert [line.rsplit(",", 2)[1:] for line in lines[1:]] == [["profiled", "1"], ["profiled", "1"],
                                                               ["generated", "1"]]
    # Shape cells carry the profiler's literal quotes (csv doubles them), as the runtime's reader expects.
    assert lines[1].startswith('dynamic,AI_CORE,"""81920,4096;8192,512""",DT_BF16;DT_BF16,ND;ND,"""4096,512""",'
                               "DT_BF16,ND,190.1,187.64875,187.2735,1.8,185.0,184.9,")
    assert (tmp_path / "db" / "layouts" / "MatMulV2.csv").read_text().count("\n") == 4


@pytest.mark.parametrize("bad_row, field, message", [
    ("dynamic,AI_CORE,\"81920,x;8192,512\",DT_BF16;DT_BF16,ND;ND,\"4096,512\",DT_BF16,ND,1,1,0,1,,,",
     "Input Shapes", "bad dimension 'x' in shape '81920,x'"),
    ("dynamic,AI_CORE,\"81920,4;8192,512\",DT_BF16,ND;ND,\"4096,512\",DT_BF16,ND,1,1,0,1,,,",
     "Input Data Types", "1 slot(s) but Input Shapes has 2"),
])
def test_bad_rows_name_file_line_field_and_leave_no_output(tmp_path, bad_row, field, message):
    rows = write(tmp_path / "in.csv", [HEADER, ROWS[0], bad_row])
    out = tmp_path / "db" / "MatMulV2.csv"
    with pytest.raises(OpperfError) as info:
        finalise_kernel_csv(rows, "MatMulV2", out)
    assert str(info.value) == f"{rows}, line 3, field '{field}': {message}"
    assert not out.exists()
    assert not (tmp_path / "db").exists() or not any((tmp_path / "db").iterdir())


def test_missing_contract_column_is_an_error(tmp_path):
    rows = write(tmp_path / "in.csv", [HEADER.replace("Output Formats", "Output Fmt"), ROWS[0]])
    with pytest.raises(OpperfError, match="missing required column.*Output Formats"):
        finalise_kernel_csv(rows, "MatMulV2", tmp_path / "out.csv")


def test_hostile_kernel_name_never_becomes_a_path(tmp_path):
    rows = write(tmp_path / "in.csv", [HEADER, ROWS[0]])
    with pytest.raises(OpperfError, match="path separator"):
        finalise_kernel_csv(rows, "../../x", tmp_path / "db" / "x.csv")


def test_existing_database_file_survives_a_failed_rewrite(tmp_path):
    out = tmp_path / "MatMulV2.csv"
    out.write_text("old complete content\n")
    rows = write(tmp_path / "in.csv", [HEADER, ROWS[0].replace("81920,4096", "81920,-1")])
    with pytest.raises(OpperfError):
        finalise_kernel_csv(rows, "MatMulV2", out)
    assert out.read_text() == "old complete content\n"


def _build_directory(repo, rows_dir, output, *flags):
    """scripts/build_database.py directory, in process: (exit code, stdout, stderr)."""
    import contextlib
    import importlib.util
    import io

    from opperf.cli import run_cli

    spec = importlib.util.spec_from_file_location("build_database_script", repo / "scripts" / "build_database.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_cli(script.build_parser(), script.main,
                       ["directory", "--rows-dir", str(rows_dir), "--device", "CPU", "--output", str(output),
                        "--devices", str(repo / "config" / "devices.yaml"),
                        "--definitions", str(repo / "config" / "kernels"), *flags])
    return code, out.getvalue(), err.getvalue()


def test_a_database_is_written_over_another_only_with_overwrite_and_then_keeps_no_stale_file(tmp_path, repo):
    import shutil

    replayed = repo / "tests" / "data" / "database" / "cpu_replayed"       # add, cat, copy_, mm, sum
    database = tmp_path / "data" / "CPU" / "torch" / "torch2.13.0_cpu"
    assert _build_directory(repo, replayed, database)[0] == 0
    (database / "reports").mkdir()
    (database / "reports" / "replay_report.md").write_text("the old database's report\n")
    before = {p: p.read_bytes() for p in database.rglob("*") if p.is_file()}
    smaller = tmp_path / "rows"                                            # another build: add and mm only
    smaller.mkdir()
    for kernel in ("add", "mm"):
        shutil.copy(replayed / f"{kernel}.csv", smaller / f"{kernel}.csv")

    code, out, err = _build_directory(repo, smaller, database)
    assert code == 2 and out == ""
    assert err == (f"error: {database}, field '--overwrite': already holds a database of 5 kernel types; give "
                   "--overwrite to replace it (kernel types the new build lacks are removed), or another --output\n")
    assert {p: p.read_bytes() for p in database.rglob("*") if p.is_file()} == before

    code, out, err = _build_directory(repo, smaller, database, "--overwrite")
    assert code == 0
    assert out.splitlines() == [
        f"replaced the database in {database}: 2 kernel types rewritten, 0 added, 3 removed",
        "  rewritten: add, mm",
        "  removed (CSV and layouts file): cat, copy_, sum",
        "  other files removed: reports/replay_report.md"]
    assert sorted(str(p.relative_to(database)) for p in database.rglob("*") if p.is_file()) == [
        "add.csv", "layouts/add.csv", "layouts/mm.csv", "mm.csv", "msmodeling_device.py", "op_mapping.yaml"]
    mapping = yaml.safe_load((database / "op_mapping.yaml").read_text())
    assert mapping["version"] == "torch2.13.0_cpu" and set(mapping["opperf"]["kernel_types"]) == {"add", "mm"}
    assert [p.name for p in database.parent.iterdir()] == ["torch2.13.0_cpu"]    # no staging directory left


def test_op_mapping_is_generated_from_kernel_definitions(tmp_path, repo):
    database = tmp_path / "data" / "CPU" / "torch" / "torch2.13.0_cpu"
    rows = write(tmp_path / "in.csv", [HEADER, ROWS[0]])
    finalise_kernel_csv(rows, "mm", database / "mm.csv")
    finalise_kernel_csv(rows, "unknown_op", database / "unknown_op.csv")
    finalise_kernel_csv(rows, "clone", database / "clone.csv")
    output = database / "op_mapping.yaml"
    build_op_mapping([database / "mm.csv", database / "unknown_op.csv", database / "clone.csv"], "CPU",
                     repo / "config" / "devices.yaml", repo / "config" / "kernels", output, collected_at="2026-11-22")
    document = yaml.safe_load(output.read_text())
    # The peer runtime's keys, first, in its spelling; opperf's own under `opperf`.
    assert list(document)[:4] == ["version", "device", "pytorch_version", "collection_date"]
    assert document["version"] == "torch2.13.0_cpu" and document["device"] == "GENERIC_HOST_CPU"
    assert document["pytorch_version"] == "2.13.0" and document["collection_date"] == "2026-11-22"
    assert "cann_version" not in document and "communication_data_ref" not in document
    own = document["opperf"]
    assert own["device"] == "CPU" and own["backend"] == "cpu" and own["versions"] == {"torch": "2.13.0"}
    mm_definition = yaml.safe_load((repo / "config" / "kernels" / "torch" / "mm.yaml").read_text())
    assert own["kernel_types"]["mm"]["replay_api"] == mm_definition["api"]
    assert own["kernel_types"]["mm"]["rows"] == 1
    assert own["kernel_types"]["unknown_op"]["replay_api"] is None
    # A copy's definition says it runs as a device memcpy when dense (the holdout's branch); others say nothing.
    assert own["kernel_types"]["clone"]["memcpy_when_dense"] is True
    assert "memcpy_when_dense" not in own["kernel_types"]["mm"]
    assert document["operator_mappings"]["aten.mm.default"] == {"kernel_type": "mm", "alternate_kernel_types": [],
                                                                "category": "matmul"}


def test_op_mapping_resolves_alternate_kernel_types(tmp_path, repo):
    """An A3 database that saw MatMulV3 (never MatMulV2) maps aten.mm to MatMulV3 via MatMulV2's definition."""
    database = tmp_path / "data" / "A3" / "vllm_ascend" / "vllm0.18.0_torch2.9.0_cann8.5"
    rows = write(tmp_path / "in.csv", [HEADER, ROWS[0]])
    finalise_kernel_csv(rows, "MatMulV3", database / "MatMulV3.csv")
    build_op_mapping([database / "MatMulV3.csv"], "A3", repo / "config" / "devices.yaml",
                     repo / "config" / "kernels", database / "op_mapping.yaml")
    document = yaml.safe_load((database / "op_mapping.yaml").read_text())
    matmul = yaml.safe_load((repo / "config" / "kernels" / "npu" / "MatMulV2.yaml").read_text())
    assert document["version"] == "vllm0.18.0_torch2.9.0_cann8.5"
    assert document["device"] == "ATLAS_800_A3_752T_128G_DIE"
    assert document["cann_version"] == "8.5" and document["pytorch_version"] == "2.9.0"
    assert document["communication_data_ref"] == "../../hccl/v8.5"
    assert document["opperf"]["versions"] == {"torch": "2.9.0", "vllm": "0.18.0", "cann": "8.5"}
    kernel = document["opperf"]["kernel_types"]["MatMulV3"]
    assert kernel["replay_api"] == (matmul.get("api") or f"{matmul['hook']}.build_case")
    assert document["operator_mappings"]["aten.mm.default"] == {"kernel_type": "MatMulV3", "alternate_kernel_types": [],
                                                                "category": "matmul"}


def test_op_mapping_reads_the_family_directory_the_workflow_passes(tmp_path, repo):
    """rule database_op_mapping passes config/kernels/npu (the family), not config/kernels."""
    database = tmp_path / "data" / "A3" / "vllm_ascend" / "vllm0.18.0_torch2.9.0_cann8.5"
    rows = write(tmp_path / "in.csv", [HEADER, ROWS[0]])
    finalise_kernel_csv(rows, "Add", database / "Add.csv")
    document = build_op_mapping([database / "Add.csv"], "A3", repo / "config" / "devices.yaml",
                                repo / "config" / "kernels" / "npu", database / "op_mapping.yaml")
    assert document["operator_mappings"]["aten.add.Tensor"] == {
        "kernel_type": "Add", "alternate_kernel_types": [], "category": "elementwise", "query_mode": "elementwise"}
    assert document["opperf"]["kernel_types"]["Add"]["replay_api"] == "torch.add"


def test_op_mapping_names_why_a_kernel_type_is_not_replayed(tmp_path, repo):
    database = tmp_path / "data" / "A3" / "vllm_ascend" / "vllm0.18.0_torch2.9.0_cann8.5"
    rows = write(tmp_path / "in.csv", [HEADER, ROWS[0]])
    finalise_kernel_csv(rows, "MemSet", database / "MemSet.csv")
    build_op_mapping([database / "MemSet.csv"], "A3", repo / "config" / "devices.yaml", repo / "config" / "kernels",
                     database / "op_mapping.yaml")
    kernel = yaml.safe_load((database / "op_mapping.yaml").read_text())["opperf"]["kernel_types"]["MemSet"]
    assert kernel["replay_api"] is None and kernel["not_replayed"] == "runtime_internal"
    assert "zeroes" in kernel["not_replayed_because"]


def test_manifest_lists_files_and_row_counts(tmp_path):
    rows = write(tmp_path / "a.csv", [HEADER, *ROWS])
    (tmp_path / "op_mapping.yaml").write_text("x: 1\n")
    write_manifest([rows, tmp_path / "op_mapping.yaml"], tmp_path / "manifest.tsv")
    assert (tmp_path / "manifest.tsv").read_text().splitlines() == [
        "file\trows", f"{rows}\t3", f"{tmp_path / 'op_mapping.yaml'}\t"]


def test_contract_columns_are_the_peers_names():
    assert contract.BASE_COLUMNS == ("OP State", "Accelerator Core", "Input Shapes", "Input Data Types",
                                     "Input Formats", "Output Shapes", "Output Data Types", "Output Formats")
    assert contract.REPLAY_AVERAGE == "Average Duration(us)"
