"""The grid stage end to end: the real Ascend fixture, byte-identical reruns, the CLI, no partial output."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from opperf.contract import INPUT_SHAPES, SOURCE, SOURCE_GENERATED, SOURCE_PROFILED, row_signature
from opperf.errors import OpperfError
from opperf.grid import load_grid_config, load_models, prepare_settings, run_grid
from opperf.grid.runner import generate_kernel_grid
from opperf.io import read_database_csv

REPO_SCRIPT = "scripts/generate_shape_grid.py"
FIXTURE_TYPES = ["Add", "FlashAttentionScore", "FlashAttentionScoreGrad", "MatMulV2", "MatMulV3"]


@pytest.fixture(scope="module")
def parsed(tmp_path_factory, ascend_fixture_path):
    """The real A3 fixture through the parse stage (the grid's actual input)."""
    out = tmp_path_factory.mktemp("a3") / "parsed"
    subprocess.run([sys.executable, "scripts/parse_kernel_details.py", "--profiling-path", str(ascend_fixture_path),
                    "--database-path", str(out)], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def ascend_fixture_path():
    from conftest import ASCEND_FIXTURE
    return ASCEND_FIXTURE


def settings(rows=0, seed=0, models=("Qwen3-32B", "dsv3")):
    return prepare_settings(grid_config=load_grid_config("config/grid.yaml"), models=load_models("config/models.yaml"),
                            target_models=list(models), rows=rows, seed=seed, max_hbm_gb=64, max_tokens=64)


def test_fixture_types_with_a_pattern_get_rows_and_the_log_lists_the_rest(parsed, tmp_path, caplog):
    caplog.set_level("INFO", logger="opperf")
    results = run_grid(parsed, tmp_path / "grid", settings())
    by_type = {r.kernel_type: r for r in results}
    assert sorted(by_type) == FIXTURE_TYPES
    for kernel_type in ("Add", "FlashAttentionScore", "MatMulV2", "MatMulV3"):
        result = by_type[kernel_type]
        assert result.generated > 0 and result.buckets > 0 and result.dropped_by_row_cap == 0, kernel_type
    assert by_type["FlashAttentionScoreGrad"].status == "no_pattern"
    assert "kernel types with no grid pattern (copied through unchanged): FlashAttentionScoreGrad" in caplog.text
    assert (tmp_path / "grid" / "kernel_types.txt").read_text() == (parsed / "kernel_types.txt").read_text()
    for kernel_type in FIXTURE_TYPES:
        before = read_database_csv(parsed / f"{kernel_type}.csv")
        after = read_database_csv(tmp_path / "grid" / f"{kernel_type}.csv")
        # Parsed rows first and unchanged, then generated rows without performance values.
        assert after.iloc[:len(before)][list(before.columns)].equals(before)
        new = after.iloc[len(before):]
        assert (new[SOURCE] == SOURCE_GENERATED).all() and (before[SOURCE] == SOURCE_PROFILED).all()
        assert (new["Profiling Average Duration(us)"] == "").all()
        signatures = [row_signature(r, kernel_type) for r in after.to_dict("records")]
        assert len(signatures) == len(set(signatures))


def test_same_seed_gives_byte_identical_csvs_and_another_seed_does_not(parsed, tmp_path):
    # Under a row cap the seed orders buckets of equal use (here MatMulV2's single-TP (N, K) pairs).
    run_grid(parsed, tmp_path / "one", settings(seed=7, rows=300))
    run_grid(parsed, tmp_path / "two", settings(seed=7, rows=300))
    run_grid(parsed, tmp_path / "three", settings(seed=8, rows=300))
    names = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "two").iterdir())
    for name in names:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    assert (tmp_path / "one" / "MatMulV2.csv").read_bytes() != (tmp_path / "three" / "MatMulV2.csv").read_bytes()


def test_in_place_rerun_adds_only_new_signatures(parsed, tmp_path):
    import shutil

    database = tmp_path / "db"
    shutil.copytree(parsed, database)
    run_grid(database, database, settings(rows=100))
    first = read_database_csv(database / "MatMulV2.csv")
    run_grid(database, database, settings(rows=100))
    second = read_database_csv(database / "MatMulV2.csv")
    assert second.iloc[:len(first)].equals(first)            # nothing lost or rewritten
    assert len(parsed_rows := read_database_csv(parsed / "MatMulV2.csv")) < len(first) <= len(parsed_rows) + 100
    assert len(first) < len(second) <= len(first) + 100     # the next buckets the cap left out
    assert second[INPUT_SHAPES].is_unique
    assert sorted(p.name for p in database.iterdir()) == sorted(p.name for p in parsed.iterdir())


def test_a_bad_csv_leaves_no_output_directory(parsed, tmp_path):
    import shutil

    broken = tmp_path / "parsed"
    shutil.copytree(parsed, broken)
    (broken / "MatMulV3.csv").write_text("")
    with pytest.raises(OpperfError, match="MatMulV3.csv.*empty"):
        run_grid(broken, tmp_path / "grid", settings())
    assert not (tmp_path / "grid").exists()
    assert list(tmp_path.glob(".grid*")) == []


def run_script(*args):
    return subprocess.run([sys.executable, REPO_SCRIPT, *args], capture_output=True, text=True)


def test_cli_help_and_workflow_form(parsed, tmp_path):
    assert run_script("--help").returncode == 0
    done = run_script("--input-dir", str(parsed), "--output-dir", str(tmp_path / "grid"), "--device", "A3",
                      "--target-models", "qwen3-32b", "--rows", "100", "--seed", "1", "--max-tokens", "64",
                      "--trace-dir", str(tmp_path / "t"))
    assert done.returncode == 0, done.stderr
    frame = pd.read_csv(tmp_path / "grid" / "MatMulV2.csv", dtype=str, keep_default_na=False)
    assert 0 < (frame[SOURCE] == SOURCE_GENERATED).sum() <= 100
    assert "no grid pattern (copied through unchanged): FlashAttentionScoreGrad" in done.stderr
    assert "MatMulV2: the row cap (100) dropped" in done.stderr
    result = next((tmp_path / "t" / "MatMulV2").glob("I*_S02_MatMulV2_GRID_result.txt")).read_text()
    assert '"buckets_dropped_by_row_cap": [' in result and "gemm[template 0]" in result


def test_cli_seed_form_locates_the_database_in_place(parsed, tmp_path):
    import shutil

    database = tmp_path / "data" / "A3" / "vllm_ascend" / "vllm0.18.0_torch2.9.0_cann8.5"
    shutil.copytree(parsed, database)
    done = run_script("--database-root", str(tmp_path / "data"), "--device", "ATLAS_800_A3_752T_128G_DIE",
                      "--vllm-version", "0.18.0", "--torch-version", "2.9.0", "--cann-version", "8.5",
                      "--target-models", "dsv3", "--rows", "100", "--max-tokens", "64")
    assert done.returncode == 0, done.stderr
    assert 0 < (read_database_csv(database / "MatMulV2.csv")[SOURCE] == SOURCE_GENERATED).sum() <= 100


@pytest.mark.parametrize("args, message", [
    (["--target-models", "gpt5"], "unknown target model 'gpt5'"),
    (["--rows", "-1"], "--rows must be >= 0"),
    (["--grid-config", "tests/data/does_not_exist.yaml"], "tests/data/does_not_exist.yaml: the grid config does not exist"),
])
def test_cli_errors_are_one_line_and_exit_2_without_output(parsed, tmp_path, args, message):
    done = run_script("--input-dir", str(parsed), "--output-dir", str(tmp_path / "grid"), *args)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and message in done.stderr
    assert not (tmp_path / "grid").exists()


def test_cli_malformed_pattern_names_pattern_and_field(parsed, tmp_path):
    bad = tmp_path / "grid.yaml"
    bad.write_text("patterns:\n  gemm: {iterators: {m: tokens}, inputs: ['m / 2'], outputs: ['m']}\n"
                   "router: {MatMulV2: gemm}\n")
    done = run_script("--input-dir", str(parsed), "--output-dir", str(tmp_path / "grid"), "--grid-config", str(bad))
    assert done.returncode == 2
    assert "field 'patterns.gemm.inputs[0]': pattern 'gemm': operator '/' is not allowed" in done.stderr


def test_cpu_patterns_regenerate_every_shape_the_decoder_ran(cpu_parsed, tmp_path):
    cpu_settings = prepare_settings(grid_config=load_grid_config("config/grid.yaml"),
                                    models=load_models("tests/data/parse/models.yaml"),
                                    target_models=["opperf-tiny-1layer"], rows=0, seed=0, max_hbm_gb=16,
                                    max_tokens=256)
    results = run_grid(cpu_parsed, tmp_path / "grid", cpu_settings)
    assert len(results) >= 10
    for result in results:
        # Each profiled row's shapes come back (a dropped duplicate where the layout matches too): the
        # model-derived grids contain the real shapes. Generated rows take their template's memory layout,
        # so a profiled call in another layout than its template's stays a row of its own.
        profiled = read_database_csv(cpu_parsed / f"{result.kernel_type}.csv").to_dict("records")
        grid = generate_kernel_grid(result.kernel_type, profiled, cpu_settings)
        proposed = {s for p in grid.point_sets for found in p.signatures.values() for s in found}

        def shapes_only(signature):
            return tuple(part for part in signature if not part.startswith("strides="))

        assert result.generated > 0, result
        assert all(shapes_only(row_signature(r, result.kernel_type)) in {shapes_only(s) for s in proposed}
                   for r in profiled), result.kernel_type
    cat = read_database_csv(tmp_path / "grid" / "cat.csv")
    for row in cat[cat[SOURCE] == SOURCE_GENERATED].to_dict("records"):
        first, second = (tuple(map(int, s.split(","))) for s in row[INPUT_SHAPES].split(";")[:2])
        output = tuple(map(int, row["Output Shapes"].split(",")))
        if row["Input Scalars"] == ";;-1":       # RoPE halves joined on the last dim
            assert output == (*first[:3], first[3] + second[3])
        else:                                    # KV cache grown by one token on dim 2
            assert row["Input Scalars"] == ";;2" and output == (first[0], first[1], first[2] + 1, first[3])


def test_rerunning_into_an_existing_output_directory_replaces_it_whole(parsed, tmp_path):
    out = tmp_path / "grid"
    run_grid(parsed, out, settings(rows=100))
    (out / "stale.csv").write_text("left over\n")
    run_grid(parsed, out, settings())
    assert not (out / "stale.csv").exists()
    assert (read_database_csv(out / "MatMulV2.csv")[SOURCE] == SOURCE_GENERATED).sum() > 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid"]


def test_a_database_directory_without_a_manifest_is_extended_in_place(parsed, tmp_path):
    import shutil

    database = tmp_path / "data" / "A3" / "vllm_ascend" / "vllm0.18.0_torch2.9.0_cann8.5"
    shutil.copytree(parsed, database)
    (database / "kernel_types.txt").unlink()
    done = run_script("--data-dir", str(database), "--target-models", "qwen3-32b", "--rows", "100", "--max-tokens",
                      "64")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in database.iterdir()) == [f"{t}.csv" for t in FIXTURE_TYPES]
    assert 0 < (read_database_csv(database / "Add.csv")[SOURCE] == SOURCE_GENERATED).sum() <= 100
    empty = tmp_path / "empty"
    empty.mkdir()
    failed = run_script("--data-dir", str(empty))
    assert failed.returncode == 2 and "neither kernel_types.txt nor any kernel CSV here" in failed.stderr


def test_the_grid_by_hand_defaults_to_the_workflows_values():
    """generate_shape_grid.py's defaults are the grid section of config/config.yaml, so the by-hand route of
    docs/grid.md records the rows the workflow would."""
    import importlib.util

    import yaml

    from opperf.workflow_config import WORKFLOW_CONFIG

    spec = importlib.util.spec_from_file_location("grid_script", REPO_SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    args = script.build_parser().parse_args([])
    grid = yaml.safe_load(WORKFLOW_CONFIG.read_text())["grid"]
    assert (args.rows, args.seed, args.consumer_dtype, args.scenario_space) == (
        grid["rows"], grid["seed"], grid["consumer_dtype"], grid["scenario_space"])
