"""What a model name refers to, decided in one place for every site that names a model (workload.model, the grid's
target models, --consumer-models, predict.py, the workflow's check).

A name is either a transformers config.json (a `.json` path, or a directory that holds a config.json) or a key of
config/models.yaml. Users write `Qwen3-32B`, `qwen3-32b`, `qwen3_32b` or an alias from models.yaml (`dsv3`); all
must find the same entry, so matching ignores case and punctuation, over each model's key and its `aliases`.
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from opperf.errors import OpperfError
from opperf.yaml_files import check_schema, read_yaml_mapping

MODELS_SCHEMA = "models.schema.yaml"
CONFIG_NAME = "config.json"          # the file a Hugging Face checkpoint directory keeps its config in


def normalise_model_name(name: str) -> str:
    """The matching form of a model name: lower case, letters and digits only."""
    return "".join(ch for ch in str(name).lower() if ch.isalnum())


@dataclass(frozen=True)
class ModelReference:
    """A model as a user named it, resolved: a transformers config.json or an entry of models.yaml."""

    given: str                          # as the user wrote it
    name: str                           # as databases, predictions and reports call it
    config_path: Path | None = None     # the config.json file, for a transformers config

    @property
    def is_config(self) -> bool:
        return self.config_path is not None


def model_reference(name: str, models: Mapping[str, object] | str | Path, *, path: str | Path | None = None,
                    field: str | None = None, what: str = "model") -> ModelReference:
    """What `name` refers to: a transformers config.json (a `.json` path, or a directory holding a config.json;
    named `hf_` and its folder or file, config_model_name) or a key or alias of `models` (models.yaml's mapping, or
    its path, read only for such a name; named by its key). A directory that merely shares a model's name (a
    `qwen3-8b/` of results in the working directory) leaves the name a key. An unknown key is an error with the
    closest spellings (model_key)."""
    given = str(name)
    config_path = _config_file(given)
    if config_path is not None:
        return ModelReference(given, config_model_name(config_path), config_path)
    if not isinstance(models, Mapping):
        path = path or models
        models = read_models(models)
    return ModelReference(given, model_key(models, given, path=path, field=field, what=what))


def check_distinct_names(references: Iterable[ModelReference], *, field: str | None = None) -> None:
    """Models named together go by distinct names: two config.json files of one name (`a/x/config.json` and
    `b/x/config.json` are both `hf_x`) would merge their rows, scenarios and predictions."""
    seen: dict[str, ModelReference] = {}
    for reference in references:
        other = seen.setdefault(reference.name, reference)
        if other.config_path is not None and reference.config_path is not None and (
                other.config_path.resolve() != reference.config_path.resolve()):
            raise OpperfError(f"{other.given!r} and {reference.given!r} both go by {reference.name!r} (databases and "
                              "predictions name a config.json's model after its folder, or its file's name): rename "
                              "one", field=field)


def is_config_path(name: str) -> bool:
    """Whether model_reference takes `name` for a transformers config.json rather than a models.yaml key."""
    return _config_file(str(name)) is not None


def _config_file(name: str) -> Path | None:
    """The config.json file `name` stands for (a `.json` path, existing or not, so that a missing one is reported
    as a file; any existing file; a directory holding a config.json), or None for a models.yaml key."""
    candidate = Path(name)
    if name.endswith(".json") or candidate.is_file():
        return candidate
    if (candidate / CONFIG_NAME).is_file():
        return candidate / CONFIG_NAME
    return None


def config_model_name(config_path: str | Path) -> str:
    """The name a config.json's model goes by in databases, predictions and reports: `hf_` and the file's stem
    (`qwen3_8b.json` -> `hf_qwen3_8b`), or its folder's name for a checkpoint's `config.json` (`my_model/config.json`
    -> `hf_my_model`), so that two checkpoints' configs do not share a name."""
    config_path = Path(config_path)
    if config_path.name == CONFIG_NAME:
        return f"hf_{config_path.absolute().parent.name}"
    return f"hf_{config_path.stem}"


def model_key(models: Mapping[str, object], name: str, *, path: str | Path | None = None,
              field: str | None = None, what: str = "model") -> str:
    """The models.yaml key that `name` (a key or an alias, any case or punctuation) refers to.

    `models` maps keys to their entries (a raw models.yaml mapping or loaded model objects); an entry's
    aliases are its `aliases` item or attribute. Unknown names are an error with the closest spelling (a key, an
    alias or a config.json beside the name) and the known keys.
    """
    index: dict[str, str] = {}
    spellings: dict[str, str] = {}
    for key, entry in models.items():
        aliases = entry.get("aliases") if isinstance(entry, Mapping) else getattr(entry, "aliases", ())
        for spelling in (key, *(aliases or ())):
            index.setdefault(normalise_model_name(spelling), str(key))
            spellings.setdefault(normalise_model_name(spelling), str(spelling))
    found = index.get(normalise_model_name(name))
    if found is None:
        close = difflib.get_close_matches(normalise_model_name(name), spellings, n=1, cutoff=0.6)
        hint = closest_config_path(name) if not close else spellings[close[0]]
        if close and index[close[0]] != hint:
            hint += f" ({index[close[0]]})"          # an alias: its key, as the known list names it
        raise OpperfError(f"unknown {what} {name!r}; {f'closest: {hint}; ' if hint else ''}"
                          f"known: {', '.join(sorted(map(str, models)))} "
                          "(or their aliases; case and punctuation are ignored)", path=path, field=field)
    return found


def closest_config_path(name: str | Path, *, most_examined: int = 2000) -> str | None:
    """The existing config.json path spelled most like `name` (a mistyped `my_modle/config.json` beside
    `my_model/config.json`), among the paths as deep as `name` below its deepest existing folder: `.json` files and
    folders holding a config.json. None when none is close."""
    given = Path(name)
    base, rest = given, []
    while str(base) not in ("", ".") and not base.is_dir():
        rest.insert(0, base.name)
        base = base.parent
    if not rest:
        return None
    pattern = "/".join(["*"] * len(rest))
    candidates = [p for p in itertools.islice(base.glob(pattern), most_examined)
                  if (p.suffix == ".json" and p.is_file()) or (p / CONFIG_NAME).is_file()]

    def likeness(candidate: Path) -> float:          # each folder and file alike, not just the shared config.json
        parts = candidate.parts[-len(rest):]
        return min(difflib.SequenceMatcher(None, a, b).ratio() for a, b in zip(rest, parts))

    scored = sorted(((likeness(c), str(c)) for c in candidates), reverse=True)
    return scored[0][1] if scored and scored[0][0] >= 0.6 else None


def read_models(path: str | Path) -> dict:
    """models.yaml as read, checked against config/models.schema.yaml (a bad field is one line naming the
    file, line and field), for every reader of it: the workload, the grid and the workflow's config check."""
    raw = read_yaml_mapping(path, "model configs (model name -> Hugging Face fields)")
    check_schema(raw, MODELS_SCHEMA, path)
    return raw
