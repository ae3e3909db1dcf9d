"""A profiled phase's calls, keyed the way the parse groups calls into rows (opperf.replay.phase): the base of
benchmarks/phase_replay.py, checked on the real CUDA decoder trace."""

from __future__ import annotations

import subprocess
import sys

import pytest

from opperf.errors import OpperfError
from opperf.replay.phase import call_keys, database_rows, phase_calls, trace_calls

TRACE = "tests/data/parse/cuda_decoder_trace.json"


@pytest.fixture(scope="module")
def parsed(tmp_path_factory):
    out = tmp_path_factory.mktemp("parsed")
    done = subprocess.run([sys.executable, "scripts/parse_kernel_details.py", "--profiling-path", TRACE,
                           "--database-path", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return out


def test_every_call_of_the_trace_finds_its_row_and_every_row_has_calls(parsed):
    calls = trace_calls(TRACE)
    rows = database_rows(parsed)
    keys = call_keys(calls, rows, parsed)
    assert len(calls) == 125 and len(rows) == 54
    assert set(keys) == set(rows)                       # the parse's grouping, no more and no less
    # Each row's calls are as many as the parse counted for it.
    for key, row in rows.items():
        assert keys.count(key) == int(row["Profiling Sample Count"]), key
    # Launch order: the first call is the embedding lookup, the prefill's RMSNorm follows.
    assert [c["Type"] for c in calls[:3]] == ["index_select", "pow", "mean"]


def test_a_phase_is_the_first_long_enough_run_of_its_shapes_with_the_calls_between():
    calls = trace_calls(TRACE)
    prefill = phase_calls(calls, ["1,4,"], min_calls=5, max_gap=3)       # the 4-token prefill
    assert len(prefill) == 12 and prefill[0] is calls[1] and prefill[-1]["Type"] == "add"
    strict = phase_calls(calls, ["1,4,"], min_calls=5, max_gap=0)        # no other call in between
    assert len(strict) == 6 and strict[0] is calls[1] and strict[-1]["Type"] == "mul"
    decode = phase_calls(calls, ["1,1,"], min_calls=5, max_gap=3)
    assert len(decode) == 8 and decode[0] is calls[81]
    assert phase_calls(calls, [], min_calls=5) == calls                  # no shapes: the whole trace
    with pytest.raises(OpperfError, match=r"no run of 500 calls .*the longest has \d+"):
        phase_calls(calls, ["1,4,"], min_calls=500)


def test_calls_without_rows_are_named(parsed, tmp_path):
    calls = trace_calls(TRACE)
    rows = database_rows(parsed)
    del rows[next(k for k in rows if k[0] == "mm")]
    with pytest.raises(OpperfError, match=r"of the phase's 125 calls have no row here \(types \['mm'\]\)"):
        call_keys(calls, rows, parsed)
    assert database_rows(tmp_path) == {}
