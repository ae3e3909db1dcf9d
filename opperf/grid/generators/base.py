"""What every function generator is: a name, declared params (validated when grid.yaml loads), a function."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from opperf.errors import OpperfError
from opperf.grid.candidate import Candidate
from opperf.grid.values import ValueGrids

INT = "int"
INT_LIST = "int_list"
SOURCE = "source"              # a value grid's name (a density axis, a key of grids:) or a list of integers


@dataclass(frozen=True)
class ParamSpec:
    kind: str                        # INT, INT_LIST, SOURCE, or a tuple of allowed strings
    default: object


@dataclass(frozen=True)
class Generator:
    """A named candidate generator with validated params."""

    name: str
    params: dict[str, ParamSpec]
    function: Callable[[dict, ValueGrids], Iterator[Candidate]]

    def check_params(self, params: dict, *, path=None, where: str = "params", sources: set[str] = frozenset()
                     ) -> None:
        unknown = sorted(set(params) - set(self.params))
        if unknown:
            raise OpperfError(f"generator {self.name!r}: unknown param {unknown[0]!r} "
                              f"(known: {', '.join(sorted(self.params))})", path=path, field=f"{where}.{unknown[0]}")
        for key, spec in self.params.items():
            if key not in params:
                continue
            value = params[key]
            if spec.kind == INT:
                ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
            elif spec.kind in (INT_LIST, SOURCE):
                ok = (isinstance(value, list) and bool(value)
                      and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value))
                ok = ok or (spec.kind == SOURCE and value in sources)
            else:
                ok = value in spec.kind
            if not ok:
                expected = {INT: "a positive integer", INT_LIST: "a non-empty list of positive integers",
                            SOURCE: f"a non-empty list of positive integers or a value grid "
                                    f"({', '.join(sorted(sources))})"}.get(spec.kind, f"one of {spec.kind}")
                raise OpperfError(f"generator {self.name!r}: param {key!r} must be {expected}, got {value!r}",
                                  path=path, field=f"{where}.{key}")

    def with_defaults(self, params: dict) -> dict:
        return {key: params.get(key, spec.default) for key, spec in self.params.items()}

    def generate(self, params: dict, grids: ValueGrids) -> Iterator[Candidate]:
        return self.function(self.with_defaults(params), grids)


def source_values(value: str | list[int], grids: ValueGrids, where: str) -> list[int]:
    """A SOURCE param's values: its list, or the named grid's values for this run."""
    return list(value) if isinstance(value, list) else list(grids.values(value, field=where))
