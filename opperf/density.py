"""The density standard of a profiling database: the fewest values each shape axis must hold.

The consumer interpolates a kernel's latency between measured neighbours along one axis at a time (other
axes fixed), so a database is only as good as its spacing: msmodeling's standard V1, copied as data into
`config/density_standard.yaml`, states per axis a range, segments with the largest gap or ratio allowed
between neighbouring values, and required values that must be measured exactly. This module reads it,
builds the smallest point set that meets a rule over a range (the grid stage's axis values) and checks a
point set against a rule (the grid's tests, `opperf.grid.density` for a database).

A pair of neighbouring values (a, b) must satisfy every segment that (a, b] reaches into: the strictest
reading, so a jump across a segment boundary is held to the tighter side.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from opperf.errors import OpperfError
from opperf.yaml_files import read_yaml_mapping

DEFAULT_STANDARD = Path(__file__).resolve().parents[1] / "config" / "density_standard.yaml"
MESSAGE_BYTES = "message_bytes"


@dataclass(frozen=True)
class Segment:
    """A sub-range [low, high] with the largest step allowed between neighbouring values inside it."""

    low: int
    high: int
    max_gap: float | None = None
    max_ratio: float | None = None

    def allows(self, smaller: int, larger: int) -> bool:
        if self.max_gap is not None:
            return larger - smaller <= self.max_gap
        return larger <= smaller * self.max_ratio

    def describe(self) -> str:
        step = f"gap <= {self.max_gap:g}" if self.max_gap is not None else f"ratio <= {self.max_ratio:g}"
        return f"{self.low}..{self.high} {step}"


@dataclass(frozen=True)
class AxisCheck:
    """One point set against one rule: what is missing or too far apart inside the window checked."""

    axis: str
    low: int | None                       # window checked (None: the set was empty)
    high: int | None
    values: tuple[int, ...]
    missing_required: tuple[int, ...] = ()
    missing_endpoints: tuple[int, ...] = ()
    too_far_apart: tuple[tuple[int, int, str], ...] = ()     # (a, b, the segment rule it breaks)

    @property
    def ok(self) -> bool:
        return not (self.missing_required or self.missing_endpoints or self.too_far_apart)

    def describe(self) -> str:
        if self.low is None:
            return f"{self.axis}: no values"
        parts = [f"{self.axis} {self.low}..{self.high}: {len(self.values)} values"]
        if self.missing_endpoints:
            parts.append(f"range ends missing {list(self.missing_endpoints)}")
        if self.missing_required:
            parts.append(f"required values missing {list(self.missing_required)}")
        if self.too_far_apart:
            gaps = ", ".join(f"{a}->{b} ({rule})" for a, b, rule in self.too_far_apart[:5])
            more = f" and {len(self.too_far_apart) - 5} more" if len(self.too_far_apart) > 5 else ""
            parts.append(f"neighbours too far apart {gaps}{more}")
        return "; ".join(parts) if not self.ok else parts[0] + ": meets the standard"


@dataclass(frozen=True)
class AxisRule:
    """One axis of the standard: its range (None for required values only), segments and required values."""

    name: str
    low: int | None
    high: int | None
    segments: tuple[Segment, ...] = ()
    required: tuple[int, ...] = ()

    def window(self, low: int | None = None, high: int | None = None) -> tuple[int, int]:
        """The rule's range clipped to [low, high]; a rule of required values only spans them."""
        own_low = self.low if self.low is not None else min(self.required)
        own_high = self.high if self.high is not None else max(self.required)
        return max(own_low, low if low is not None else own_low), min(own_high, high if high is not None else own_high)

    def allows(self, smaller: int, larger: int) -> bool:
        """Whether neighbours smaller < larger satisfy every segment (smaller, larger] reaches into."""
        return self.broken_by(smaller, larger) is None

    def broken_by(self, smaller: int, larger: int) -> Segment | None:
        for segment in self.segments:
            if segment.high > smaller and segment.low <= larger and not segment.allows(smaller, larger):
                return segment
        return None

    def points(self, low: int | None = None, high: int | None = None) -> list[int]:
        """The smallest point set meeting the rule over its range clipped to [low, high]: both ends, every
        required value inside, and greedy steps as long as each segment allows in between."""
        start, stop = self.window(low, high)
        if start > stop:
            return []
        anchors = sorted({v for v in self.required if start <= v <= stop} | {start, stop})
        if not self.segments:
            return anchors
        points = [start]
        while points[-1] < stop:
            current = points[-1]
            limit = anchors[bisect.bisect_right(anchors, current)]
            # Largest reachable value up to the next anchor (allowed steps shrink as the step grows).
            lo, hi = current + 1, limit
            while lo < hi:
                middle = (lo + hi + 1) // 2
                if self.allows(current, middle):
                    lo = middle
                else:
                    hi = middle - 1
            points.append(lo)
        return points

    def check(self, values: Iterable[int], *, low: int | None = None, high: int | None = None,
              excused: Iterable[int] = ()) -> AxisCheck:
        """Check a point set over a window (default: its own smallest to largest value, clipped to the rule's
        range). `excused` values are ones the kernel cannot take there (a constraint, the memory budget): a
        required value among them is not counted missing."""
        present = sorted({int(v) for v in values})
        if not present:
            return AxisCheck(self.name, None, None, ())
        start, stop = self.window(low if low is not None else present[0], high if high is not None else present[-1])
        inside = [v for v in present if start <= v <= stop]
        excused_set = {int(v) for v in excused}
        missing_endpoints = tuple(v for v in sorted({start, stop}) if v not in inside and v not in excused_set)
        missing = tuple(v for v in self.required if start <= v <= stop and v not in inside and v not in excused_set)
        broken = []
        for smaller, larger in zip(inside, inside[1:]):
            segment = self.broken_by(smaller, larger)
            if segment is not None:
                broken.append((smaller, larger, segment.describe()))
        return AxisCheck(self.name, start, stop, tuple(present), missing, missing_endpoints, tuple(broken))


@dataclass(frozen=True)
class DensityStandard:
    """The standard's axes by name (aliases and `template.axis` names included) and where it came from."""

    path: str
    version: str
    source: Mapping[str, str]
    rules: Mapping[str, AxisRule] = field(default_factory=dict)

    def rule(self, name: str) -> AxisRule:
        if name not in self.rules:
            raise OpperfError(f"unknown density axis {name!r} (known: {', '.join(sorted(self.rules))})",
                              path=self.path)
        return self.rules[name]

    def __contains__(self, name: object) -> bool:
        return name in self.rules

    @property
    def message_bytes(self) -> AxisRule:
        return self.rule(MESSAGE_BYTES)


def _integer(value, path, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise OpperfError(f"expected an integer >= {minimum}, got {value!r}", path=path, field=where)
    return value


def _step(raw: Mapping, path, where: str, low: int, high: int) -> Segment:
    steps = [key for key in ("max_gap", "max_ratio") if key in raw]
    if len(steps) != 1:
        raise OpperfError("a segment needs exactly one of max_gap, max_ratio", path=path, field=where)
    value = raw[steps[0]]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= (1 if steps[0] == "max_ratio" else 0):
        raise OpperfError(f"{steps[0]} must be a number > {1 if steps[0] == 'max_ratio' else 0}, got {value!r}",
                          path=path, field=f"{where}.{steps[0]}")
    return Segment(low, high, **{steps[0]: float(value)})


def _rule(name: str, raw, path, where: str) -> AxisRule:
    if not isinstance(raw, dict):
        raise OpperfError("an axis rule must be a mapping", path=path, field=where)
    unknown = sorted(set(raw) - {"range", "segments", "max_ratio", "max_gap", "required_values"})
    if unknown:
        raise OpperfError(f"unknown key {unknown[0]!r}", path=path, field=f"{where}.{unknown[0]}")
    required = tuple(sorted({_integer(v, path, f"{where}.required_values") for v in raw.get("required_values", [])}))
    if "range" not in raw:
        if not required or "segments" in raw or "max_ratio" in raw or "max_gap" in raw:
            raise OpperfError("an axis without a range is required values only", path=path, field=where)
        return AxisRule(name, None, None, (), required)
    span = raw["range"]
    if not isinstance(span, dict):
        raise OpperfError("range must be {min: .., max: ..}", path=path, field=f"{where}.range")
    low = _integer(span.get("min"), path, f"{where}.range.min")
    high = _integer(span.get("max"), path, f"{where}.range.max")
    if low > high:
        raise OpperfError(f"range {low}..{high} is empty", path=path, field=f"{where}.range")
    if "segments" in raw:
        segments = []
        for index, segment in enumerate(raw["segments"] or []):
            at = f"{where}.segments[{index}]"
            if not isinstance(segment, dict):
                raise OpperfError("a segment must be a mapping", path=path, field=at)
            segments.append(_step(segment, path, at, _integer(segment.get("min"), path, f"{at}.min"),
                                  _integer(segment.get("max"), path, f"{at}.max")))
        expected = low
        for index, segment in enumerate(segments):
            if segment.low != expected or segment.high < segment.low:
                raise OpperfError(f"segments must tile the range {low}..{high} in order without gaps or overlaps; "
                                  f"this one is {segment.low}..{segment.high}, expected to start at {expected}",
                                  path=path, field=f"{where}.segments[{index}]")
            expected = segment.high + 1
        if expected != high + 1:
            raise OpperfError(f"segments end at {expected - 1}, the range at {high}", path=path,
                              field=f"{where}.segments")
    else:
        segments = [_step(raw, path, where, low, high)]
    outside = [v for v in required if not low <= v <= high]
    if outside:
        raise OpperfError(f"required value {outside[0]} lies outside the range {low}..{high}", path=path,
                          field=f"{where}.required_values")
    return AxisRule(name, low, high, tuple(segments), required)


def load_standard(path: str | Path = DEFAULT_STANDARD) -> DensityStandard:
    """Read and validate a density standard; a malformed axis is an error naming the file and field."""
    path = Path(path)
    raw = read_yaml_mapping(path, "density standard")
    grids = raw.get("grids")
    if not isinstance(grids, dict) or not grids:
        raise OpperfError("missing or empty 'grids'", path=path, field="grids")
    rules = {str(name): _rule(str(name), body, path, f"grids.{name}") for name, body in grids.items()}
    for alias, target in (raw.get("aliases") or {}).items():
        if target not in rules:
            raise OpperfError(f"alias of unknown grid {target!r}", path=path, field=f"aliases.{alias}")
        rules[str(alias)] = rules[target]
    for template, axes in (raw.get("template_axes") or {}).items():
        for axis, body in (axes or {}).items():
            where, name = f"template_axes.{template}.{axis}", f"{template}.{axis}"
            if isinstance(body, dict) and set(body) == {"use"}:
                if body["use"] not in rules:
                    raise OpperfError(f"uses unknown grid {body['use']!r}", path=path, field=f"{where}.use")
                rules[name] = rules[body["use"]]
            else:
                rules[name] = _rule(name, body, path, where)
    for axis, body in (raw.get("communication_axes") or {}).items():
        rules[str(axis)] = _rule(str(axis), body, path, f"communication_axes.{axis}")
    source = raw.get("source") or {}
    return DensityStandard(str(path), str(source.get("standard_version", "")),
                           {str(k): str(v) for k, v in source.items()}, rules)
