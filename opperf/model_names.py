"""One way to look a model up by name wherever a model is named (workload --model, grid, config).

Users write `Qwen3-32B`, `qwen3-32b`, `qwen3_32b` or an alias from models.yaml (`dsv3`); all must find the
same entry, so matching ignores case and punctuation, over each model's key and its `aliases`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from opperf.errors import OpperfError
from opperf.yaml_files import check_schema, read_yaml_mapping

MODELS_SCHEMA = "models.schema.yaml"


def normalise_model_name(name: str) -> str:
    """The matching form of a model name: lower case, letters and digits only."""
    return "".join(ch for ch in str(name).lower() if ch.isalnum())


def is_config_path(name: str) -> bool:
    """Whether a model name is a transformers config.json (a `.json` path, a file that exists, or a directory that
    holds a config.json) rather than a key of models.yaml: a directory that merely shares a model's name (a
    `qwen3-8b/` of results in the working directory) leaves the name a key."""
    candidate = Path(name)
    return str(name).endswith(".json") or candidate.is_file() or (candidate / "config.json").is_file()


def config_model_name(name: str) -> str:
    """The name a config.json's model goes by in databases, predictions and reports: `hf_` and the file's stem
    (`qwen3_8b.json` -> `hf_qwen3_8b`), or the directory's name for a directory holding a config.json."""
    candidate = Path(name)
    return f"hf_{candidate.stem if str(name).endswith('.json') or candidate.is_file() else candidate.name}"


def model_key(models: Mapping[str, object], name: str, *, path: str | Path | None = None,
              field: str | None = None, what: str = "model") -> str:
    """The models.yaml key that `name` (a key or an alias, any case or punctuation) refers to.

    `models` maps keys to their entries (a raw models.yaml mapping or loaded model objects); an entry's
    aliases are its `aliases` item or attribute. Unknown names are an error listing the known keys.
    """
    index: dict[str, str] = {}
    for key, entry in models.items():
        aliases = entry.get("aliases") if isinstance(entry, Mapping) else getattr(entry, "aliases", ())
        for spelling in (key, *(aliases or ())):
            index.setdefault(normalise_model_name(spelling), str(key))
    found = index.get(normalise_model_name(name))
    if found is None:
        raise OpperfError(f"unknown {what} {name!r}; known: {', '.join(sorted(map(str, models)))} "
                          "(or their aliases; case and punctuation are ignored)", path=path, field=field)
    return found


def read_models(path: str | Path) -> dict:
    """models.yaml as read, checked against config/models.schema.yaml (a bad field is one line naming the
    file, line and field), for every reader of it: the workload, the grid and the workflow's config check."""
    raw = read_yaml_mapping(path, "model configs (model name -> Hugging Face fields)")
    check_schema(raw, MODELS_SCHEMA, path)
    return raw
