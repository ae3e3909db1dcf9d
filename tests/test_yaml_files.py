"""A schema error in a list names the entry that is wrong, not the whole list: every list field of every schema
(opperf.yaml_files), through the one place that words schema errors."""

from __future__ import annotations

import pytest

import opperf.yaml_files as yaml_files
from opperf.errors import OpperfError

SCHEMA = """\
type: object
properties:
  scenarios:
    description: "a list of prefill:N, or a mapping from a back end to such a list"
    oneOf:
      - {type: array, items: {type: string, pattern: "^prefill:[1-9][0-9]*$"}}
      - {type: object, additionalProperties: {type: array, items: {type: string, pattern: "^prefill:[1-9][0-9]*$"}}}
"""
FORMS = "fits none of the allowed forms (a list of prefill:N, or a mapping from a back end to such a list)"


@pytest.fixture
def schema_dir(tmp_path, monkeypatch):
    (tmp_path / "entries.schema.yaml").write_text(SCHEMA)
    monkeypatch.setattr(yaml_files, "SCHEMAS_DIR", tmp_path)
    yaml_files._schema.cache_clear()
    yield tmp_path
    yaml_files._schema.cache_clear()


@pytest.mark.parametrize("text, line, field, reason", [
    ("scenarios: [prefill:8, prefill:abc]\n", 1, "scenarios[1]", f"'prefill:abc' {FORMS}"),
    ("scenarios:\n  cpu:\n    - prefill:8\n    - 7\n", 4, "scenarios.cpu[1]", "must be a string, got 7"),
    ("scenarios: 5\n", 1, "scenarios", f"5 {FORMS}")])
def test_a_bad_list_entry_is_named_by_its_index(schema_dir, text, line, field, reason):
    import yaml

    path = schema_dir / "my.yaml"
    path.write_text(text)
    with pytest.raises(OpperfError) as raised:
        yaml_files.check_schema(yaml.safe_load(text), "entries.schema.yaml", path)
    assert str(raised.value) == f"{path}, line {line}, field '{field}': {reason}"


def test_field_names_and_keys_are_each_others_inverse():
    keys = ["predict", "scenarios", "cpu", 0]
    assert yaml_files.field_name(keys) == "predict.scenarios.cpu[0]"
    assert yaml_files.field_keys(yaml_files.field_name(keys)) == keys
