"""Issue 16's corpus (tests/bad_input_corpus.py) as tests: every bad input and fault is refused with exactly its
one line (file, line, field), exit 2, and leaves nothing behind; a killed run's temporaries are gone after the
rerun, with no row lost or counted twice.

Workflow and script cases run in-process (the load-time check's own calls; scripts through run_cli), fault and
kill cases as child processes under real faults (tests/faults.py). benchmarks/bad_inputs.py runs the same
cases through the real `snakemake` and `python scripts/...` command lines and tabulates them; the two tests at
the end pin what the `snakemake` command line adds around our line.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from bad_input_corpus import CASES, SNAKEMAKE_FRAME, SNAKEMAKE_HEADER, python_env, run_case
from faults import available
from snakemake_api import copy_workflow


def _skip_reason(case) -> str | None:
    return available(case.fault) if case.fault else None


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_refused_with_its_one_line_and_nothing_left(case, tmp_path):
    if _skip_reason(case):
        pytest.skip(_skip_reason(case))
    result = run_case(case, tmp_path, in_process=True)
    assert result["outcome"] == "ok", (result["why"], result["said"], result["expected"])


def _snakemake_output(tmp_path, old: str, new: str) -> tuple[subprocess.CompletedProcess, list[str], int]:
    """`snakemake -n` in a workflow copy whose config.yaml has `old` replaced by `new`: the run, its whole
    output, and the line `new` starts on."""
    workdir = copy_workflow(tmp_path / "wf")
    config = workdir / "config" / "config.yaml"
    config.write_text(config.read_text().replace(old, new))
    line = config.read_text().splitlines().index(new.strip("\n")) + 1
    done = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1"], cwd=workdir,
                          capture_output=True, text=True, env=python_env(), timeout=300)
    return done, (done.stdout + done.stderr).splitlines(), line


def test_snakemake_prints_our_line_between_its_own_header_and_one_frame(tmp_path):
    """The whole output of a refused `snakemake -n`: Snakemake's header, our line, the frame that raised it."""
    done, lines, line = _snakemake_output(tmp_path, "\nreplay:\n", "\nreplays:\n")
    assert done.returncode == 1 and len(lines) == 3, lines
    assert SNAKEMAKE_HEADER.match(lines[0]) and SNAKEMAKE_FRAME.match(lines[2]), lines
    assert lines[1] == (f"config/config.yaml, line {line}, field 'replays': unknown key 'replays'; allowed: comm, "
                        "devices, grid, log_level, models, predict, replay, report, sources, workload")


def test_a_yaml_error_in_the_config_is_named_by_the_snakefile_before_snakemake_reads_it(tmp_path):
    """Snakemake's own loader says only "Config file is not valid JSON or YAML"; the Snakefile checks first."""
    done, lines, line = _snakemake_output(tmp_path, "workload:\n", "workload: {x\n")
    assert done.returncode == 1 and len(lines) == 3, lines
    assert lines[1] == (f"config/config.yaml, line {line + 1}: not valid YAML: did not find expected ',' or '}}' "
                        f"(while parsing a flow mapping started at line {line})")
