"""What the workflow checks when it loads, before any job runs: the config, the device catalog, the models,
the kernel definitions and the sources sheet.

Every mistake is one OpperfError naming the file, the line and the field; rules/common.smk raises it as a
one-line WorkflowError, so a typo never surfaces later as a KeyError or an InputFunctionException inside a
job. Snakemake merges config files (the Snakefile's `configfile:`, then `--configfile`, then `--config`):
an error names the one that set the offending key.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from opperf.devices import Device, load_catalog
from opperf.errors import OpperfError
from opperf.io import not_utf8_error
from opperf.model_names import model_reference
from opperf.versions import parse_version_dir
from opperf.workflow_defaults import CONFIG_SCHEMA, WORKFLOW_CONFIG, workflow_defaults  # noqa: F401 (re-exported)
from opperf.yaml_files import check_schema, located_error, read_yaml_mapping

SOURCE_COLUMNS = ("device", "stack", "version_dir", "path")


@dataclass(frozen=True)
class WorkflowInputs:
    """The checked catalog and sources sheet the rules are built from."""

    devices: dict[str, Device]
    sources: list[dict[str, str]]


def check_config_file(path: str | Path) -> None:
    """The Snakefile's own config file is YAML with a mapping at the top (Snakemake's loader says only "not
    valid JSON or YAML", without the line). A missing file is Snakemake's to report (--configfile may stand in)."""
    if Path(path).is_file():
        read_yaml_mapping(path, "workflow config")


def config_files_by_precedence(loaded: Sequence[str | Path], command_line: Sequence[str | Path]) -> list[str]:
    """Config files lowest precedence first: the Snakefile's `configfile:` ones, then `--configfile` ones."""
    given = [str(Path(f).absolute()) for f in command_line]
    return ([str(f) for f in loaded if str(Path(f).absolute()) not in given]
            + [str(_as_given(Path(f))) for f in command_line])


def check_workflow(config: dict, *, config_files: Sequence[str | Path], overrides: Mapping | None = None,
                   definitions_root: str | Path) -> WorkflowInputs:
    """Validate everything the rules read (see module docstring), filling in the config schema's defaults."""
    files = list(config_files) or ["config/config.yaml"]
    check_schema(config, CONFIG_SCHEMA, files[-1], set_defaults=True, files=files, overrides=overrides)

    def config_error(message: str, keys: Sequence[str]) -> OpperfError:
        return located_error(message, keys, files, overrides)

    devices = load_catalog(config["devices"])
    for section in ("workload", "comm"):
        settings = config.get(section) or {}
        if settings.get("enabled", True) and settings.get("device", "CPU") not in devices:
            raise config_error(f"device {settings.get('device', 'CPU')!r} is not in {config['devices']} "
                               f"(known: {', '.join(sorted(devices))})", [section, "device"])
    _check_version_dirs(config, config_error)
    _check_models(config, config_error)
    _check_predict_scenarios(config, config_error)
    replay = config.get("replay") or {}
    if replay.get("time_budget_s") is not None and replay["min_repeat_count"] > replay["repeat_count"]:
        raise config_error(f"must be at most replay.repeat_count ({replay['repeat_count']}), the most timed calls a "
                           f"row gets, got {replay['min_repeat_count']}", ["replay", "min_repeat_count"])
    grid = config.get("grid") or {}
    if grid.get("enabled", True):
        from opperf.grid.config import load_grid_config

        load_grid_config(grid["patterns"])
        if grid["queries_only"] and not grid["consumer_queries"]:
            raise config_error("needs grid.consumer_queries: true (the queries whose rows would be the grid)",
                               ["grid", "queries_only"])
        if grid["consumer_queries"]:
            from opperf.consumer.scenarios import load_scenario_space

            try:
                load_scenario_space(grid["scenarios"], grid["scenario_space"])
            except OpperfError as exc:
                raise config_error(str(exc), ["grid", "scenario_space"]) from None
            if grid["consumer_recorder"] == "msmodeling" and grid["consumer_dtype"] != "bfloat16":
                raise config_error(f"msmodeling's runner builds in float16, which its runtime spells as bfloat16: its "
                                   f"rows are bfloat16, not grid.consumer_dtype {grid['consumer_dtype']}",
                                   ["grid", "consumer_recorder"])
    sources = read_sources(config["sources"], devices, config["devices"])
    _check_definitions(config, sources, devices, _as_given(Path(definitions_root)))
    return WorkflowInputs(devices=devices, sources=sources)


def _as_given(path: Path) -> Path:
    """`path` relative to the working directory where it lies below it, as a user names workflow files."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return path


def _check_version_dirs(config: dict, config_error) -> None:
    """A configured workload.version_dir and comm.version_dir are of their back end's form: refused here, in one
    line, rather than when the planner first derives a database path from them."""
    from opperf.comm.collectives import check_comm_version_dir
    from opperf.versions import check_workload_version_dir

    checks = (("workload", lambda settings: check_workload_version_dir(settings["version_dir"], settings["backend"])),
              ("comm", lambda settings: check_comm_version_dir(settings["version_dir"], settings["backend"])))
    for section, check in checks:
        settings = config.get(section) or {}
        if settings.get("enabled", True) and settings.get("version_dir"):
            try:
                check(settings)
            except OpperfError as exc:
                raise config_error(exc.reason, [section, "version_dir"]) from None


def _check_models(config: dict, config_error) -> None:
    """models.yaml in full (the grid's checks too), and every model the config names is in it or is a readable
    transformers config.json."""
    from opperf.grid.models import load_models, model_from_config_json

    models = load_models(config["models"])
    named: list[tuple[str, list[str | int]]] = []
    workload = config.get("workload") or {}
    if workload.get("enabled", True):
        named.append((workload.get("model", "opperf-tiny"), ["workload", "model"]))
    grid = config.get("grid") or {}
    if grid.get("enabled", True):
        targets = grid.get("target_models", [])
        if isinstance(targets, dict):
            named += [(name, ["grid", "target_models", key, i]) for key, names in targets.items()
                      for i, name in enumerate(names)]
        else:
            named += [(name, ["grid", "target_models", i]) for i, name in enumerate(targets)]
    for name, keys in named:
        try:
            reference = model_reference(name, models)
        except OpperfError as exc:
            raise config_error(exc.reason.replace(f"{name!r};", f"{name!r} in {config['models']};", 1),
                               keys) from None
        if reference.is_config:
            try:
                model_from_config_json(reference)      # the grid's reading of it, and the workload's
            except OpperfError as exc:
                raise config_error(str(exc), keys) from None
        elif keys == ["workload", "model"]:
            # The reference decoder has opperf's own attention and no experts.
            for key, default in (("kv_cache", "dynamic"), ("experts_implementation", None), ("routing", "model")):
                if workload.get(key, default) != default:
                    raise config_error(f"sets how a transformers model runs (workload.model a config.json); "
                                       f"the reference decoder {name!r} has no such setting", ["workload", key])


def _check_predict_scenarios(config: dict, config_error) -> None:
    """Every entry of predict.scenarios as scripts/predict.py reads a --scenario (one parser: the same scenarios
    refused in the same words), the error at the entry."""
    from opperf.consumer.scenarios import parse_scenario_text

    scenarios = (config.get("predict") or {}).get("scenarios") or []
    entries = ([(["predict", "scenarios", key, i], text) for key, texts in scenarios.items()
                for i, text in enumerate(texts)] if isinstance(scenarios, dict)
               else [(["predict", "scenarios", i], text) for i, text in enumerate(scenarios)])
    for keys, text in entries:
        try:
            parse_scenario_text(text)
        except OpperfError as exc:
            raise config_error(exc.reason, keys) from None


def _check_definitions(config: dict, sources: list[dict[str, str]], devices: dict[str, Device],
                       definitions_root: Path) -> None:
    """The kernel definitions of every back-end family the databases use load and validate."""
    from opperf.replay.definitions import load_definitions

    used = {row["device"] for row in sources}
    workload = config.get("workload") or {}
    if workload.get("enabled", True):
        used.add(workload.get("device", "CPU"))
    for family in sorted({"npu" if devices[d].backend == "npu" else "torch" for d in used if d in devices}):
        directory = definitions_root / family
        if directory.is_dir():
            load_definitions(directory, "npu" if family == "npu" else None)


def read_sources(path: str | Path, devices: Mapping[str, Device], devices_path: str | Path) -> list[dict[str, str]]:
    """The sources sheet: one registered raw profile per row; several rows may feed one database.

    The same profile registered twice for one database (the same file, another spelling of its path, or a
    file inside a registered directory) would count its launches twice: refused, naming both lines.
    """
    path = Path(path)
    if not path.is_file():
        raise OpperfError("sources sheet not found (config key 'sources')", path=path)
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            table = list(_rows_with_lines(csv.DictReader(handle, delimiter="\t")))
    except UnicodeDecodeError:
        raise not_utf8_error(path, delimiter="\t") or OpperfError("not UTF-8 text", path=path) from None
    rows: list[dict[str, str]] = []
    claimed: dict[tuple[str, str, str], list[tuple[int, Path, str]]] = {}
    for line, row in table:
        for column in SOURCE_COLUMNS:
            if not (row.get(column) or "").strip():
                raise OpperfError("empty or missing", path=path, row=line, field=column)
        if row["device"] not in devices:
            raise OpperfError(f"{row['device']!r} is not in {devices_path} (known: {', '.join(sorted(devices))})",
                              path=path, row=line, field="device")
        try:
            parse_version_dir(row["version_dir"])
        except OpperfError as exc:
            raise OpperfError(exc.reason, path=path, row=line, field="version_dir") from None
        profile = Path(row["path"])
        if not profile.exists():
            raise OpperfError(f"{row['path']!r} does not exist", path=path, row=line, field="path")
        database = (row["device"], row["stack"], row["version_dir"])
        resolved = profile.resolve()
        for other_line, other, spelled in claimed.get(database, []):
            if resolved == other or other in resolved.parents or resolved in other.parents:
                how = "is the same profile as" if resolved == other else "overlaps"
                raise OpperfError(f"{row['path']!r} {how} line {other_line} ({spelled!r}) of database "
                                  f"{'/'.join(database)}: its launches would be counted twice; keep one of the lines",
                                  path=path, row=line, field="path")
        claimed.setdefault(database, []).append((line, resolved, row["path"]))
        rows.append(row)
    return rows


def _rows_with_lines(reader: csv.DictReader):
    """(line as an editor shows it, row) of every non-blank row."""
    for row in reader:
        if any((value or "").strip() for value in row.values() if isinstance(value, str)):
            yield reader.line_num, row


# What a copy of the workflow needs to run: its code and default configuration (not data/, results/, .venv/).
WORKFLOW_PARTS = ("Snakefile", "rules", "scripts", "opperf", "config", "templates", "resources", "envs", "report")


def copy_workflow(destination: str | Path, source: str | Path | None = None) -> Path:
    """A fresh copy of the workflow in `destination`, to run there with its own data/, results/ and reports/ (the
    tests' temporary workflows, the end-to-end benchmark's one per model)."""
    import shutil

    source = Path(source) if source else Path(__file__).resolve().parents[1]
    destination = Path(destination)
    destination.mkdir(parents=True, exist_ok=True)
    for part in WORKFLOW_PARTS:
        if (source / part).is_dir():
            shutil.copytree(source / part, destination / part, ignore=shutil.ignore_patterns("__pycache__"))
        elif (source / part).exists():
            shutil.copy2(source / part, destination / part)
    return destination
