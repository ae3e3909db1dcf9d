"""The workflow's own settings as the defaults of scripts run by hand: one place (config/config.yaml) where each
value is chosen and its reason written, read without the workflow check's imports (a replay env has no polars)."""

from __future__ import annotations

from pathlib import Path

from opperf.yaml_files import check_schema, read_yaml_mapping

WORKFLOW_CONFIG = Path(__file__).resolve().parents[1] / "config" / "config.yaml"
CONFIG_SCHEMA = "config.schema.yaml"


def workflow_defaults(section: str, path: str | Path = WORKFLOW_CONFIG) -> dict:
    """One section of the workflow's config/config.yaml, the schema's defaults filled in: what a script run by
    hand takes as its defaults, so that it measures as the workflow does."""
    config = read_yaml_mapping(path, "workflow config")
    check_schema(config, CONFIG_SCHEMA, path, set_defaults=True)
    return config[section]
