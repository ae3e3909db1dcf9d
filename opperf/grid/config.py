"""Loading and validating `config/grid.yaml`: value grids, patterns, the kernel-type router and the density
standard the axis grids follow (`config/density_standard.yaml`).

Every problem is an OpperfError naming the file and the field (`patterns.gemm.inputs[1]`), raised when
the config is loaded, before any row is generated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from opperf.density import DEFAULT_STANDARD, DensityStandard, load_standard
from opperf.errors import OpperfError
from opperf.yaml_files import field_error, read_yaml_mapping
from opperf.grid.evaluator import (Expression, ExpressionError, ShapeExpression, compile_expression,
                                   compile_shape)
from opperf.grid.generators import GENERATORS

DEFAULT_GRID_CONFIG = Path(__file__).resolve().parents[2] / "config" / "grid.yaml"
MATCH_TENSORS = "tensors"    # candidate tensors go into the template's tensor slots; ranks must agree
MATCH_SLOTS = "slots"        # candidate gives the full slot layout; only slot counts must agree
MATCH_MODES = (MATCH_TENSORS, MATCH_SLOTS)
# Names every pattern can read besides its own iterators and constants.
BUILTIN_NAMES = ("max_tokens",)
IGNORED = "_"                # an iterator name that binds nothing (a tuple member a sweep replaces)
_PATTERN_KEYS = {"iterators", "sweeps", "constants", "constraints", "inputs", "outputs", "columns", "match",
                 "generator", "params", "description", "require_template"}
# Token counts without a cap of their own: the largest range of a token axis in the standard (ATTN_SEQ_GRID).
DEFAULT_MAX_TOKENS = 131072
# Largest cartesian product one pattern may enumerate (a guard against a typo exploding the grid).
MAX_COMBINATIONS = 2_000_000


@dataclass(frozen=True)
class IteratorSpec:
    """One iterator: the name(s) it binds and where its values come from (a source name or inline values)."""

    names: tuple[str, ...]
    source: str | None
    inline: tuple | None


@dataclass(frozen=True)
class Pattern:
    """A declarative pattern (iterators → shapes) or a function generator with its params."""

    name: str
    match: str = MATCH_TENSORS
    iterators: tuple[IteratorSpec, ...] = ()
    # Further iterator sets over the same shapes (name → iterators binding the same names): one density
    # axis varied around a model's values, the others held (see docs/grid.md, "Density").
    sweeps: tuple[tuple[str, tuple[IteratorSpec, ...]], ...] = ()
    constants: dict[str, int] = field(default_factory=dict)
    constraints: tuple[Expression, ...] = ()
    inputs: tuple[ShapeExpression, ...] = ()
    outputs: tuple[ShapeExpression, ...] = ()
    columns: tuple[tuple[str, Expression], ...] = ()
    generator: str | None = None
    params: dict = field(default_factory=dict)
    # Column → regular expression a profiled row's value must match in full to serve as this pattern's
    # template (e.g. Input Scalars ";;-1": a cat along the last dim), where a scalar argument decides
    # what the shapes mean.
    require_template: tuple[tuple[str, re.Pattern], ...] = ()

    def accepts(self, metadata: dict[str, str]) -> bool:
        return all(column in metadata and regex.fullmatch(metadata[column])
                   for column, regex in self.require_template)

    @property
    def iterator_sets(self) -> tuple[tuple[str, tuple[IteratorSpec, ...]], ...]:
        """The main iterators (named "") then each sweep."""
        return (("", self.iterators),) + self.sweeps


@dataclass(frozen=True)
class MemorySettings:
    """Workspace margin of the memory estimator: bytes = tensors * (1 + fraction) + fixed MiB."""

    workspace_fraction: float = 0.1
    workspace_mib: float = 64.0


@dataclass(frozen=True)
class GridConfig:
    path: str
    dense_tokens_up_to: int
    tile_boundaries: dict[str, bool]        # back end (or "default") → whether token axes get tile boundaries
    sweep_at: int                           # the token count sweeps hold (capped at max_tokens)
    max_tokens: dict[str, int]              # back end (or "default") → token cap
    token_axes: tuple[str, ...]             # density axes that count tokens: capped, with tile boundaries
    standard: DensityStandard
    memory: MemorySettings
    grids: dict[str, list]
    generic: dict[str, list]
    patterns: dict[str, Pattern]
    router: dict[str, tuple[str, ...]]
    axis_caps: dict[str, dict[str, int]] = field(default_factory=dict)   # back end → standard axis → largest value

    def max_tokens_for(self, backend: str) -> int:
        return self.max_tokens.get(backend, self.max_tokens["default"])

    def tile_boundaries_for(self, backend: str) -> bool:
        return self.tile_boundaries.get(backend, self.tile_boundaries.get("default", True))

    def axis_caps_for(self, backend: str) -> dict[str, int]:
        """The largest value of each capped axis on a back end (a declared sub-range of the standard)."""
        return dict(self.axis_caps.get(backend, self.axis_caps.get("default", {})))

    def patterns_for(self, kernel_type: str) -> list[Pattern]:
        return [self.patterns[name] for name in self.router.get(kernel_type, ())]


def _fail(path, where: str, message: str):
    raise field_error(message, path, where)


def _positive_int(value, path, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        _fail(path, where, f"expected a positive integer, got {value!r}")
    return value


def _value_list(values, path, where: str) -> list:
    """A grid: a non-empty list of positive integers or of equal-length lists of them (tuples)."""
    if not isinstance(values, list) or not values:
        _fail(path, where, f"expected a non-empty list, got {values!r}")
    out = []
    for index, value in enumerate(values):
        if isinstance(value, list):
            out.append(tuple(_positive_int(v, path, f"{where}[{index}]") for v in value))
        else:
            out.append(_positive_int(value, path, f"{where}[{index}]"))
    return out


def _compile(function, text, path, where: str):
    try:
        return function(text)
    except ExpressionError as exc:
        _fail(path, where, str(exc))


def _iterator(key, value, path, where: str, known_sources: set[str], axes: set[str]) -> IteratorSpec:
    names = tuple(n.strip() for n in str(key).split(","))
    if not all(n.isidentifier() for n in names):
        _fail(path, where, f"iterator name {key!r} must be a name or comma-separated names")
    if isinstance(value, str):
        if value not in known_sources and value not in axes and not value.startswith("model."):
            _fail(path, where, f"unknown value grid {value!r} (known: {', '.join(sorted(known_sources))}, "
                               f"the density axes {', '.join(sorted(axes))}, model.<name>)")
        if value in axes and len(names) > 1:
            _fail(path, where, f"density axis {value!r} gives one value per combination; bind it to one name")
        return IteratorSpec(names, value, None)
    inline = tuple(_value_list(value, path, where))
    if len(names) > 1 and any(not isinstance(v, tuple) or len(v) != len(names) for v in inline):
        _fail(path, where, f"iterator {key!r} binds {len(names)} names: every value must be a list of "
                           f"{len(names)} integers")
    return IteratorSpec(names, None, inline)


def _pattern(name: str, raw, path, known_sources: set[str], axes: set[str]) -> Pattern:
    """One pattern, validated; every error message starts with the pattern's name (added here, once)."""
    try:
        return _pattern_body(name, raw, path, known_sources, axes)
    except OpperfError as exc:
        if exc.reason.startswith(f"pattern {name!r}"):
            raise
        raise OpperfError(f"pattern {name!r}: {exc.reason}", path=exc.path, row=exc.row, field=exc.field) from None


def _iterator_set(raw, path, where: str, known_sources: set[str], axes: set[str]) -> tuple[IteratorSpec, ...]:
    if not isinstance(raw, dict) or not raw:
        _fail(path, where, "iterators must be a non-empty mapping")
    return tuple(_iterator(k, v, path, f"{where}.{k}", known_sources, axes) for k, v in raw.items())


def _pattern_body(name: str, raw, path, known_sources: set[str], axes: set[str]) -> Pattern:
    where = f"patterns.{name}"
    if not isinstance(raw, dict):
        _fail(path, where, f"pattern {name!r} must be a mapping")
    unknown = sorted(set(raw) - _PATTERN_KEYS)
    if unknown:
        _fail(path, f"{where}.{unknown[0]}",
              f"unknown key {unknown[0]!r} (allowed: {', '.join(sorted(_PATTERN_KEYS))})")
    match = raw.get("match", MATCH_SLOTS if "generator" in raw else MATCH_TENSORS)
    if match not in MATCH_MODES:
        _fail(path, f"{where}.match", f"match must be one of {MATCH_MODES}, got {match!r}")
    required = raw.get("require_template", {}) or {}
    if not isinstance(required, dict) or not all(isinstance(v, str) for v in required.values()):
        _fail(path, f"{where}.require_template", "require_template must map column → regular expression")
    require_template = []
    for column, expression in required.items():
        try:
            require_template.append((str(column), re.compile(expression)))
        except re.error as exc:
            _fail(path, f"{where}.require_template.{column}", f"bad regular expression: {exc}")
    require_template = tuple(require_template)
    if "generator" in raw:
        extra = sorted(set(raw) & {"iterators", "sweeps", "constants", "constraints", "inputs", "outputs",
                                   "columns"})
        if extra:
            _fail(path, f"{where}.{extra[0]}", f"a generator pattern takes params, not {extra[0]}")
        generator = raw["generator"]
        if generator not in GENERATORS:
            _fail(path, f"{where}.generator",
                  f"unknown generator {generator!r} (known: {', '.join(sorted(GENERATORS))})")
        params = raw.get("params", {}) or {}
        if not isinstance(params, dict):
            _fail(path, f"{where}.params", "params must be a mapping")
        GENERATORS[generator].check_params(params, path=path, where=f"{where}.params",
                                           sources=known_sources | axes)
        return Pattern(name=name, match=match, generator=generator, params=params,
                       require_template=require_template)

    for required in ("iterators", "inputs", "outputs"):
        if required not in raw:
            _fail(path, f"{where}.{required}", f"pattern {name!r} needs {required!r} (or a generator)")
    iterators = _iterator_set(raw["iterators"], path, f"{where}.iterators", known_sources, axes)
    sweeps_raw = raw.get("sweeps", {}) or {}
    if not isinstance(sweeps_raw, dict):
        _fail(path, f"{where}.sweeps", "sweeps must map a sweep name → iterators")
    main_names = sorted(n for it in iterators for n in it.names if n != IGNORED)
    sweeps = []
    for sweep_name, sweep_raw in sweeps_raw.items():
        sweep_where = f"{where}.sweeps.{sweep_name}"
        sweep = _iterator_set(sweep_raw, path, sweep_where, known_sources, axes)
        if sorted(n for it in sweep for n in it.names if n != IGNORED) != main_names:
            _fail(path, sweep_where, f"a sweep binds the names of the main iterators ({', '.join(main_names)})")
        sweeps.append((str(sweep_name), sweep))
    constants_raw = raw.get("constants", {}) or {}
    if not isinstance(constants_raw, dict):
        _fail(path, f"{where}.constants", "constants must be a mapping")
    constants = {}
    for key, value in constants_raw.items():
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(path, f"{where}.constants.{key}", f"constant {key!r} must be an integer")
        constants[str(key)] = value
    bound = [n for it in iterators for n in it.names if n != IGNORED] + list(constants)
    duplicates = sorted({n for n in bound if bound.count(n) > 1})
    if duplicates:
        _fail(path, f"{where}.iterators", f"name {duplicates[0]!r} is bound twice")
    known_names = set(bound) | set(BUILTIN_NAMES)

    def checked(expression, field_where: str):
        unknown_names = sorted(expression.names - known_names)
        if unknown_names:
            _fail(path, field_where, f"unknown name {unknown_names[0]!r} in {expression.text!r} "
                  f"(bound: {', '.join(sorted(known_names))})")
        return expression

    constraints_raw = raw.get("constraints", []) or []
    if not isinstance(constraints_raw, list):
        _fail(path, f"{where}.constraints", "constraints must be a list of expressions")
    constraints = tuple(checked(_compile(compile_expression, c, path, f"{where}.constraints[{i}]"),
                                f"{where}.constraints[{i}]") for i, c in enumerate(constraints_raw))
    shapes = {}
    for side in ("inputs", "outputs"):
        slots = raw[side]
        if not isinstance(slots, list):
            _fail(path, f"{where}.{side}", f"{side} must be a list of shape expressions")
        compiled = []
        for index, slot in enumerate(slots):
            slot_where = f"{where}.{side}[{index}]"
            shape = _compile(compile_shape, slot, path, slot_where)
            for dim in shape.dims or ():
                checked(dim, slot_where)
            compiled.append(shape)
        shapes[side] = tuple(compiled)
    if not any(s.dims for s in shapes["inputs"]):
        _fail(path, f"{where}.inputs", "inputs need at least one tensor slot")
    columns_raw = raw.get("columns", {}) or {}
    if not isinstance(columns_raw, dict):
        _fail(path, f"{where}.columns", "columns must map column name → expression")
    columns = tuple((str(column), checked(_compile(compile_expression, text, path, f"{where}.columns.{column}"),
                                          f"{where}.columns.{column}"))
                    for column, text in columns_raw.items())
    return Pattern(name=name, match=match, iterators=iterators, sweeps=tuple(sweeps), constants=constants,
                   constraints=constraints,
                   inputs=shapes["inputs"], outputs=shapes["outputs"], columns=columns,
                   require_template=require_template)


def load_grid_config(path: str | Path = DEFAULT_GRID_CONFIG) -> GridConfig:
    """Read and validate grid.yaml; a malformed pattern is an error naming the pattern and field."""
    path = Path(path)
    raw = read_yaml_mapping(path, "grid config")
    for required in ("patterns", "router"):
        if not isinstance(raw.get(required), dict):
            _fail(path, required, f"missing or not a mapping: {required!r}")

    tokens = raw.get("token_counts", {}) or {}
    dense = _positive_int(tokens.get("dense_up_to", 16), path, "token_counts.dense_up_to")
    sweep_at = _positive_int(tokens.get("sweep_at", 256), path, "token_counts.sweep_at")
    tiles = tokens.get("tile_boundaries", {"default": True})
    if not isinstance(tiles, dict) or not all(isinstance(v, bool) for v in tiles.values()):
        _fail(path, "token_counts.tile_boundaries", f"expected a mapping of back end → true/false, got {tiles!r}")
    max_tokens_raw = tokens.get("max_tokens", {"default": DEFAULT_MAX_TOKENS})
    if not isinstance(max_tokens_raw, dict) or "default" not in max_tokens_raw:
        _fail(path, "token_counts.max_tokens", "expected a mapping of back end → token cap with a 'default'")
    max_tokens = {str(k): _positive_int(v, path, f"token_counts.max_tokens.{k}") for k, v in max_tokens_raw.items()}

    memory_raw = raw.get("memory", {}) or {}
    fraction = memory_raw.get("workspace_fraction", 0.1)
    mib = memory_raw.get("workspace_mib", 64)
    for key, value in (("workspace_fraction", fraction), ("workspace_mib", mib)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            _fail(path, f"memory.{key}", f"expected a number >= 0, got {value!r}")

    standard_path = raw.get("standard")
    if standard_path is not None and not isinstance(standard_path, str):
        _fail(path, "standard", "expected the path of a density standard (relative to this file)")
    standard = load_standard(path.parent / standard_path if standard_path else DEFAULT_STANDARD)
    axes = set(standard.rules)
    token_axes = tokens.get("axes", [])
    if not isinstance(token_axes, list) or any(a not in axes for a in token_axes):
        _fail(path, "token_counts.axes", f"expected a list of density axes (known: {', '.join(sorted(axes))}), "
                                         f"got {token_axes!r}")

    axis_caps = {}
    for backend, caps in (raw.get("axis_caps") or {}).items():
        where = f"axis_caps.{backend}"
        if not isinstance(caps, dict):
            _fail(path, where, "expected a mapping of density axis → largest value")
        for axis, cap in caps.items():
            if axis not in axes or standard.rule(axis).name != axis:
                _fail(path, f"{where}.{axis}", f"not a grid of the standard (known: "
                                               f"{', '.join(sorted({r.name for r in standard.rules.values()}))})")
            _positive_int(cap, path, f"{where}.{axis}")
        axis_caps[str(backend)] = {str(a): int(c) for a, c in caps.items()}

    grids = {str(k): _value_list(v, path, f"grids.{k}") for k, v in (raw.get("grids") or {}).items()}
    generic = {str(k): _value_list(v, path, f"generic.{k}") for k, v in (raw.get("generic") or {}).items()}
    known_sources = set(grids) | {"tokens", "sweep_tokens"}
    patterns = {str(name): _pattern(str(name), body, path, known_sources, axes)
                for name, body in raw["patterns"].items()}

    router: dict[str, tuple[str, ...]] = {}
    for kernel_type, target in raw["router"].items():
        names = target if isinstance(target, list) else [target]
        for name in names:
            if name not in patterns:
                _fail(path, f"router.{kernel_type}", f"kernel type {kernel_type!r} routes to unknown pattern "
                                                     f"{name!r} (known: {', '.join(sorted(patterns))})")
        router[str(kernel_type)] = tuple(names)
    return GridConfig(path=str(path), dense_tokens_up_to=dense, tile_boundaries={str(k): v for k, v in tiles.items()},
                      sweep_at=sweep_at, max_tokens=max_tokens, token_axes=tuple(token_axes),
                      standard=standard, axis_caps=axis_caps,
                      memory=MemorySettings(float(fraction), float(mib)), grids=grids, generic=generic,
                      patterns=patterns, router=router)

