"""The density standard: its numbers (config/density_standard.yaml), every shipped model's point sets checked
against them, the row cap that keeps buckets whole, and the check of a database directory of kernel CSVs."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ASCEND_FIXTURE
from opperf.comm.sizes import parse_bytes_grid
from opperf.contract import INPUT_SCALARS, INPUT_SHAPES, SOURCE, SOURCE_GENERATED, format_shapes
from opperf.density import AxisRule, load_standard
from opperf.errors import OpperfError
from opperf.grid import load_grid_config, load_models, prepare_settings, run_grid
from opperf.grid.density import check_density, check_point_sets
from opperf.grid.patterns import CandidateStats, pattern_candidates
from opperf.grid.runner import generate_kernel_grid
from opperf.grid.values import token_counts
from opperf.io import read_database_csv, write_csv_atomic
from test_grid_generate import MATMUL_TEMPLATE, TEMPLATE_SCALARS, profiled

STANDARD = load_standard()
GRID = load_grid_config("config/grid.yaml")
MODELS = load_models("config/models.yaml")
REAL_MODELS = ["Qwen3-32B", "Qwen3-235B-A22B", "DeepSeek-V3", "Llama-3-70B", "Qwen2.5-7B"]


def test_the_standard_holds_msmodelings_v1_numbers():
    assert (STANDARD.version, STANDARD.source["commit"]) == ("v1", "84fec85")
    m = STANDARD.rule("M_GRID")
    assert (m.low, m.high) == (1, 32768)
    assert [(s.low, s.high, s.max_gap, s.max_ratio) for s in m.segments] == [
        (1, 8, 1, None), (9, 16, 2, None), (17, 32, 4, None), (33, 64, 8, None), (65, 128, 16, None),
        (129, 256, 64, None), (257, 1024, 256, None), (1025, 32768, None, 2)]
    # The smallest point sets that meet each rule over its whole range.
    assert m.points() == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128,
                          192, 256, 512, 768, 1024, 2048, 4096, 8192, 16384, 32768]
    assert STANDARD.rule("ELEM_TOKENS_GRID").points() == [1, 4, 16, 64] + [2 ** p for p in range(7, 16)]
    assert STANDARD.rule("MOE_TOKENS_GRID").points() == [2 ** p for p in range(17)]
    assert STANDARD.rule("ATTN_SEQ_GRID").points() == [1, 4, 16, 64] + [2 ** p for p in range(7, 18)]
    assert STANDARD.rule("PAD_TOKENS_GRID").points() == [1, 2, 3, 4, 5, 6, 7, 9, 15, 31, 63, 127, 129, 255, 257,
                                                         511, 513, 1023, 1025, 2047, 2049, 4095, 4097, 8191, 8193]
    assert STANDARD.rule("HEADS_GRID").points() == [1, 2, 3, 4, 5, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 128]
    assert STANDARD.rule("KV_HEADS_GRID").points() == [1, 2, 4, 8, 16, 32]
    assert STANDARD.rule("HEAD_DIM_GRID").points() == [64, 128, 256]
    assert STANDARD.rule("ATTN_BATCH_GRID").points() == [1, 2, 4, 8, 16, 32, 48, 64, 128]
    nk = STANDARD.rule("NK_GRID")
    assert nk.points() == list(nk.required) and len(nk.required) == 37 and (nk.low, nk.high) == (128, 55296)
    assert STANDARD.rule("ELEM_HIDDEN_GRID") is nk and STANDARD.rule("fused_attention.seq") is STANDARD.rule(
        "ATTN_SEQ_GRID")
    assert STANDARD.rule("argmax.vocab").points() == [1024, 4096, 16384, 65536, 151936]
    assert STANDARD.message_bytes.points() == [2 ** p for p in range(7, 30)]       # 128 B .. 512 MiB


@pytest.mark.skipif(not os.environ.get("OPPERF_MSMODELING_DIR"), reason="set OPPERF_MSMODELING_DIR to a checkout")
def test_the_standard_is_a_faithful_copy_of_msmodelings_yaml(tmp_path):
    upstream = (Path(os.environ["OPPERF_MSMODELING_DIR"]) / ".agents/skills/profiling_database_axis_density"
                / "axis_collection_density.yaml")
    theirs = load_standard(upstream)
    assert theirs.rules.keys() == STANDARD.rules.keys()
    for name, rule in STANDARD.rules.items():
        assert dataclasses.replace(theirs.rules[name], name=rule.name) == rule, name


def test_checks_find_what_the_issue_measured():
    m = STANDARD.rule("M_GRID")
    old_tokens = token_counts(16384)                  # the grid before the standard: 1..16, then p-1, p, p+1
    check = m.check(old_tokens, high=32768)
    assert (16, 31, "17..32 gap <= 4") in check.too_far_apart and (513, 1023, "257..1024 gap <= 256") in (
        check.too_far_apart)
    assert check.missing_endpoints == (32768,) and not check.ok
    heads = STANDARD.rule("HEADS_GRID").check([8, 16, 32, 64, 128], low=1)
    assert heads.missing_required == (1, 2, 3, 4, 5, 10, 12, 20, 24, 40, 48) and heads.missing_endpoints == (1,)
    # A value the kernel cannot take there is excused, not missing; the spacing still holds between the others.
    assert STANDARD.rule("HEADS_GRID").check([8, 16, 24, 32, 40, 48, 64, 128], excused=[10, 12, 20]).ok
    assert not STANDARD.rule("HEADS_GRID").check([8, 16, 24, 32, 40, 48, 64, 128]).ok
    # A pair crossing a segment boundary is held to the stricter side: 6 → 10 breaks 1..8's gap of 1.
    assert m.check([1, 2, 3, 4, 5, 6, 10]).too_far_apart == ((6, 10, "1..8 gap <= 1"),)


@pytest.mark.parametrize("raw, field, message", [
    ({"grids": {"X": {"range": {"min": 4, "max": 2}, "max_ratio": 2}}}, "grids.X.range", "is empty"),
    ({"grids": {"X": {"range": {"min": 1, "max": 8}, "segments": [{"min": 1, "max": 4, "max_gap": 1},
                                                                  {"min": 6, "max": 8, "max_gap": 1}]}}},
     "grids.X.segments[1]", "tile the range"),
    ({"grids": {"X": {"range": {"min": 1, "max": 8}, "max_ratio": 1}}}, "grids.X.max_ratio", "must be a number > 1"),
    ({"grids": {"X": {"range": {"min": 1, "max": 8}, "max_ratio": 2, "required_values": [9]}}},
     "grids.X.required_values", "outside the range"),
    ({"grids": {"X": {"max_ratio": 2}}}, "grids.X", "required values only"),
    ({"grids": {"X": {"required_values": [1]}}, "aliases": {"Y": "Z"}}, "aliases.Y", "alias of unknown grid"),
])
def test_a_malformed_standard_names_the_field(tmp_path, raw, field, message):
    path = tmp_path / "standard.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(OpperfError, match=message) as error:
        load_standard(path)
    assert error.value.field == field and error.value.path == str(path)


def test_the_collectives_default_sizes_meet_the_standard():
    sizes = parse_bytes_grid(None)
    rule = STANDARD.message_bytes
    assert rule.check(sizes, low=rule.low, high=rule.high).ok and sizes[0] == 128


def _template_for(name: str):
    """A profiled row with the slot structure of the pattern's first candidate (BF16, ND)."""
    pattern = GRID.patterns[name]
    first = next(iter(pattern_candidates(pattern, _settings(REAL_MODELS, 256).grids, CandidateStats())))

    def names(slots, value):
        return ";".join(value if s else "" for s in slots)
    return profiled(format_shapes(first.inputs), format_shapes(first.outputs), names(first.inputs, "DT_BF16"),
                    names(first.outputs, "DT_BF16"), formats_in=names(first.inputs, "ND"),
                    formats_out=names(first.outputs, "ND"), **{INPUT_SCALARS: TEMPLATE_SCALARS.get(name, "")})


def _settings(models, max_tokens=131072, rows=0, seed=0, axis_caps=None, max_hbm_gb=64.0):
    return prepare_settings(grid_config=GRID, models=MODELS, target_models=list(models), rows=rows, seed=seed,
                            max_hbm_gb=max_hbm_gb, max_tokens=max_tokens, axis_caps=axis_caps)


def _point_sets(models, **options):
    """Every pattern of grid.yaml laid onto one template of its own structure, for the given models."""
    settings = _settings(models, **options)
    found = []
    for name in sorted(GRID.patterns):
        kernel_type = f"{name}_pattern"
        single = dataclasses.replace(settings, grid_config=dataclasses.replace(GRID, router={kernel_type: (name,)}))
        found += generate_kernel_grid(kernel_type, [_template_for(name)], single).point_sets
    return settings, found


# An axis a model's shapes do not have: an MLA model (DeepSeek-V3) attends with one latent KV head of
# kv_lora_rank + rope dims, so no kernel of it has a KV-heads axis to sweep.
NOT_APPLICABLE = {("DeepSeek-V3", "KV_HEADS_GRID")}
PUBLIC_AXES = ("M_GRID", "NK_GRID", "ELEM_TOKENS_GRID", "MOE_TOKENS_GRID", "ATTN_SEQ_GRID", "PAD_TOKENS_GRID",
               "HEADS_GRID", "KV_HEADS_GRID", "HEAD_DIM_GRID", "ATTN_BATCH_GRID")


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(MODELS))
def test_every_models_point_sets_meet_the_standard_on_every_axis(model):
    settings, point_sets = _point_sets([model])
    report = check_density(point_sets, settings=settings)
    assert report.axes and sum(len(a.checks) for a in report.axes) > 100
    # Every bucket of every axis: its range ends, required values and spacing (values the kernel cannot take
    # there excused: query heads not a multiple of the KV heads).
    assert report.ok, report.table()
    for axis in PUBLIC_AXES:
        rule = STANDARD.rule(axis)
        users = [a for a in report.axes if STANDARD.rule(a.axis) is rule and a.checks]
        if (model, axis) in NOT_APPLICABLE:
            assert not users, axis
            continue
        # Swept somewhere, the union of its values spans the standard's whole range, no required value missing.
        union = sorted(set().union(*(set(c.point_set.present) for a in users for c in a.checks)))
        assert (union[0], union[-1]) == rule.window(), (axis, union)
        assert all(not a.coverage.missing_required for a in users), axis
    # MoE tokens: the target's expert layouts sweep them; a dense model has only the gating sweeps of the
    # standard's experts x top-k.
    moe = {a.kernel_type for a in report.axes if a.axis == "MOE_TOKENS_GRID" and a.checks}
    gating = {"moe_gating_top_k_pattern", "moe_gating_top_k_softmax_pattern"}
    assert moe == gating if not MODELS[model].is_moe else moe > gating


def test_a_thinned_bucket_fails_the_check():
    settings, point_sets = _point_sets(["Qwen3-32B"], max_tokens=256)
    gemm = [p for p in point_sets if p.kernel_type == "gemm_pattern" and p.axis == "M_GRID"]
    caps = {"M_GRID": 256}
    assert gemm and check_point_sets(gemm, STANDARD, caps=caps).ok
    thinned = dataclasses.replace(gemm[0], present=gemm[0].present - {20, 24})      # 16 → 28: gap 12 > 4
    check = check_point_sets([thinned], STANDARD, caps=caps).axes[0].failures[0].check
    assert check.too_far_apart == ((16, 28, "17..32 gap <= 4"),)
    # Stopped short of the cap, or of the standard's range where nothing caps it.
    short = dataclasses.replace(gemm[0], present={m for m in gemm[0].present if m <= 128})
    assert check_point_sets([short], STANDARD, caps=caps).axes[0].failures[0].check.missing_endpoints == (256,)
    assert check_point_sets(gemm[:1], STANDARD).axes[0].failures[0].check.missing_endpoints == (32768,)


CAPPED = _settings(("Qwen3-32B", "Llama-3-70B"), max_tokens=64)


def _capped(cap, seed=0):
    return generate_kernel_grid("MatMulV2", [MATMUL_TEMPLATE], dataclasses.replace(CAPPED, rows=cap, seed=seed))


def test_the_row_cap_drops_whole_buckets_sweeps_and_least_used_first():
    full = _capped(0)
    capped = _capped(600)
    assert len(capped.rows) <= 600 < len(full.rows) and capped.result.dropped_buckets == len(capped.dropped) > 0
    # Kept rows keep enumeration order; each bucket is there whole or not at all.
    positions = [full.rows.index(r) for r in capped.rows]
    assert positions == sorted(positions)
    m_values = {}
    for row in capped.rows:
        m, k = map(int, row[INPUT_SHAPES].split(";")[0].split(","))
        n = int(row[INPUT_SHAPES].split(";")[1].split(",")[1])
        m_values.setdefault((n, k), set()).add(m)
    full_sets = {(p.bucket.group, p.held): p.present for p in full.point_sets if p.axis == "M_GRID"}
    for point_set in capped.point_sets:
        if point_set.axis == "M_GRID" and not point_set.dropped_by_row_cap:
            assert point_set.present == full_sets[(point_set.bucket.group, point_set.held)]
    assert check_density(capped.point_sets, settings=CAPPED).ok
    # Sweeps (N and K over NK_GRID, values no model runs) go first; then the buckets fewer TP configurations use.
    kept = [b for b in capped.buckets if b not in capped.dropped]
    dropped_main = [b for b in capped.dropped if not b.key.is_sweep]
    assert dropped_main and not any(b.key.is_sweep for b in kept)
    assert max(len(b.users) for b in dropped_main) <= min(len(b.users) for b in kept)
    assert {b.key for b in capped.buckets} == {b.key for b in full.buckets}
    # Deterministic; the seed only orders buckets of equal use.
    assert _capped(600).rows == capped.rows
    assert len(_capped(600, seed=5).rows) <= 600


def test_the_grid_stage_logs_what_the_row_cap_cost(fixture_database, tmp_path, caplog):
    caplog.set_level("DEBUG", logger="opperf")
    parsed = fixture_database[0].parent / "parsed"
    results = run_grid(parsed, tmp_path / "grid", _settings(["opperf-tiny"], max_tokens=256, rows=100))
    matmul = next(r for r in results if r.kernel_type == "MatMulV2")
    assert matmul.dropped_buckets > 0 and matmul.generated <= 100
    assert (f"MatMulV2: the row cap (100) dropped {matmul.dropped_buckets} of {matmul.buckets} buckets whole "
            f"({matmul.dropped_by_row_cap} rows): gemm[template 0] sweep=") in caplog.text
    assert caplog.text.count("MatMulV2: dropped by the row cap: ") == matmul.dropped_buckets


@pytest.fixture(scope="module")
def fixture_database(tmp_path_factory):
    """The real A3 fixture parsed, then grid-extended for opperf-tiny (the workflow's grid/ output)."""
    root = tmp_path_factory.mktemp("density")
    subprocess.run([sys.executable, "scripts/parse_kernel_details.py", "--profiling-path", str(ASCEND_FIXTURE),
                    "--database-path", str(root / "parsed")], check=True, capture_output=True)
    settings = _settings(["opperf-tiny"], max_tokens=256)
    run_grid(root / "parsed", root / "grid", settings)
    return root / "grid", settings


def test_a_grid_extended_database_meets_the_standard_and_a_thinned_one_does_not(fixture_database, tmp_path):
    directory, settings = fixture_database
    report = check_density(directory, settings=settings)
    assert report.ok, report.table()
    matmul = report.summary("M_GRID", "MatMulV2")[0]
    assert len(matmul.checks) > 1 and matmul.absent == 0 and matmul.coverage.values[0] == 1
    assert "MatMulV2\tM_GRID\t" in report.table() and report.to_dict()["ok"]
    # Delete M = 20 of one (N, K) bucket: that bucket now jumps 16 → 24 and fails, naming itself.
    thinned = tmp_path / "thinned"
    thinned.mkdir()
    for csv in directory.glob("*"):
        (thinned / csv.name).write_bytes(csv.read_bytes())
    frame = read_database_csv(thinned / "MatMulV2.csv")
    victim = frame.index[frame[INPUT_SHAPES] == "20,256;256,512"]
    assert len(victim) == 1
    write_csv_atomic(thinned / "MatMulV2.csv", frame.drop(victim))
    after = check_density(thinned, settings=settings).summary("M_GRID", "MatMulV2")[0]
    assert [c.check.too_far_apart for c in after.failures] == [((16, 24, "17..32 gap <= 4"),)]
    assert "n=512 k=256" in after.failures[0].point_set.describe()
    # Only rows with a duration count when asked: none of the generated rows has one before replay.
    unreplayed = check_density(directory, settings=settings, require_duration=True).summary("M_GRID", "MatMulV2")[0]
    profiled_rows = read_database_csv(directory / "MatMulV2.csv")
    assert (profiled_rows[SOURCE] != SOURCE_GENERATED).sum() > 0
    assert unreplayed.absent + len(unreplayed.checks) == len(matmul.checks) and unreplayed.absent > 0


def test_a_back_ends_settings_come_from_grid_yaml():
    cpu = prepare_settings(grid_config=GRID, models=MODELS, target_models=["opperf-tiny"], rows=0, seed=0,
                           max_hbm_gb=16, backend="cpu")
    assert (cpu.grids.max_tokens, cpu.grids.axis_high("ELEM_HIDDEN_GRID"), cpu.grids.tile_boundaries) == (256, 4096,
                                                                                                          False)
    assert cpu.grids.values("M_GRID", field="m") == STANDARD.rule("M_GRID").points(high=256)
    npu = prepare_settings(grid_config=GRID, models=MODELS, target_models=["Qwen3-32B"], rows=0, seed=0,
                           max_hbm_gb=64, backend="npu", max_tokens=1024)
    assert (npu.grids.max_tokens, npu.grids.axis_high("NK_GRID"), npu.grids.tile_boundaries) == (1024, None, True)


def test_check_density_needs_the_grid_settings_for_a_directory(fixture_database):
    directory, _ = fixture_database
    with pytest.raises(ValueError, match="needs the grid settings"):
        check_density(directory, standard=STANDARD)


def test_rule_points_meet_their_rule_for_any_window():
    for name in ("M_GRID", "NK_GRID", "ATTN_SEQ_GRID", "HEADS_GRID", "message_bytes"):
        rule: AxisRule = STANDARD.rule(name)
        for high in (rule.window()[0] + 1, 100, 300, 5000, 100000):
            if high < rule.window()[0]:
                continue
            points = rule.points(high=high)
            low, top = rule.window(high=high)
            assert points[0] == low and points[-1] == top and rule.check(points, low=low, high=top).ok, (name, high)
