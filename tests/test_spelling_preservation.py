"""The database keeps every profiler spelling byte for byte (dtypes, formats, shapes, Type).

The peer runtime (msmodeling's tensor_cast) looks rows up by exact strings: `FLOAT`, `INT64`, `BOOL` and
`DT_BF16` side by side, `FLOAT16` / `FORMAT_ND` in older files. Each fixture is parsed, turned into final
database CSVs, and every written field is compared with the source file's own text (read with the csv
module, not opperf), shape fields with the profiler's literal quotes: the runtime reads an empty cell as
NaN and its shape parser raises on it, while `""` (the profiler's empty shape) parses to no shape.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from opperf import contract
from opperf.database.build import finalise_kernel_csv
from opperf.parse import parse_profiles

REPO = Path(__file__).resolve().parent.parent
FIXTURES = {
    "kernel_details_cann8": REPO / "resources" / "profiles" / "A3_vllm0.18.0_torch2.9.0_cann8.5" / "kernel_details.csv",
    "op_summary_cann6": next((REPO / "tests" / "data" / "replay_npu" / "prof_cann6").rglob("op_summary_*.csv")),
    "op_summary_msprof": next((REPO / "tests" / "data" / "replay_npu" / "msprof_run").rglob("op_summary_*.csv")),
    "kernel_details_hcom": REPO / "tests" / "data" / "comm" / "kernel_details_hcom.csv",
}
SPELLED = (contract.INPUT_SHAPES, contract.OUTPUT_SHAPES, contract.INPUT_DTYPES, contract.INPUT_FORMATS,
           contract.OUTPUT_DTYPES, contract.OUTPUT_FORMATS, contract.ACCELERATOR_CORE)


def _source_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8-sig") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        row.setdefault("Type", row.get("OP Type", ""))
        row.setdefault(contract.ACCELERATOR_CORE, row.get("Task Type", ""))
    return rows


def _type_name(raw: str) -> str:
    """The Type as written, except the per-instance suffixes DESIGN.md folds (`muls_add_kernel_1`)."""
    return re.sub(r"^(split_qkv_rmsnorm_rope_kernel|muls_add_kernel)_\d+$", r"\1", raw.strip())


def _unquoted(text: str) -> str:
    """The profiler's literal quotes around a shape field dropped (`\"\"\"4,8\"\"\"` in the file is `\"4,8\"`)."""
    text = text.strip()
    while len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1]
    return "" if text == '"' else text


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_written_value_is_the_source_spelling(tmp_path, name):
    source = FIXTURES[name]
    parse_profiles([source], tmp_path / "parsed")
    by_group: dict[tuple[str, str, str], dict[str, str]] = {}
    for row in _source_rows(source):
        key = (_type_name(row["Type"]), _unquoted(row[contract.INPUT_SHAPES]), _unquoted(row[contract.OUTPUT_SHAPES]))
        by_group.setdefault(key, row)                  # the group's first row, as the contract says
    checked = 0
    for parsed in sorted((tmp_path / "parsed").glob("*.csv")):
        final = tmp_path / "data" / parsed.name
        finalise_kernel_csv(parsed, parsed.stem, final)
        with open(final, newline="", encoding="utf-8") as handle:
            for written in csv.DictReader(handle):
                first = by_group[(parsed.stem, _unquoted(written[contract.INPUT_SHAPES]),
                                  _unquoted(written[contract.OUTPUT_SHAPES]))]
                for column in SPELLED:
                    assert written[column] == first[column], (name, parsed.stem, column)
                checked += 1
    assert checked > 0


def test_the_real_fixture_keeps_its_mixed_spellings(tmp_path):
    """The real A3 rows mix `FLOAT`, `BOOL`, `INT64`, `UINT8` and `DT_BF16`; none becomes `DT_FLOAT` & co."""
    parse_profiles([FIXTURES["kernel_details_cann8"]], tmp_path / "parsed")
    with open(tmp_path / "parsed" / "FlashAttentionScore.csv", newline="", encoding="utf-8") as handle:
        first = next(csv.DictReader(handle))
    assert first[contract.INPUT_DTYPES] == ("DT_BF16;DT_BF16;DT_BF16;DT_BF16;UINT8;DT_BF16;BOOL;INT64;INT64;INT64;"
                                            "INT64;INT64")
    assert first[contract.OUTPUT_DTYPES].split(";")[:2] == ["FLOAT", "FLOAT"]
    assert first[contract.INPUT_FORMATS].startswith("NCL;NCL;NCL;ND")
    with open(tmp_path / "parsed" / "Add.csv", newline="", encoding="utf-8") as handle:
        scalar_add = [r for r in csv.DictReader(handle) if r[contract.INPUT_SHAPES] == ";"]
    assert scalar_add[0][contract.INPUT_DTYPES] == "FLOAT;FLOAT" and scalar_add[0][contract.OUTPUT_DTYPES] == "FLOAT"


def test_old_spellings_survive_and_still_match_new_ones(tmp_path):
    """CANN 6 `FLOAT16` / `FORMAT_ND` are written as such; signatures still equal the DT_/ND spelling's."""
    parse_profiles([FIXTURES["op_summary_cann6"]], tmp_path / "parsed")
    with open(tmp_path / "parsed" / "Add.csv", newline="", encoding="utf-8") as handle:
        row = next(csv.DictReader(handle))
    assert row[contract.INPUT_DTYPES] == "FLOAT16;FLOAT16" and row[contract.INPUT_FORMATS] == "FORMAT_ND;FORMAT_ND"
    modern = {**row, contract.INPUT_DTYPES: "DT_FLOAT16;DT_FLOAT16", contract.INPUT_FORMATS: "ND;ND",
              contract.OUTPUT_DTYPES: "DT_FLOAT16"}
    assert contract.row_signature(row) == contract.row_signature(modern)
