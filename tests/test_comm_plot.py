"""The busbw plot and the largest-message table, on the committed H200 runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from opperf.comm.plot import largest_message_table, load_runs, plot_bus_bandwidth
from opperf.errors import OpperfError

H200 = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "comm"


def test_plot_and_table_of_the_h200_runs(tmp_path):
    frame = load_runs([("4xH200", H200 / "h200x4"), ("2xH200", H200 / "h200x2")])
    assert len(frame) == 20 * 4 * 2 * 3        # sizes x ops x modes x (two groups on x4, one on x2)
    output = tmp_path / "busbw.png"
    plot_bus_bandwidth(frame, output, limit_gbps=450, limit_label="NVLink 4")
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = largest_message_table(frame, 450)
    assert "| 4xH200 | kernel | all_reduce | 4 | 512MiB | 2298.3 | 350.4 | 77.9% |" in table
    assert table.count("\n") == 2 + 24


def test_a_directory_without_collective_csvs_is_an_error(tmp_path):
    with pytest.raises(OpperfError, match="no collective CSV found"):
        load_runs([("empty", tmp_path)])
