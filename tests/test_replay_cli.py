"""scripts/replay.py: one-line errors with exit 2 and no output; the seed's database form, in place."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

from opperf import contract
from opperf.cli import run_cli
from opperf.versions import cpu_version_dir

REPO = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("replay_script", REPO / "scripts" / "replay.py")
replay_script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(replay_script)

ROWS = pd.read_csv(REPO / "tests" / "data" / "replay" / "cpu_rows.csv", dtype=str, keep_default_na=False)


def replay(*argv):
    return run_cli(replay_script.build_parser(), replay_script.main, list(argv))


def mm_csv(path: Path, averages: list[str]) -> Path:
    row = ROWS[ROWS["Type"] == "mm"].drop(columns=["Type"]).iloc[0].to_dict()
    frame = pd.DataFrame([dict(row, **{contract.REPLAY_AVERAGE: a, contract.PROFILING_AVERAGE: "7"})
                          for a in averages])
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)
    return path


def test_help_names_the_seed_options(capsys):
    with pytest.raises(SystemExit) as done:
        replay("--help")
    assert done.value.code == 0
    text = capsys.readouterr().out
    for option in ("--update-mode", "--prune-empty-duration-rows", "--prune-invalid-rows", "--prof-path", "--op",
                   "--fail-fast", "--repeat-count", "--dispatch-ffn-combine-master-port", "--database-path"):
        assert option in text


def test_wrong_stack_is_refused_with_one_line_and_no_output(tmp_path, capsys):
    rows = mm_csv(tmp_path / "mm.csv", [""])
    output = tmp_path / "out.csv"
    code = replay("--rows", str(rows), "--kernel", "mm", "--output", str(output), "--version-dir", "torch0.0.1_cpu",
                  "--definitions", str(REPO / "config" / "kernels"))
    error = capsys.readouterr().err
    assert code == 2 and not output.exists()
    assert error.count("\n") == 1 and "refusing to write into torch0.0.1_cpu" in error


def test_by_hand_replay_measures_as_the_workflow_does(tmp_path):
    """scripts/replay.py's defaults are the workflow's replay section of config/config.yaml (one place chooses
    them): on cpu 1 thread and 10 timed calls per row, not torch's default threads and 30."""
    import yaml

    from opperf.replay.cli import settings_from_args

    workflow = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["replay"]
    assert (workflow["cpu_threads"], workflow["repeat_count"]) == (1, 10)
    args = replay_script.build_parser().parse_args([])
    for option in ("repeat_count", "cpu_threads", "warmup_count", "timeout_s", "max_restarts", "memory_fraction",
                   "update_mode", "time_budget_s", "min_repeat_count"):
        assert getattr(args, option) == workflow[option], option
    settings = settings_from_args(args, None)
    assert (settings.backend, settings.repeat_count, settings.cpu_threads) == ("cpu", 10, 1)
    rows, output = mm_csv(tmp_path / "mm.csv", [""]), tmp_path / "out.csv"
    assert replay("--rows", str(rows), "--kernel", "mm", "--output", str(output), "--version-dir", cpu_version_dir(),
                  "--definitions", str(REPO / "config" / "kernels")) == 0
    row = pd.read_csv(output, dtype=str, keep_default_na=False).iloc[0]
    # Samples: the timed calls the profiler attributed the op to, of the 10 made (30 before, by hand).
    assert row[contract.REPLAY_STATUS] == "ok" and 0 < int(row[contract.REPLAY_SAMPLE_COUNT]) <= 10
    assert row[contract.REPLAY_TIMING_METHOD].endswith(", 1 threads")


def test_workflow_form_needs_kernel_and_output(tmp_path, capsys):
    assert replay("--rows", str(tmp_path / "x.csv")) == 2
    assert "--kernel" in capsys.readouterr().err


def test_database_form_missing_only_leaves_filled_rows_and_writes_a_report(tmp_path):
    database = tmp_path / "data" / "CPU" / "torch" / cpu_version_dir()
    mm_csv(database / "mm.csv", ["5", ""])
    code = replay("--database-path", str(database), "--update-mode", "missing-only", "--repeat-count", "2",
                  "--definitions", str(REPO / "config" / "kernels"), "--device", "CPU")
    assert code == 0
    written = pd.read_csv(database / "mm.csv", dtype=str, keep_default_na=False)
    assert written[contract.REPLAY_AVERAGE].tolist()[0] == "5"
    assert written[contract.REPLAY_STATUS].tolist() == ["", "ok"] and float(written[contract.REPLAY_AVERAGE][1]) > 0
    assert (database / "reports" / "summary.json").is_file()
    traces = tmp_path / "traces" / "CPU" / "torch" / cpu_version_dir() / "mm"
    assert list(traces.glob("*_S04_mm_BACKFILL_result.txt"))


def test_a_type_torch_does_not_know_keeps_every_row_as_no_definition(tmp_path):
    # No definition: the op's schema would replay it (opperf.replay.schema), but torch has no aten::Mystery.
    rows = mm_csv(tmp_path / "Mystery.csv", ["", "", "3"])
    output = tmp_path / "out.csv"
    code = replay("--rows", str(rows), "--kernel", "Mystery", "--definition", "", "--output", str(output),
                  "--version-dir", cpu_version_dir(), "--trace-dir", str(tmp_path / "traces"))
    assert code == 0
    written = pd.read_csv(output, dtype=str, keep_default_na=False)
    assert len(written) == 3 and set(written[contract.REPLAY_STATUS]) == {"no_definition"}
    assert written[contract.REPLAY_ERROR][0] == "no definition, and torch knows no op aten::Mystery"
    assert set(written[contract.REPLAY_RECIPE]) == {"schema aten::Mystery"}
    assert written[contract.PROFILING_AVERAGE].tolist() == ["7", "7", "7"]
    reproducer = next((tmp_path / "traces" / "Mystery").glob("*_verify/replay_Mystery.py"))
    assert 'DEFINITION = "schema:aten::Mystery"' in reproducer.read_text()


def test_the_reproducer_replays_as_the_job_did(tmp_path):
    import subprocess
    import sys

    rows = mm_csv(tmp_path / "mm.csv", ["", ""])
    code = replay("--rows", str(rows), "--kernel", "mm", "--output", str(tmp_path / "out.csv"), "--version-dir",
                  cpu_version_dir(), "--trace-dir", str(tmp_path / "traces"), "--repeat-count", "2",
                  "--cpu-threads", "1", "--definitions", str(REPO / "config" / "kernels"))
    assert code == 0
    reproducer = next((tmp_path / "traces" / "mm").glob("*_verify/replay_mm.py"))
    usage = subprocess.run([sys.executable, str(reproducer), "--help"], capture_output=True, text=True, check=True)
    assert "(default: 1, as the job" in usage.stdout             # the job's --cpu-threads, not torch's default
    done = subprocess.run([sys.executable, str(reproducer), "--repeat-count", "1"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("line 2: ok ") and "(job: ok " in done.stdout


def test_parse_then_replay_on_any_directory_with_version_dir(tmp_path):
    """parse_kernel_details.py --database-path out/ then replay.py --database-path out/: a directory not named
    after its stack replays with --version-dir, and without it stops with one line saying so; each kernel type's
    summary line is said once (it was logged and printed)."""
    import subprocess
    import sys

    def run(script, *argv):
        return subprocess.run([sys.executable, f"scripts/{script}", *map(str, argv)], cwd=REPO, capture_output=True,
                              text=True)

    out = tmp_path / "out"
    parsed = run("parse_kernel_details.py", "--profiling-path", REPO / "tests/data/replay/tiny_cpu/trace.json",
                 "--database-path", out)
    assert parsed.returncode == 0, parsed.stderr
    assert (out / "kernel_types.txt").read_text() == "add\nmm\nsilu\n"

    refused = run("replay.py", "--database-path", out, "--op", "add", "--repeat-count", "2")
    assert refused.returncode == 2
    assert refused.stderr == (
        f"error: {out}, field '--version-dir': version directory 'out' is not of the form vllm<v>_torch<t>_cann<c>, "
        "vllm<v>_torch<t>_cuda<c> or torch<t>_cpu (optionally with _<suffix>); a directory not named after its "
        f"stack needs --version-dir, the stack its rows were profiled on, e.g. this host's: {cpu_version_dir()}\n")

    done = run("replay.py", "--database-path", out, "--version-dir", cpu_version_dir(), "--op", "add",
               "--repeat-count", "2")
    assert done.returncode == 0, done.stderr
    written = pd.read_csv(out / "add.csv", dtype=str, keep_default_na=False)
    assert written[contract.REPLAY_STATUS].tolist() == ["ok"] and float(written[contract.REPLAY_AVERAGE][0]) > 0
    assert (out / "reports" / "summary.json").is_file()
    said = (done.stdout + done.stderr).splitlines()
    assert len([line for line in said if "add: rows in 1, out 1; updated 1" in line]) == 1
    # Another stack than this host's is refused as in the workflow form.
    other = run("replay.py", "--database-path", out, "--version-dir", "torch0.0.1_cpu", "--op", "add")
    assert other.returncode == 2 and "refusing to write into torch0.0.1_cpu" in other.stderr
