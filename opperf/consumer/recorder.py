"""Which program records the consumer's queries for the grid (`grid.consumer_recorder`), the rows msmodeling's own
runner's queries become, and the record a database keeps of it.

- `msmodeling`: msmodeling's `ModelRunner` itself (opperf.consumer.msmodeling_queries): the queries it really
  issues, `tensor_cast.attention` and `tensor_cast.reshape_and_cache` included. It builds transformers
  `config.json` models; a `config/models.yaml` name is opperf's reference decoder, no config msmodeling can build,
  so those stay with opperf's recorder.
- `transformers`: opperf's recorder of a transformers model's (or the reference decoder's) aten ops on meta
  (opperf.grid.queries.record_consumer_queries).
- `auto`: msmodeling where `find_msmodeling()` finds a checkout whose Python imports its runner and the queries are
  bfloat16 (TensorCast builds in float16, its rows are bfloat16: docs/msmodeling.md), else opperf's.

The grid writes `consumer_queries.json` (contract.CONSUMER_QUERIES_RECORD) into its output directory: which recorder recorded each
model, over which scenario space, and with msmodeling its commit. The database build copies it into
op_mapping.yaml's `opperf.consumer_queries` (docs/database.md).
"""

from __future__ import annotations

import functools
import json
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from opperf.consumer.msmodeling_env import Msmodeling, find_msmodeling
from opperf.errors import OpperfError
from opperf.log import get_logger

log = get_logger("consumer")

RECORDERS = ("auto", "msmodeling", "transformers")
MSMODELING, TRANSFORMERS = "msmodeling", "transformers"
# What msmodeling's recorder imports (its ModelRunner and everything it pulls in): a Python that cannot is no use.
RUNNER_MODULE = "tensor_cast.core.model_runner"
MSMODELING_DTYPE = "bfloat16"
NOT_A_CONFIG = "a config/models.yaml reference decoder, not a transformers config msmodeling builds"


@dataclass(frozen=True)
class RecorderChoice:
    """The recorder of each consumer model, and why."""

    recorder: str                                   # msmodeling | transformers: the config.json models'
    reason: str
    install: Msmodeling | None = None               # with msmodeling
    by_model: dict[str, str] = field(default_factory=dict)   # model as given -> msmodeling | transformers

    def models(self, recorder: str) -> list[str]:
        return [model for model, chosen in self.by_model.items() if chosen == recorder]

    def describe(self) -> str:
        parts = []
        if self.models(MSMODELING):
            parts.append(f"msmodeling's runner ({self.install.describe()}): {', '.join(self.models(MSMODELING))}")
        if self.models(TRANSFORMERS):
            parts.append(f"opperf's transformers recorder: {', '.join(self.models(TRANSFORMERS))}")
        return f"consumer queries recorded by {'; '.join(parts) or 'nothing (no model)'} ({self.reason})"


@functools.lru_cache(maxsize=4)
def msmodeling_import_error(python: str, directory: str) -> str | None:
    """None where `python` imports msmodeling's runner from the checkout `directory`, else the error's last line
    (a few seconds: it imports torch and transformers)."""
    code = f"import sys; sys.path.insert(0, {directory!r}); import {RUNNER_MODULE}"
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python}: {exc}"
    if done.returncode == 0:
        return None
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit {done.returncode}"


def choose_recorder(setting: str, models: Sequence[str], models_path: str | Path, dtype: str = MSMODELING_DTYPE,
                    msmodeling_dir: str | Path | None = None) -> RecorderChoice:
    """The recorder of `models`' queries for `setting` (auto | msmodeling | transformers): config.json models by
    msmodeling where the setting and the checkout allow, models.yaml names by opperf's recorder always. An explicit
    `msmodeling` with no usable checkout, or another dtype than bfloat16, is an error naming the key."""
    from opperf.model_names import model_reference

    if setting not in RECORDERS:
        raise OpperfError(f"unknown recorder {setting!r}; one of {', '.join(RECORDERS)}",
                          field="grid.consumer_recorder")
    configs = {model: model_reference(model, models_path).is_config for model in models}
    by_model = {model: TRANSFORMERS for model in models}
    if setting == TRANSFORMERS:
        return RecorderChoice(TRANSFORMERS, "grid.consumer_recorder: transformers", by_model=by_model)
    if not any(configs.values()):
        return RecorderChoice(TRANSFORMERS, f"every model is {NOT_A_CONFIG}" if models else "no model",
                              by_model=by_model)
    if dtype != MSMODELING_DTYPE:
        reason = (f"grid.consumer_dtype is {dtype}; msmodeling's runner builds in float16, which its runtime spells "
                  "as bfloat16: its rows are bfloat16")
        if setting == MSMODELING:
            raise OpperfError(reason, field="grid.consumer_recorder")
        return RecorderChoice(TRANSFORMERS, reason, by_model=by_model)
    install = find_msmodeling(msmodeling_dir)
    problem = None
    if install is None:
        problem = "no msmodeling checkout (set OPPERF_MSMODELING_DIR or lay it in ../shared/msmodeling)"
    else:
        error = msmodeling_import_error(install.python, str(install.directory))
        if error:
            problem = f"{install.python} cannot import {RUNNER_MODULE} from {install.directory}: {error}"
    if problem:
        if setting == MSMODELING:
            raise OpperfError(problem, field="grid.consumer_recorder")
        return RecorderChoice(TRANSFORMERS, f"auto: {problem}", by_model=by_model)
    by_model.update({model: MSMODELING for model, is_config in configs.items() if is_config})
    reason = f"grid.consumer_recorder: {setting}"
    if not all(configs.values()):
        reason += f"; {', '.join(m for m, c in configs.items() if not c)}: {NOT_A_CONFIG}"
    return RecorderChoice(MSMODELING, reason, install, by_model)


def recorders_for(setting: str, models: Sequence[str], models_path: str | Path, database: str | Path,
                  msmodeling_dir: str | Path | None = None, dtype: str = MSMODELING_DTYPE
                  ) -> tuple[dict[str, str], Msmodeling | None]:
    """The recorder of each model's queries for the database check, and msmodeling's checkout where one records:
    `auto` is the recorder the database's op_mapping.yaml records for the model (`opperf.consumer_queries`, the
    grid's), else opperf's; `msmodeling` and `transformers` as choose_recorder decides them."""
    if setting != "auto":
        choice = choose_recorder(setting, models, models_path, dtype, msmodeling_dir)
        return choice.by_model, choice.install
    from opperf.consumer.runtime import load_op_mapping
    from opperf.model_names import model_reference

    record = (load_op_mapping(database).get("opperf") or {}).get("consumer_queries") or {}
    recorded_by = record.get("recorded_by") or {}
    by_model = {m: recorded_by.get(model_reference(m, models_path).name, TRANSFORMERS) for m in models}
    install = None
    if MSMODELING in by_model.values():
        install = find_msmodeling(msmodeling_dir)
        if install is None:
            raise OpperfError("its queries were recorded by msmodeling (op_mapping.yaml opperf.consumer_queries) and "
                              "no msmodeling checkout is found to ask: set OPPERF_MSMODELING_DIR or give "
                              "--msmodeling", path=database, field="--consumer-recorder")
    return by_model, install


def record_msmodeling_calls(install: Msmodeling, models: Sequence[str], models_path: str | Path, *,
                            scenarios: str | Path | None, space: str, device, layers: int | None = 2,
                            between_points: bool = False, timeout_s: float | None = None) -> list:
    """The calls msmodeling's runner issues for `models` (config.json models) over scenario space `space` at each of
    its TP sizes (ScenarioCalls, named `{model} TP{tp} {scenario}`), recorded on the database's `device` (its
    DeviceProfile, opperf.consumer.msmodeling_device), `layers` deep (the counts at the model's own depth follow).
    A TP size msmodeling refuses for a model is left out with a warning naming its error; TP 1 refused is an
    error. `between_points`: the scenarios between the space's points too (ScenarioSpace.between_points), named
    `{model} TP{tp} between {scenario}`. A MoE model's token counts between the points that only a row of their
    own answers (msmodeling_queries.expert_split_scenarios) are recorded too, named `{model} TP{tp} expert split
    {scenario}`."""
    from opperf.consumer.msmodeling_device import msmodeling_name, write_device_profile
    from opperf.consumer.msmodeling_queries import (expert_split_scenarios, moe_routing_width, record_model_queries,
                                                    scenario_texts)
    from opperf.consumer.scenarios import DEFAULT_SCENARIO_SPACE, load_scenario_space
    from opperf.model_names import model_reference

    scenario_space = load_scenario_space(scenarios or DEFAULT_SCENARIO_SPACE, space)
    texts = scenario_texts(scenario_space)
    between = scenario_space.between_points() if between_points else []
    recorded = []
    with tempfile.TemporaryDirectory(prefix="opperf-device-") as work:
        profile = write_device_profile(device, work)
        for model in models:
            reference = model_reference(model, models_path)
            tp_sizes, left_out = [], {}
            for tp in scenario_space.tp_sizes:
                def record(scenario_texts: list[str], tp: int = tp) -> list:
                    return record_model_queries(install, reference.config_path, scenario_texts, layers=layers, tp=tp,
                                                device=msmodeling_name(device), device_profile=profile,
                                                timeout_s=timeout_s).scenarios

                try:
                    scenarios = record([*texts, *between])
                except OpperfError as exc:
                    if tp == 1:
                        raise
                    left_out[tp] = exc.reason.strip().splitlines()[-1]
                    continue
                tp_sizes.append(tp)
                width = moe_routing_width(scenarios)
                splits = [text for text in (expert_split_scenarios(scenario_space, *width) if width else [])
                          if text not in between]
                if splits:
                    log.info("%s TP%d: %d token counts where an expert of %d (top-%d) gets fewer than 2 tokens, "
                             "between the points: recorded for their own rows", reference.name, tp, len(splits),
                             width[1], width[0])
                    scenarios += record(splits)
                for scenario in scenarios:
                    scenario.between_points = scenario.name in between
                    where = ("between " if scenario.between_points else
                             "expert split " if scenario.name in splits else "")
                    scenario.name = f"{reference.name} TP{tp} {where}{scenario.name}"
                recorded += scenarios
            if left_out:
                log.warning("scenario space %r: msmodeling records %s at TP %s; left out: %s", space, reference.name,
                            ", ".join(map(str, tp_sizes)),
                            "; ".join(f"TP {tp} ({reason})" for tp, reason in left_out.items()))
            log.info("recorded msmodeling's queries: %d scenarios of %s at TP %s on %s%s",
                     len(texts) * len(tp_sizes), reference.name, ", ".join(map(str, tp_sizes)),
                     msmodeling_name(device), f", and {len(between) * len(tp_sizes)} between them" if between else "")
    return recorded


def record_msmodeling_rows(install: Msmodeling, models: Sequence[str], models_path: str | Path, *,
                           scenarios: str | Path | None, space: str, device, accelerator_core: str,
                           estimator=None, layers: int | None = 2, timeout_s: float | None = None):
    """QueryRows of msmodeling's queries of `models` over scenario space `space` (record_msmodeling_calls), laid
    by opperf.consumer.msmodeling_queries.rows_from_calls; `estimator` drops rows over the device's memory."""
    from opperf.consumer.msmodeling_queries import rows_from_calls

    recorded = record_msmodeling_calls(install, models, models_path, scenarios=scenarios, space=space, device=device,
                                       layers=layers, timeout_s=timeout_s)
    return rows_from_calls(recorded, accelerator_core, estimator)


def consumer_record(choice: RecorderChoice, models_path: str | Path, space: str) -> dict:
    """consumer_queries.json's content (op_mapping.yaml's `opperf.consumer_queries`): each model by the name
    databases give it, its recorder, the scenario space and, with msmodeling, its commit. No paths."""
    from opperf.model_names import model_reference

    record = {"recorded_by": {model_reference(m, models_path).name: chosen for m, chosen in choice.by_model.items()},
              "scenario_space": space}
    if choice.models(MSMODELING):
        record["msmodeling_commit"] = choice.install.commit
        record["msmodeling_commit_source"] = choice.install.commit_source
    return record


def read_consumer_record(path: str | Path) -> dict:
    """A grid's consumer_queries.json (errors name the file)."""
    path = Path(path)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise OpperfError(f"cannot read the consumer queries' record: {exc.strerror}", path=path) from None
    except json.JSONDecodeError as exc:
        raise OpperfError(f"not valid JSON: {exc}", path=path) from None
    if not isinstance(record, dict) or not isinstance(record.get("recorded_by"), dict):
        raise OpperfError("not a consumer queries' record: no `recorded_by` mapping", path=path)
    return record
