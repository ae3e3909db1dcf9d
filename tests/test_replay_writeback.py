"""Write-back by signature: exact values, update modes, pruning only on request, never a lost row."""

from __future__ import annotations

import statistics

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from opperf import contract
from opperf.replay.engine import (STATUS_FAILED_BUILD, STATUS_FAILED_VERIFY, STATUS_OK, STATUS_SKIPPED_MEMORY,
                                  RowOutcome, plan_work, replay_key, sample_columns)
from opperf.replay.writeback import write_back
from opperf.stats import format_number

AT = "2026-01-01T00:00:00Z"


COLUMNS = [*contract.BASE_COLUMNS, contract.REPLAY_AVERAGE, contract.PROFILING_AVERAGE]


def frame(rows):
    return pd.DataFrame([{c: r.get(c, "") for c in COLUMNS} for r in rows], columns=COLUMNS).astype(str)


def mm_row(m, n=512, profiled="10", replayed="", dtype="FLOAT"):
    return {contract.INPUT_SHAPES: f'"""{m},256;256,{n}"""', contract.INPUT_DTYPES: f"{dtype};{dtype}",
            contract.INPUT_FORMATS: "FORMAT_ND;FORMAT_ND", contract.OUTPUT_SHAPES: f"{m},{n}",
            contract.OUTPUT_DTYPES: dtype, contract.PROFILING_AVERAGE: profiled, contract.REPLAY_AVERAGE: replayed}


def ok(samples):
    return RowOutcome(STATUS_OK, columns=sample_columns(samples, "test clock", "none"))


def test_exact_values_land_on_every_row_of_the_signature_in_canonical_spelling():
    rows = frame([mm_row(16), mm_row(16, dtype="DT_FLOAT"), mm_row(32)])
    # The outcome is keyed by the canonical signature: quotes, FLOAT and FORMAT_ND spellings all match.
    key = replay_key({contract.INPUT_SHAPES: "16,256;256,512", contract.INPUT_DTYPES: "DT_FLOAT;DT_FLOAT",
                      contract.INPUT_FORMATS: "ND;ND", contract.OUTPUT_SHAPES: "16,512",
                      contract.OUTPUT_DTYPES: "DT_FLOAT"}, "mm")
    written, report = write_back(rows, "mm", {key: ok([1.0, 2.0, 3.0, 10.0])}, collected_at=AT)
    assert written[contract.REPLAY_AVERAGE].tolist() == ["4", "4", ""]
    assert written[contract.REPLAY_MEDIAN].tolist()[:2] == ["2.5", "2.5"]
    assert written[contract.REPLAY_P10].tolist()[0] == "1.3"
    assert written[contract.REPLAY_P90].tolist()[0] == "7.9"
    assert written[contract.REPLAY_CV].tolist()[0] == "0.883883"     # pstdev sqrt(12.5) / mean 4
    assert written[contract.REPLAY_SAMPLE_COUNT].tolist()[0] == "4"
    assert written[contract.REPLAY_STATUS].tolist() == [STATUS_OK, STATUS_OK, ""]
    assert (report.updated, report.measured, report.untouched, report.rows_out) == (2, 2, 1, 3)
    columns = list(written.columns)
    assert columns.index(contract.REPLAY_AVERAGE) == len(contract.BASE_COLUMNS)
    assert columns[-1] == contract.COLLECTED_AT


def test_an_interrupted_call_is_left_out_and_said_so():
    """The moe chain's mm (486, 1536) x (1536, 4096): 29 calls near 11.25 us and one of 58 ms (another context's
    time slice) had made its Average Duration 1,959 us. Such a call leaves every statistic; the measurement's
    description names it. A real bimodal spread (a memcpy's remainder path, 2x) is kept whole."""
    samples = [11.25] * 15 + [11.5] * 14 + [58_012.0]
    columns = sample_columns(samples, "test clock", "insitu")
    assert columns[contract.REPLAY_AVERAGE] == format_number(statistics.fmean(samples[:-1]))
    assert columns[contract.REPLAY_SAMPLE_COUNT] == "29"
    assert columns[contract.REPLAY_P90] == "11.5"
    assert columns[contract.REPLAY_L2_POLICY] == ("insitu; 1 of 30 timed calls left out as interrupted (58012 us, "
                                                  "over 20x the median of all 11.4 us)")
    bimodal = [2.3] * 20 + [4.72] * 10
    kept = sample_columns(bimodal, "test clock", "insitu")
    assert kept[contract.REPLAY_SAMPLE_COUNT] == "30" and kept[contract.REPLAY_L2_POLICY] == "insitu"
    assert kept[contract.REPLAY_AVERAGE] == format_number(statistics.fmean(bimodal))
    zeros = sample_columns([0.0, 0.0, 0.0, 5.0], "test clock", "none")     # a median of 0 sets nothing apart
    assert zeros[contract.REPLAY_SAMPLE_COUNT] == "4"


def test_failed_rows_are_kept_with_status_and_error_and_lose_stale_numbers():
    rows = frame([mm_row(16, replayed="99")])
    key = replay_key(rows.iloc[0].to_dict(), "mm")
    outcome = RowOutcome(STATUS_FAILED_VERIFY, error="output slot 0: shape [16, 512] != expected [16, 511]")
    written, report = write_back(rows, "mm", {key: outcome}, collected_at=AT)
    assert len(written) == 1
    assert written.iloc[0][contract.REPLAY_AVERAGE] == ""
    assert written.iloc[0][contract.REPLAY_STATUS] == STATUS_FAILED_VERIFY
    assert written.iloc[0][contract.REPLAY_ERROR] == outcome.error
    assert written.iloc[0][contract.PROFILING_AVERAGE] == "10"


def test_missing_only_plans_only_rows_without_a_replay_duration():
    rows = [mm_row(16, replayed="5.5"), mm_row(32, replayed=""), mm_row(64, replayed="N/A"), mm_row(16, replayed="")]
    items = plan_work(rows, "mm", "missing-only")
    assert [item.index for item in items] == [1, 2, 3]
    assert [item.index for item in plan_work(rows, "mm", "all")] == [0, 1, 2]   # row 3 = row 0's call
    outcomes = {items[0].key: ok([7.0]), items[2].key: ok([8.0])}
    written, report = write_back(frame(rows), "mm", outcomes, collected_at=AT, update_mode="missing-only")
    # row 0 shares row 3's call but is filled: missing-only leaves it alone
    assert written[contract.REPLAY_AVERAGE].tolist() == ["5.5", "7", "N/A", "8"]
    assert report.untouched == 2


def test_pruning_happens_only_when_asked_and_is_listed():
    rows = frame([mm_row(16), mm_row(32, profiled=""), mm_row(64, profiled="")])
    keys = [replay_key(r, "mm") for r in rows.to_dict(orient="records")]
    outcomes = {keys[0]: RowOutcome(STATUS_FAILED_BUILD, error="bad"), keys[1]: ok([1.0]),
                keys[2]: RowOutcome(STATUS_SKIPPED_MEMORY, error="too big")}
    kept, report = write_back(rows, "mm", outcomes, collected_at=AT)
    assert len(kept) == 3 and not report.pruned
    pruned, report = write_back(rows, "mm", outcomes, collected_at=AT, prune_invalid_rows=True)
    assert len(pruned) == 2 and [line for line, _, _ in report.pruned] == [2]
    pruned, report = write_back(rows, "mm", outcomes, collected_at=AT, prune_empty_duration_rows=True)
    # line 2 keeps its profiling duration; line 4 (skipped, no profile) has no duration at all
    assert [line for line, _, _ in report.pruned] == [4] and len(pruned) == 2


STATUSES = [STATUS_OK, STATUS_FAILED_BUILD, STATUS_FAILED_VERIFY, STATUS_SKIPPED_MEMORY, None]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.sampled_from(["", "3"]), st.sampled_from(["", "2"]),
                          st.sampled_from(STATUSES)), min_size=0, max_size=12),
       st.sampled_from(["all", "missing-only"]), st.booleans(), st.booleans())
def test_no_row_is_lost_in_any_mode(spec, mode, prune_invalid, prune_empty):
    rows = [mm_row(m, profiled=profiled, replayed=replayed) for m, profiled, replayed, _ in spec]
    outcomes = {}
    for item in plan_work(rows, "mm", mode):
        status = spec[item.index][3]
        if status == STATUS_OK:
            outcomes[item.key] = ok([1.0, 2.0])
        elif status is not None:
            outcomes[item.key] = RowOutcome(status, error="e")
    written, report = write_back(frame(rows), "mm", outcomes, collected_at=AT, prune_invalid_rows=prune_invalid,
                                 prune_empty_duration_rows=prune_empty, update_mode=mode)
    assert len(written) == len(rows) - len(report.pruned)
    if not (prune_invalid or prune_empty):
        assert len(written) == len(rows)
        assert written[contract.PROFILING_AVERAGE].tolist() == [r[contract.PROFILING_AVERAGE] for r in rows]
    # Every surviving row is an input row, in order.
    survivors = written[contract.OUTPUT_SHAPES].tolist()
    pruned_lines = {line for line, _, _ in report.pruned}
    assert survivors == [r[contract.OUTPUT_SHAPES] for i, r in enumerate(rows) if i + 2 not in pruned_lines]
    if mode == "missing-only":
        for i, r in enumerate(rows):
            if r[contract.REPLAY_AVERAGE] and i + 2 not in pruned_lines:
                position = sorted(set(range(len(rows))) - {line - 2 for line in pruned_lines}).index(i)
                assert written.iloc[position][contract.REPLAY_AVERAGE] == r[contract.REPLAY_AVERAGE]
