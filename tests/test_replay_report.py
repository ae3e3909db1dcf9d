"""The replay report: exact summary.json (reproduce-scripts conventions) and duration gaps."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd
import pytest

from opperf import contract
from opperf.errors import OpperfError
from opperf.report.build import KERNEL_TYPE_COLOURS, REPORT_FILES, RowPair, _by_kernel_type, write_report

REPO = Path(__file__).resolve().parents[1]


def kernel_csv(path, rows):
    columns = [*contract.SIGNATURE_COLUMNS, contract.REPLAY_AVERAGE, contract.PROFILING_AVERAGE,
               contract.REPLAY_STATUS, contract.REPLAY_ERROR, contract.SOURCE]
    pd.DataFrame([dict(zip(columns, r)) for r in rows], columns=columns).to_csv(path, index=False)
    return path


def test_summary_and_gaps_exact(tmp_path):
    sig = ("16,256;256,512", "DT_FLOAT;DT_FLOAT", "ND;ND", "16,512", "DT_FLOAT")
    mm = kernel_csv(tmp_path / "mm.csv", [
        (*sig, "10", "10", "ok", "", "profiled"),        # ratio 1.0: inside the band
        (*sig, "30", "20", "ok", "", "profiled"),        # ratio 1.5: a gap
        (*sig, "5", "", "ok", "", "generated"),          # no profile: no pair
    ])
    cat = kernel_csv(tmp_path / "cat.csv", [
        (*sig, "", "4", "failed_build", "no dtype", "profiled"),
        (*sig, "2", "4", "ok", "", "profiled"),          # ratio 0.5: a gap
    ])
    (tmp_path / "bench" / "replay" / "CPU" / "torch" / "v").mkdir(parents=True)
    (tmp_path / "bench" / "replay" / "CPU" / "torch" / "v" / "mm.tsv").write_text("s\th:m:s\n2.5\t0:00:02\n")
    (tmp_path / "bench" / "replay" / "CPU" / "torch" / "v" / "cat.tsv").write_text("s\th:m:s\n1.5\t0:00:01\n")
    out = tmp_path / "reports"
    written = write_report([mm, cat], out, title="CPU/torch/v", benchmarks_root=tmp_path / "bench",
                           database_key=("CPU", "torch", "v"), task_log_dir="traces/CPU/torch/v")
    assert sorted(p.name for p in written) == sorted(REPORT_FILES)
    summary = json.loads((out / "summary.json").read_text())
    assert {k: summary[k] for k in ("benchmark", "script", "ops_count", "replay_job_time_sum_s", "task_log_dir")} == {
        "benchmark": "opperf-replay:CPU/torch/v", "script": "scripts/report.py", "ops_count": 2,
        "replay_job_time_sum_s": 4.0, "task_log_dir": "traces/CPU/torch/v"}
    # Fields that meant nothing for a report (pass_n, llm_concurrency, device_ids, max_concurrency) or said what
    # they were not (elapsed_s: the replay jobs' times added up, not wall time) are gone.
    assert not {"pass_n", "llm_concurrency", "device_ids", "max_concurrency", "elapsed_s"} & set(summary)
    assert summary["stats"] == {
        "total_ops": 2, "passed_ops": 1, "failed_ops": 1, "pass_rate": 0.5,
        "op_results": {
            "cat": {"passed": 1, "total": 2, "profile": {"replay_mean_us": 2.0, "profiled_mean_us": 4.0,
                                                         "profiled_over_replay": 2.0}},
            "mm": {"passed": 3, "total": 3, "profile": {"replay_mean_us": 20.0, "profiled_mean_us": 15.0,
                                                        "profiled_over_replay": 0.75}},
        }}
    assert "torch" in summary["env_spec"] and summary["env_spec"]["backend"] == "cpu"
    with open(out / "duration_gap.csv", newline="") as handle:
        gaps = list(csv.DictReader(handle))
    assert [(g["Type"], g["file"], g["line"], g["replay_over_profile"]) for g in gaps] == [
        ("cat", str(cat), "3", "0.5000"), ("mm", str(mm), "3", "1.5000")]
    report = (out / "replay_report.md").read_text()
    assert "| cat | 2 | failed_build | no dtype |" in report
    assert "| replay | 2 | 4.00 | 2.50 |" in report
    assert (out / "replay_vs_profile.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "duration_gap_histogram.png").read_bytes()[:4] == b"\x89PNG"

    # Profiled rows against their own replay, generated rows apart: mm's ratios 1.0 and 1.5, cat's 0.5.
    assert summary["replay_accuracy"] == {"band": [0.8, 1.2], "database": {
        "profiled_rows": 4, "paired_rows": 3, "median_ratio": 1.0, "p10_ratio": 0.6, "p90_ratio": 1.4,
        "inside_band": 1, "inside_band_share": 0.3333, "generated_rows": 1, "generated_replayed_rows": 1,
        "generated_median_replay_us": 5.0}, "kernel_types": {
        "cat": {"profiled_rows": 2, "paired_rows": 1, "median_ratio": 0.5, "p10_ratio": 0.5, "p90_ratio": 0.5,
                "inside_band": 0, "inside_band_share": 0.0, "generated_rows": 0, "generated_replayed_rows": 0,
                "generated_median_replay_us": None},
        "mm": {"profiled_rows": 2, "paired_rows": 2, "median_ratio": 1.25, "p10_ratio": 1.05, "p90_ratio": 1.45,
               "inside_band": 1, "inside_band_share": 0.5, "generated_rows": 1, "generated_replayed_rows": 1,
               "generated_median_replay_us": 5.0}}}
    assert "| mm | 3 | 3 | - | 2 | 2 | 1.250 | 1.050 | 1.450 | 1/2 | 1 | 5.000 |" in report
    assert "| cat | 2 | 1 | failed_build 1 | 2 | 1 | 0.500 | 0.500 | 0.500 | 0/1 | 0 | - |" in report
    assert ("3 of 4 profiled rows have a replay; 1 of them (33%) are inside the band 0.8-1.2 x profile, median "
            "replay/profile 1.000 (p10 0.600, p90 1.400)") in report
    # Completion (summary.json's pass_rate) and accuracy (inside the band) are named apart, the CPU gap explained.
    assert ("**Replay completion** (summary.json `pass_rate`): 1 of 2 kernel types replayed every one of their "
            "rows (pass rate 0.500); 4 of 5 rows have a replay.") in report
    assert ("**Replay accuracy** (replay/profile of the profiled rows; summary.json `replay_accuracy.database`): "
            "3 of 4 profiled rows") in report
    assert "(../../../../docs/replay.md#cpu-back-end-accuracy)" in report
    assert "Why this back end's replay differs from its profile: Measured there: on an idle 16-core Xeon" in report
    assert "## CPU back end: accuracy" in (REPO / "docs" / "replay.md").read_text()

    # The HTML twin for Snakemake's report says the same: the kernel-type table, cells escaped.
    html = (out / "replay_report.html").read_text()
    assert ("<tr><td>mm</td><td class=\"number\">3</td><td class=\"number\">3</td><td>-</td>"
            "<td class=\"number\">2</td><td class=\"number\">2</td><td class=\"number\">1.250</td>") in html
    assert "<td>cat</td><td class=\"number\">2</td><td>failed_build</td><td>no dtype</td>" in html
    assert "<strong>Replay completion</strong>" in html and "<strong>Replay accuracy</strong>" in html
    assert "<em>paired</em>" in html and "*paired*" not in html
    worst = report.split("furthest from their profile")[1].split("## Rows that did not replay")[0]
    rows = [line for line in worst.splitlines() if line.startswith("| cat") or line.startswith("| mm")]
    assert rows == [  # |log ratio|: 0.5 and 1.5 are further from 1 than 1.0; x0.5 counts as far as x2
        "| cat | 3 | `16,256;256,512` | DT_FLOAT;DT_FLOAT | `16,512` | - | 4.000 | - | - | 2.000 | 0.500 | - |",
        "| mm | 3 | `16,256;256,512` | DT_FLOAT;DT_FLOAT | `16,512` | - | 20.000 | - | - | 30.000 | 1.500 | - |",
        "| mm | 2 | `16,256;256,512` | DT_FLOAT;DT_FLOAT | `16,512` | - | 10.000 | - | - | 10.000 | 1.000 | - |"]
    assert "`line` is the row's line in the kernel type's CSV the report read." in worst


def test_percentile_matches_numpy_linear():
    import numpy as np

    from opperf.report.build import percentile

    values = [3.0, 0.5, 1.25, 9.0, 2.0, 2.0, 7.5]
    for q in (0, 10, 50, 90, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_stage_timings_take_only_this_databases_benchmark_files(tmp_path):
    from opperf.report.build import stage_timings

    for relative, seconds in (("replay/A3/vllm_ascend/v/mm.tsv", 2.0), ("grid/A3/vllm_ascend/v.tsv", 1.0),
                              ("replay/XA3/vllm_ascend/v/mm.tsv", 50.0),        # another device
                              ("replay/A3/vllm_ascend/v_shape_generated/mm.tsv", 70.0)):   # another version_dir
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(f"s\th:m:s\n{seconds}\t0:00:00\n")
    assert stage_timings(tmp_path, ("A3", "vllm_ascend", "v")) == {
        "grid": {"jobs": 1, "total_s": 1.0, "max_s": 1.0}, "replay": {"jobs": 1, "total_s": 2.0, "max_s": 2.0}}


def test_scatter_colours_the_kernel_types_with_most_rows_and_merges_the_rest():
    pairs = [RowPair(f"k{i:02d}", line, 1.0, 1.0, "profiled", {}) for i in range(KERNEL_TYPE_COLOURS + 2)
             for line in range(2, 3 + i)]                     # k00 has 1 row, k19 has 20
    groups = _by_kernel_type(pairs)
    assert [label for label, _, _ in groups][:3] == ["k19", "k18", "k17"]
    assert len({colour for _, colour, _ in groups}) == KERNEL_TYPE_COLOURS + 1
    assert groups[-1][0] == "2 other types" and len(groups[-1][2]) == 1 + 2     # k00 and k01
    assert sum(len(group) for _, _, group in groups) == len(pairs)


def test_rows_are_named_by_their_line_in_the_database_csv_as_it_spells_them(tmp_path):
    """With the database directory, `line` and the file named agree: the row the runtime's CSV holds by its line
    there (the CSV is ordered largest call first, not as the replayed rows), a row another row of its runtime key
    stands for by its line in layouts/{Type}.csv; dtypes as the database writes them (FLOAT, not DT_FLOAT). The
    worst rows show the profiled calls' count, median and std and replay against the median too."""
    from opperf.database.build import finalise_kernel_csv

    columns = [contract.OP_STATE, contract.ACCELERATOR_CORE, *contract.SIGNATURE_COLUMNS, contract.OUTPUT_FORMATS,
               contract.INPUT_STRIDES, contract.PROFILING_SAMPLE_COUNT, contract.PROFILING_AVERAGE,
               contract.PROFILING_MEDIAN, contract.PROFILING_STD, contract.REPLAY_AVERAGE, contract.REPLAY_STATUS,
               contract.SOURCE]
    small = ("16,256;256,512", "DT_FLOAT;DT_FLOAT", "ND;ND", "16,512", "DT_FLOAT", "ND")
    large = ("64,256;256,512", "DT_FLOAT;DT_FLOAT", "ND;ND", "64,512", "DT_FLOAT", "ND")
    rows = [  # replayed order: line 2, 3, 4
        ("", "CPU", *small, "256,1;512,1", "2", "10", "10", "0", "30", "ok", "profiled"),          # ratio 3
        ("", "CPU", *small, "1,16;1,256", "8", "529.8", "15.5", "1362", "20", "ok", "profiled"),   # most calls
        ("", "CPU", *large, "256,1;512,1", "1", "40", "40", "0", "40", "ok", "profiled"),          # ratio 1
    ]
    replayed = tmp_path / "replayed" / "mm.csv"
    replayed.parent.mkdir()
    pd.DataFrame([dict(zip(columns, r)) for r in rows], columns=columns).to_csv(replayed, index=False)
    database = tmp_path / "data" / "CPU" / "torch" / "v"
    finalise_kernel_csv(replayed, "mm", database / "mm.csv", backend="cpu")
    written = pd.read_csv(database / "mm.csv", dtype=str, keep_default_na=False)
    assert written[contract.PROFILING_AVERAGE].tolist() == ["40", "529.8"]    # the large row first, then line 3's

    out = tmp_path / "reports"
    write_report([replayed], out, title="CPU/torch/v", database_dir=database)
    report = (out / "replay_report.md").read_text()
    worst = report.split("furthest from their profile")[1].split("## Plots")[0]
    assert [line for line in worst.splitlines() if line.startswith("| mm")] == [
        "| mm | 3 | `16,256;256,512` | FLOAT;FLOAT | `16,512` | 8 | 529.800 | 15.500 | 1,362.000 | 20.000 | 0.038 "
        "| 1.290 |",
        "| mm | layouts/mm.csv:2 | `16,256;256,512` | FLOAT;FLOAT | `16,512` | 2 | 10.000 | 10.000 | 0.000 | 30.000 "
        "| 3.000 | 3.000 |",
        "| mm | 2 | `64,256;256,512` | FLOAT;FLOAT | `64,512` | 1 | 40.000 | 40.000 | 0.000 | 40.000 | 1.000 "
        "| 1.000 |"]
    assert f"`line` is the row's line in `{database}/{{Type}}.csv`, the database CSV the runtime reads" in worst
    with open(out / "duration_gap.csv", newline="") as handle:
        gaps = list(csv.DictReader(handle))
    assert [(g["file"], g["line"], g[contract.INPUT_DTYPES], g["replay_over_profiled_median"]) for g in gaps] == [
        (str(database / "layouts" / "mm.csv"), "2", "FLOAT;FLOAT", "3.0000"),
        (str(database / "mm.csv"), "3", "FLOAT;FLOAT", "1.2903")]
    # The line named is the line holding that row.
    layouts = pd.read_csv(database / "layouts" / "mm.csv", dtype=str, keep_default_na=False)
    assert layouts[contract.PROFILING_AVERAGE][2 - 2] == "10"
    assert written[contract.PROFILING_AVERAGE][3 - 2] == "529.8"

    # A database built from other rows is said so, not silently misnamed.
    pd.DataFrame([dict(zip(columns, r)) for r in rows[:2]], columns=columns).to_csv(replayed, index=False)
    with pytest.raises(OpperfError, match="3 rows, but .*mm.csv has 2: the database was built from other rows"):
        write_report([replayed], out, title="CPU/torch/v", database_dir=database)


def test_the_html_report_links_nothing_relative_and_its_tables_scroll(tmp_path):
    """Snakemake's report shows replay_report.html in a data: iframe, where a relative link is dead: the page
    names the doc section instead and says its gist; its tables sit in a horizontally scrolling box."""
    sig = ("16,256;256,512", "DT_FLOAT;DT_FLOAT", "ND;ND", "16,512", "DT_FLOAT")
    mm = kernel_csv(tmp_path / "mm.csv", [(*sig, "30", "20", "ok", "", "profiled")])
    write_report([mm], tmp_path / "reports", title="CPU/torch/v", backend="cpu")
    html = (tmp_path / "reports" / "replay_report.html").read_text()
    assert "href=" not in html
    assert ("In the opperf\nrepository: <code>docs/replay.md</code>, section &ldquo;CPU back end: accuracy&rdquo;."
            in html)
    assert "A reused input (a GEMM&#39;s weight) takes turns" in html
    assert '<div class="table"><table>' in html and "div.table { max-width: 100%; overflow-x: auto; }" in html
    assert "<td><code>16,256;<wbr>256,512</code></td><td>DT_FLOAT;<wbr>DT_FLOAT</td>" in html   # wraps between slots


def test_a_reproduce_scripts_json_carries_the_conventions_fields(tmp_path):
    """reproduce/ scripts write summary.json with the reproduce-scripts conventions' fields and names: the
    profile as gen_time (replay mean), base_time (profiled mean), speedup = base_time / gen_time."""
    from opperf.report.build import reproduce_fields

    sig = ("16,256;256,512", "DT_FLOAT;DT_FLOAT", "ND;ND", "16,512", "DT_FLOAT")
    mm = kernel_csv(tmp_path / "mm.csv", [(*sig, "30", "20", "ok", "", "profiled"),
                                          (*sig, "5", "", "ok", "", "generated")])
    write_report([mm], tmp_path / "reports", title="CPU/torch/v")
    summary = json.loads((tmp_path / "reports" / "summary.json").read_text())
    document = reproduce_fields(summary, script="reproduce/x.py", workflow="w", elapsed_s=83.4567, device_ids=[0],
                                max_concurrency=2, task_log_dir="logs")
    assert {k: document[k] for k in ("script", "workflow", "pass_n", "ops_count", "elapsed_s", "device_ids",
                                     "max_concurrency", "llm_concurrency", "task_log_dir")} == {
        "script": "reproduce/x.py", "workflow": "w", "pass_n": 1, "ops_count": 1, "elapsed_s": 83.457,
        "device_ids": [0], "max_concurrency": 2, "llm_concurrency": 0, "task_log_dir": "logs"}
    assert document["stats"]["op_results"] == {
        "mm": {"passed": 2, "total": 2, "profile": {"gen_time": 30.0, "base_time": 20.0, "speedup": 0.6667}}}
    assert summary["stats"]["op_results"]["mm"]["profile"] == {
        "replay_mean_us": 30.0, "profiled_mean_us": 20.0, "profiled_over_replay": 0.6667}     # left as it was
