"""Kernel definitions fit the rows of their type: an op's overloads (`overloads`, told apart by slot count) replay
through the definition, a definition that fits no row is refused, and what a replay writes into a database names
no directory of the host that built it.

tests/data/replay/h200_queries/ holds the `arange` and `sort` query rows of an H200 database (the performance
model's own calls, aten.arange.default and aten.sort.default) that replayed from the op's schema because the
definitions described only the profiled overloads.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from opperf import contract
from opperf.database.build import build_database_directory
from opperf.errors import OpperfError
from opperf.replay.definitions import DEFAULT_DEFINITIONS_DIR, load_definition
from opperf.replay.engine import STATUS_FAILED_BUILD, STATUS_OK, replay_row
from opperf.replay.job import ReplaySettings, replay_kernel_csv
from opperf.replay.timing import CpuProfilerTimer

REPO = Path(__file__).resolve().parent.parent
QUERIES = REPO / "tests" / "data" / "replay" / "h200_queries"
CPU_ROWS = pd.read_csv(REPO / "tests" / "data" / "replay" / "cpu_rows.csv", dtype=str, keep_default_na=False)
TORCH_DEFINITIONS = DEFAULT_DEFINITIONS_DIR / "torch"
SETTINGS = dict(repeat_count=2, warmup_count=1, cpu_threads=1)


def cpu_row(kernel_type: str, **fields: str) -> dict[str, str]:
    row = CPU_ROWS[CPU_ROWS["Type"] == kernel_type].drop(columns=["Type"]).iloc[0].to_dict()
    return {**row, **fields}


def read(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, dtype=str, keep_default_na=False)


@pytest.mark.parametrize("kernel_type, count", [("arange", 55), ("sort", 31)])
def test_the_models_arange_and_sort_queries_replay_through_their_definitions(kernel_type, count):
    definition, timer = load_definition(TORCH_DEFINITIONS / f"{kernel_type}.yaml"), CpuProfilerTimer()
    rows = read(QUERIES / f"{kernel_type}.csv").to_dict(orient="records")
    assert len(rows) == count
    for line, row in enumerate(rows, start=2):
        outcome = replay_row(definition, row, backend="cpu", device="cpu", timer=timer, repeat_count=2,
                             warmup_count=1, path=QUERIES / f"{kernel_type}.csv", line=line)
        assert (outcome.status, outcome.recipe) == (STATUS_OK, f"definition config/kernels/torch/{kernel_type}.yaml"), \
            (line, outcome.error)


def test_no_file_of_a_database_names_a_directory_of_the_host_that_built_it(tmp_path):
    """Rows replayed and a database built with absolute paths everywhere, as a benchmark or a persistent replay
    server names them: recipes, errors and op_mapping.yaml name files by their repository path or not at all."""
    rows_dir, replayed = tmp_path / "rows", tmp_path / "replayed"
    rows_dir.mkdir()
    read(QUERIES / "arange.csv").head(3).to_csv(rows_dir / "arange.csv", index=False)
    # mm: a plain row, an mm.out row (3 slots: another overload, built from the schema) and one that cannot be built.
    out_variant = cpu_row("mm", **{contract.INPUT_SHAPES: "4,8;8,6;4,6", contract.INPUT_DTYPES: "DT_FLOAT;DT_FLOAT;DT_FLOAT",
                                   contract.INPUT_FORMATS: "ND;ND;ND", contract.INPUT_SCALARS: ";;",
                                   contract.INPUT_STRIDES: "", contract.OUTPUT_SHAPES: "4,6"})
    bad_strides = cpu_row("mm", **{contract.INPUT_SHAPES: "8,256;256,512", contract.INPUT_STRIDES: "1;",
                                   contract.OUTPUT_SHAPES: "8,512"})
    pd.DataFrame([cpu_row("mm"), out_variant, bad_strides]).to_csv(rows_dir / "mm.csv", index=False)
    for kernel_type in ("arange", "mm"):
        replay_kernel_csv(rows_dir / f"{kernel_type}.csv", kernel_type, DEFAULT_DEFINITIONS_DIR,
                          replayed / f"{kernel_type}.csv", ReplaySettings(**SETTINGS), version_dir=None)
    mm = read(replayed / "mm.csv")
    assert mm[contract.REPLAY_STATUS].tolist() == [STATUS_OK, STATUS_OK, STATUS_FAILED_BUILD]
    # The recipe whole: which overload the schema chose and why the definition did not build the row.
    assert mm[contract.REPLAY_RECIPE].tolist()[:2] == [
        "definition config/kernels/torch/mm.yaml",
        "schema aten::mm.out (definition config/kernels/torch/mm.yaml does not fit this row: field 'Input Shapes': "
        "the row has 3 input slots; the definition takes 2)"]
    assert mm[contract.REPLAY_ERROR].tolist()[2] == ("field 'Input Strides': slot 0 has strides [1] but shape "
                                                     "[8, 256] (one stride per dimension)")

    database = tmp_path / "data" / "CPU" / "torch" / "torch2.13.0_cpu"
    build_database_directory(replayed, "CPU", database, REPO / "config" / "devices.yaml", DEFAULT_DEFINITIONS_DIR)
    mapping = yaml.safe_load((database / "op_mapping.yaml").read_text())
    assert mapping["opperf"]["kernel_types"]["arange"]["definition"] == "config/kernels/torch/arange.yaml"
    files = [p for p in database.rglob("*") if p.is_file()]
    assert {p.relative_to(database).as_posix() for p in files} >= {"mm.csv", "layouts/arange.csv", "op_mapping.yaml"}
    for path in files:
        text = path.read_text()
        for directory in (str(tmp_path), str(REPO), str(Path.cwd())):
            assert directory not in text, (path.name, directory)


def _overload_row(kernel_type: str, shapes: str, dtypes: str, scalars: str, out_shapes: str, out_dtypes: str):
    return cpu_row(kernel_type, **{contract.INPUT_SHAPES: shapes, contract.INPUT_DTYPES: dtypes,
                                   contract.INPUT_FORMATS: "", contract.INPUT_SCALARS: scalars,
                                   contract.INPUT_STRIDES: "", contract.OUTPUT_SHAPES: out_shapes,
                                   contract.OUTPUT_DTYPES: out_dtypes, contract.OUTPUT_FORMATS: ""})


@pytest.mark.parametrize("kernel_type, row, recipe, call", [
    # arange(end): the model's call, as the H200 queries hold it
    ("arange", (";;;;", ";;;;", "12;;;;False", "12", "DT_INT64"), "",
     "torch.ops.aten.arange.default(12, device=device(type='cpu'), pin_memory=False)"),
    # arange(start, end, dtype=torch.float32): the dtype recorded as its ScalarType code
    ("arange", (";;;;;", ";;;;;", "2;12;6;;;False", "10", "DT_FLOAT"), " overloads[0]",
     "torch.ops.aten.arange.start(2, 12, dtype=torch.float32, device=device(type='cpu'), pin_memory=False)"),
    ("arange", (";;;;;;", ";;;;;;", "2;12;3;;;;False", "4", "DT_INT64"), " overloads[1]",
     "torch.ops.aten.arange.start_step(2, 12, 3, device=device(type='cpu'), pin_memory=False)"),
    # the profiled call inside them: into an out= tensor
    ("arange", (";;;0", ";;;DT_INT64", "0;1024;1;", "1024", "DT_INT64"), " overloads[2]",
     "torch.ops.aten.arange.start_out(0, 1024, 1, out=Tensor(0,):int64)"),
    ("sort", ("12;;", "DT_INT64;;", ";-1;False", "12;12", "DT_INT64;DT_INT64"), "",
     "torch.ops.aten.sort(Tensor(12,):int64, dim=-1, descending=False)"),
    ("sort", ("12;;;", "DT_INT64;;;", ";True;0;True", "12;12", "DT_INT64;DT_INT64"), " overloads[0]",
     "torch.ops.aten.sort(Tensor(12,):int64, stable=True, dim=0, descending=True)"),
    # a router's max/min along a dim (max.dim: values and indices), beside the whole-tensor one a profile records
    ("max", ("8,16;;", "DT_FLOAT;;", ";-1;False", "8;8", "DT_FLOAT;DT_INT64"), " overloads[0]",
     "torch.ops.aten.max.dim(Tensor(8, 16):float32, -1, False)"),
    ("min", ("8,16", "DT_FLOAT", "", "", "DT_FLOAT"), "", "torch.ops.aten.min(Tensor(8, 16):float32)"),
    ("min", ("8,16;;", "DT_FLOAT;;", ";1;True", "8,1;8,1", "DT_FLOAT;DT_INT64"), " overloads[0]",
     "torch.ops.aten.min.dim(Tensor(8, 16):float32, 1, True)"),
])
def test_each_overload_a_row_holds_replays_through_its_layout(kernel_type, row, recipe, call):
    definition = load_definition(TORCH_DEFINITIONS / f"{kernel_type}.yaml")
    outcome = replay_row(definition, _overload_row(kernel_type, *row), backend="cpu", device="cpu",
                         timer=CpuProfilerTimer(), repeat_count=2, warmup_count=1)
    assert outcome.status == STATUS_OK, outcome.error
    assert outcome.recipe == f"definition config/kernels/torch/{kernel_type}.yaml{recipe}"
    assert outcome.call == call


def test_a_dtype_slot_that_names_no_dtype_is_an_error_naming_the_field():
    from opperf.replay.inputs import build_case

    row = _overload_row("arange", ";;;;", ";;;;", "12;99;;;False", "12", "DT_INT64")
    with pytest.raises(OpperfError) as error:
        build_case(load_definition(TORCH_DEFINITIONS / "arange.yaml"), row, "cpu", path="rows.csv", line=4)
    assert error.value.field == contract.INPUT_SCALARS and error.value.row == 4
    assert "input slot 1 is a dtype, but the row recorded 99" in str(error.value)


def three_slot_mm(tmp_path: Path) -> Path:
    """config/kernels/torch/mm.yaml edited to declare a third input slot that mm's rows do not have."""
    definition = yaml.safe_load((TORCH_DEFINITIONS / "mm.yaml").read_text())
    definition["inputs"].append({"role": "tensor"})
    path = tmp_path / "edited" / "mm.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(definition))
    return path


def mm_rows(path: Path, count: int = 3) -> Path:
    pd.DataFrame([cpu_row("mm", **{contract.INPUT_SHAPES: f"{m},256;256,512", contract.OUTPUT_SHAPES: f"{m},512"})
                  for m in range(1, count + 1)]).to_csv(path, index=False)
    return path


def test_a_definition_that_fits_none_of_its_rows_is_refused_naming_file_type_and_both_slot_counts(tmp_path):
    definition, rows, output = three_slot_mm(tmp_path), mm_rows(tmp_path / "mm.csv"), tmp_path / "out.csv"
    with pytest.raises(OpperfError) as error:
        replay_kernel_csv(rows, "mm", None, output, ReplaySettings(**SETTINGS), version_dir=None,
                          definition_path=definition)
    assert str(error.value) == (
        f"{definition}, field 'inputs': kernel type 'mm': the definition declares 3 input slots, the 3 rows of {rows} "
        "have 2; it fits no row (give `inputs`, or an `overloads` entry, one entry per slot)")
    assert not output.exists()


def test_the_replay_cli_refuses_it_in_one_line_with_exit_2_and_the_workflows_directory_lookup_too(tmp_path, capsys):
    from opperf.cli import run_cli

    spec = importlib.util.spec_from_file_location("replay_script", REPO / "scripts" / "replay.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    definition, rows, output = three_slot_mm(tmp_path), mm_rows(tmp_path / "mm.csv"), tmp_path / "out.csv"
    code = run_cli(script.build_parser(), script.main, ["--rows", str(rows), "--kernel", "mm", "--backend", "cpu",
                                                        "--definition", str(definition), "--output", str(output)])
    error = capsys.readouterr().err
    assert code == 2 and not output.exists()
    assert error.count("\n") == 1 and "the definition declares 3 input slots" in error and "have 2" in error
    # The workflow's form: the definition found in a definitions directory (config/kernels/torch/mm.yaml there).
    tree = tmp_path / "kernels" / "torch"
    tree.mkdir(parents=True)
    shutil.copy(definition, tree / "mm.yaml")
    with pytest.raises(OpperfError, match="kernel type 'mm': the definition declares 3 input slots"):
        replay_kernel_csv(rows, "mm", tmp_path / "kernels", output, ReplaySettings(**SETTINGS), version_dir=None)


def test_a_definition_that_fits_some_rows_replays_them_and_says_how_many_it_left_to_the_schema(tmp_path, caplog):
    rows = tmp_path / "mm.csv"
    out_variant = cpu_row("mm", **{contract.INPUT_SHAPES: "4,8;8,6;4,6", contract.INPUT_DTYPES: "DT_FLOAT;DT_FLOAT;DT_FLOAT",
                                   contract.INPUT_FORMATS: "ND;ND;ND", contract.INPUT_SCALARS: ";;",
                                   contract.INPUT_STRIDES: "", contract.OUTPUT_SHAPES: "4,6"})
    pd.DataFrame([cpu_row("mm"), out_variant]).to_csv(rows, index=False)
    job = replay_kernel_csv(rows, "mm", DEFAULT_DEFINITIONS_DIR, tmp_path / "out.csv", ReplaySettings(**SETTINGS),
                            version_dir=None)
    assert job.status_counts() == {STATUS_OK: 2}
    assert ("mm: 1 of 2 rows have a slot count config/kernels/torch/mm.yaml does not take (it takes 2): built from "
            "the op's schema, as their Replay Recipe says") in caplog.text


def test_every_torch_definition_takes_the_argument_count_of_an_overload_of_its_op():
    """A trace records every schema argument of a call, so a row's slot count is its overload's argument count: a
    definition taking none of its op's counts in the installed torch fits no row and its jobs are refused (torch 2.11
    records _flash_attention_forward with 15 slots, 2.13 with 17, where the definition once took 10 or 11)."""
    import torch

    from opperf.replay.definitions import load_definitions

    for name, definition in sorted(load_definitions(TORCH_DEFINITIONS).items()):
        if not definition.layouts:
            continue            # a hook builds every layout itself (cat, stack)
        for layout in definition.layouts:
            assert layout.api.startswith("torch.ops."), (name, layout.api)      # what a torch row's schema names
            namespace, op = layout.api.split(".")[2:4]
            packet = getattr(getattr(torch.ops, namespace), op)
            counts = {len(getattr(packet, overload)._schema.arguments) for overload in packet.overloads()}
            assert counts & set(layout.slot_counts), (name, layout.where, sorted(counts), list(layout.slot_counts))
