"""The YAML files a user edits (config, device catalog, models, grid patterns, kernel definitions): read and
checked in one place, so every mistake is one line naming the file, the line YAML gives and the field.

Syntax errors carry the line of YAML's problem mark. Schema checks use JSON Schema (`config/*.schema.yaml`,
draft 2020-12, via jsonschema) and report the first error at the line of the offending key, found by
walking YAML's node tree (`yaml.compose`) along the error's path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from opperf.errors import OpperfError, os_reason

SCHEMAS_DIR = Path(__file__).resolve().parent.parent / "config"
# libyaml's loader where PyYAML was built with it: ~10x faster on the ~170 kernel definitions the workflow checks.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_VALUE_CHARS = 60


def syntax_error(exc: yaml.YAMLError, path: str | Path) -> OpperfError:
    """A YAML syntax error as one line: file, the line of YAML's mark, and its problem."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and context_mark is not None and mark is not None and context_mark.line != mark.line:
        context = f"{context} started at line {context_mark.line + 1}"
    reason = f"not valid YAML: {problem}" + (f" ({context})" if context else "")
    return OpperfError(reason, path=path, row=mark.line + 1 if mark is not None else None)


def read_yaml(path: str | Path, what: str) -> Any:
    """A YAML file's content; an unreadable file or a syntax error is an OpperfError naming file and line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise OpperfError(f"the {what} does not exist", path=path) from exc
    except UnicodeDecodeError as exc:
        raise OpperfError(f"the {what} is not UTF-8 text ({exc.reason})", path=path) from exc
    except OSError as exc:
        raise OpperfError(f"cannot read the {what}: {os_reason(exc)}", path=path) from exc
    try:
        return yaml.load(text, Loader=SAFE_LOADER)
    except yaml.YAMLError as exc:
        raise syntax_error(exc, path) from exc


def read_yaml_mapping(path: str | Path, what: str, *, empty_ok: bool = False) -> dict:
    """A YAML file whose top level is a mapping (see read_yaml); anything else is an error naming the file."""
    raw = read_yaml(path, what)
    if raw is None and empty_ok:
        return {}
    if not isinstance(raw, dict):
        raise OpperfError(f"the {what} must be a mapping at the top level, got "
                          f"{'an empty file' if raw is None else type(raw).__name__}", path=path, row=1)
    return raw


def line_of(path: str | Path, keys: Sequence[str | int]) -> int | None:
    """The 1-based line of the node at `keys` in a YAML file (a mapping key's own line), or of its deepest
    existing ancestor; None when the file cannot be read or composed, or `keys` leads nowhere in it."""
    try:
        node = yaml.compose(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if node is None:
        return None
    line = node.start_mark.line + 1 if not keys else None
    for key in keys:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == str(key)), None)
            if match is None:
                return line
            line, node = match[0].start_mark.line + 1, match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and 0 <= key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def field_keys(field: str) -> list[str | int]:
    """A dotted field as the keys of its node: `patterns.gemm.inputs[1]` -> ['patterns', 'gemm', 'inputs', 1]."""
    keys: list[str | int] = []
    for part in field.split("."):
        name, *indices = part.split("[")
        if name:
            keys.append(name)
        keys += [int(i.rstrip("]")) for i in indices if i.rstrip("]").isdigit()]
    return keys


def field_name(keys: Sequence[str | int]) -> str:
    """The dotted field of a node's keys, list entries by index: ['predict', 'scenarios', 0] ->
    `predict.scenarios[0]` (field_keys' inverse)."""
    name = ""
    for key in keys:
        name += f"[{key}]" if isinstance(key, int) else (f".{key}" if name else str(key))
    return name


def field_error(message: str, path: str | Path, field: str) -> OpperfError:
    """An error about a dotted field of a YAML file, at the line YAML gives for it (or its nearest parent)."""
    return OpperfError(message, path=path, row=line_of(path, field_keys(field)), field=field)


def has_node(data: Any, keys: Sequence[str | int]) -> bool:
    """Whether loaded YAML/JSON data has a node at exactly `keys`."""
    for key in keys:
        if isinstance(data, Mapping) and key in data:
            data = data[key]
        elif isinstance(data, list) and isinstance(key, int) and 0 <= key < len(data):
            data = data[key]
        else:
            return False
    return True


def _load_quietly(path: str | Path) -> Any:
    try:
        return yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None


@lru_cache(maxsize=None)
def _schema(name: str) -> dict:
    return read_yaml_mapping(SCHEMAS_DIR / name, "schema")


def _validator(schema: dict, set_defaults: bool):
    from jsonschema import Draft202012Validator, validators

    if not set_defaults:
        return Draft202012Validator(schema)
    validate_properties = Draft202012Validator.VALIDATORS["properties"]

    def properties_with_defaults(validator, properties, instance, subschema):
        if isinstance(instance, dict):
            for name, property_schema in properties.items():
                if isinstance(property_schema, dict) and "default" in property_schema:
                    instance.setdefault(name, property_schema["default"])
        yield from validate_properties(validator, properties, instance, subschema)

    return validators.extend(Draft202012Validator, {"properties": properties_with_defaults})(schema)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS - 3] + "..."


_TYPE_WORDS = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "true or false",
               "array": "a list", "object": "a mapping", "null": "null"}


def _schema_problem(error) -> tuple[list[str | int], str]:
    """(path of the offending node, one-line reason) of a jsonschema ValidationError, in a user's words."""
    path = list(error.absolute_path)
    kind, expected, value = error.validator, error.validator_value, error.instance
    if kind == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        unknown = sorted(set(value) - set(allowed)) if isinstance(value, dict) else []
        if unknown:
            hint = f"; allowed: {', '.join(allowed)}" if allowed else ""
            return path + [unknown[0]], f"unknown key {unknown[0]!r}{hint}"
        bad_key = next((k for k in value if k not in allowed), None) if isinstance(value, dict) else None
        if bad_key is not None:
            return path + [bad_key], f"{error.message}"
    if kind == "required":
        missing = [name for name in expected if name not in value] if isinstance(value, dict) else expected
        return path + [missing[0]], "missing (required)"
    if kind == "type":
        types = [expected] if isinstance(expected, str) else list(expected)
        words = " or ".join(_TYPE_WORDS.get(t, t) for t in types)
        return path, f"must be {words}, got {_short(value)}"
    if kind == "enum":
        return path, f"must be one of {', '.join(map(str, expected))}; got {_short(value)}"
    if kind == "const":
        return path, f"must be {_short(expected)}, got {_short(value)}"
    if kind in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        sign = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}[kind]
        return path, f"must be {sign} {expected}, got {_short(value)}"
    if kind in ("minItems", "maxItems"):
        return path, f"must have {'at least' if kind == 'minItems' else 'at most'} {expected} item(s), got {len(value)}"
    if kind == "uniqueItems":
        return path, f"items must not repeat, got {_short(value)}"
    if kind == "minLength":
        return path, "must not be empty"
    if kind == "pattern":
        return path, f"{_short(value)} does not match {expected}"
    if kind in ("oneOf", "anyOf"):
        described = error.schema.get("description")
        forms = " fits none of the allowed forms" + (f" ({described})" if described else "")
        inner = _error_inside_the_form(error)
        if inner is None:
            return path, f"{_short(value)}{forms}"
        if inner.validator == "pattern":      # a regex says less than the field's description
            return list(inner.absolute_path), f"{_short(inner.instance)}{forms}"
        return _schema_problem(inner)
    return path, error.message.splitlines()[0]


def _error_inside_the_form(error):
    """Of a oneOf/anyOf error, the first, deepest error of the one alternative whose type the value has (a list
    for a list form): it names the entry that is wrong (`predict.scenarios[0]`), not the whole value. None where
    no alternative, or several, have the value's type."""
    by_alternative: dict = {}
    for inner in error.context or ():
        by_alternative.setdefault(inner.relative_schema_path[0], []).append(inner)
    fitting = [errors for errors in by_alternative.values()
               if not any(e.validator == "type" and not e.relative_path for e in errors)]
    if len(fitting) != 1:
        return None
    return max(fitting[0], key=lambda e: len(e.relative_path))


def schema_errors(data: Any, schema_name: str, *, set_defaults: bool = False) -> list[tuple[list, str]]:
    """Every schema violation of `data` as (path, reason), in document order (first one first)."""
    validator = _validator(_schema(schema_name), set_defaults)
    # Document order; at one node an unknown key before a missing one (a typo'd key is both, and the typo
    # is what to fix).
    errors = sorted(validator.iter_errors(data), key=lambda e: ([str(p) for p in e.absolute_path],
                                                                e.validator != "additionalProperties"))
    return [_schema_problem(error) for error in errors]


def check_schema(data: Any, schema_name: str, path: str | Path, *, set_defaults: bool = False,
                 files: Sequence[str | Path] | None = None, overrides: Mapping | None = None) -> None:
    """Validate `data` against config/`schema_name`; the first violation is an OpperfError (see located_error).

    `data` was read from `path`, or merged from `files` (lowest precedence first) and command-line
    `overrides`, as Snakemake merges config files and --config. `set_defaults` fills in the schema's
    defaults, as snakemake.utils.validate does.
    """
    problems = schema_errors(data, schema_name, set_defaults=set_defaults)
    if problems:
        keys, reason = problems[0]
        raise located_error(reason, keys, [path] if files is None else files, overrides)


def located_error(reason: str, keys: Sequence[str | int], files: Sequence[str | Path],
                  overrides: Mapping | None = None) -> OpperfError:
    """An error about the node at `keys`: naming `--config` if the command line set it, else the last of
    `files` that has it (or, for a missing key, its deepest existing parent) with that node's line."""
    field = field_name(keys) or None
    if overrides and has_node(overrides, keys):
        return OpperfError(reason, path="--config", field=field)
    loaded = [(f, _load_quietly(f)) for f in files]
    for depth in range(len(keys), 0, -1):
        for candidate, data in reversed(loaded):
            if has_node(data, keys[:depth]):
                return OpperfError(reason, path=candidate, row=line_of(candidate, keys[:depth]), field=field)
    return OpperfError(reason, path=files[-1] if files else None, field=field)
