"""Templates: the profiled rows whose stable metadata generated rows inherit, and how a candidate fits one.

A generated row copies OP State, Accelerator Core, dtypes, formats and Input Scalars from a profiled row
of its kernel type (its template) and takes only shapes from the pattern. A candidate fits a template:

- `tensors` mode (declarative patterns): the candidate's tensor slots go, in order, into the template's
  non-empty slots, and each must have the template slot's (logical) rank. The template's empty slots
  (optional inputs, scalars) stay empty, so Input Scalars and dtypes stay aligned slot by slot.
- `slots` mode (generators with a full slot layout, e.g. FIA): the candidate's layout is kept as is;
  only the slot counts must agree (trailing empty slots are trimmed or padded to the template's count).

Layout: a generated row also keeps the memory layout of its template's most-called profiled row (`Layout`): the
order of its dims in memory and how much wider than the tensor each dim's parent buffer is (a RoPE slice of a
fused QKV buffer, a transposed weight, an expanded KV head), carried over to the new shape. Without it a
grid row of a strided op would be timed on a dense tensor the workload never passes, and its bucket would
mix the two layouts.

Outputs: a template with no output slots (torch.profiler traces record none) gives generated rows none.
A template slot stored as FRACTAL_NZ turns the candidate's ND shape into its NZ storage shape; an ND shape
not aligned to the NZ blocks (16 rows, 32 bytes of columns) does not fit such a slot, since its padded
storage shape would read back as a different matrix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from opperf.contract import (ACCELERATOR_CORE, INPUT_DTYPES, INPUT_FORMATS, INPUT_SCALARS, INPUT_SHAPES,
                             INPUT_STRIDES, OP_STATE, OUTPUT_DTYPES, OUTPUT_FORMATS, OUTPUT_SHAPES,
                             PROFILING_SAMPLE_COUNT, dtype_bytes, is_known_dtype, parse_names, parse_shapes,
                             parse_strides, split_slots, strides_text)
from opperf.errors import OpperfError
from opperf.grid.candidate import Candidate
from opperf.grid.config import MATCH_SLOTS

# Columns a generated row inherits from its template ("stable metadata").
INHERITED_COLUMNS = (OP_STATE, ACCELERATOR_CORE, INPUT_DTYPES, INPUT_FORMATS, OUTPUT_DTYPES, OUTPUT_FORMATS,
                     INPUT_SCALARS)
FRACTAL_NZ = "FRACTAL_NZ"
NZ_BLOCK_ROWS = 16
NZ_BLOCK_BYTES = 32

Shape = tuple[int, ...]


def nd_to_fractal_nz(shape: Shape, dtype: str) -> Shape:
    """ND (..., rows, cols) → FRACTAL_NZ storage (..., ceil(cols/c0), ceil(rows/16), 16, c0), c0 = 32 bytes of dtype.

    The inverse of `contract.fractal_nz_to_nd` for aligned shapes (storage (a,b,c,d) is ND (b*c, a*d)).
    """
    *batch, rows, cols = shape
    element_bytes = dtype_bytes(dtype) if is_known_dtype(dtype) else 2
    c0 = max(1, int(NZ_BLOCK_BYTES // element_bytes))
    return (*batch, -(-cols // c0), -(-rows // NZ_BLOCK_ROWS), NZ_BLOCK_ROWS, c0)


@dataclass(frozen=True)
class Slot:
    """One slot of a template: its storage rank (0 = empty), format and dtype."""

    rank: int
    fmt: str
    dtype: str

    @property
    def is_nz(self) -> bool:
        return self.fmt.upper() == FRACTAL_NZ and self.rank >= 4

    @property
    def logical_rank(self) -> int:
        return self.rank - 2 if self.is_nz else self.rank


@dataclass(frozen=True)
class Layout:
    """A strided tensor's layout, independent of its sizes: dims outermost first, and per dim how many
    elements its parent buffer has beyond the tensor (0: dense along it); stride-0 (expanded) dims stay 0."""

    order: tuple[int, ...]
    excess: tuple[int, ...]
    broadcast: tuple[bool, ...]
    innermost_stride: int = 1

    @classmethod
    def of(cls, shape: Shape, strides: Sequence[int]) -> Layout | None:
        """The layout of a recorded (shape, strides), None when it has none to carry (dense, or unreadable)."""
        if len(shape) != len(strides) or not shape:
            return None
        broadcast = tuple(stride == 0 and size > 1 for size, stride in zip(shape, strides))
        chain = [d for d in range(len(shape)) if not broadcast[d]]
        # Outermost first: larger stride first; among equal strides (size-1 dims) the later dim is outer,
        # as a size-1 dim sits where its sweep would put it in a permuted parent.
        chain.sort(key=lambda d: (-strides[d], -d))
        excess = [0] * len(shape)
        for outer, inner in zip(chain, chain[1:]):
            if strides[inner] <= 0 or strides[outer] % strides[inner]:
                return None
            excess[inner] = max(strides[outer] // strides[inner] - shape[inner], 0)
        layout = cls(tuple(chain), tuple(excess), broadcast, strides[chain[-1]] if chain else 1)
        return None if layout.strides(shape) == tuple(contiguous(shape)) else layout

    def strides(self, shape: Shape) -> tuple[int, ...]:
        """Strides of a tensor of `shape` laid out the same way."""
        strides = [0] * len(shape)
        step = self.innermost_stride
        for dim in reversed(self.order):
            strides[dim] = step
            step *= max(shape[dim] + self.excess[dim], 1)
        return tuple(strides)


def contiguous(shape: Shape) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return list(reversed(strides))


@dataclass(frozen=True)
class Template:
    """The stable metadata of a group of profiled rows with one slot structure, and the layout of the input
    slots of the group's most-called row (not part of what makes two templates the same)."""

    metadata: tuple[tuple[str, str], ...]
    inputs: tuple[Slot, ...]
    outputs: tuple[Slot, ...]
    layouts: tuple[Layout | None, ...] = field(default=(), compare=False)

    def input_strides(self, inputs: Sequence[Shape | None]) -> str:
        """The Input Strides field of a generated row with these input slot shapes ('' when all dense)."""
        strides = [layout.strides(shape) if layout is not None and shape is not None
                   and len(shape) == len(layout.order) else None
                   for shape, layout in zip(inputs, self.layouts)]
        return strides_text(inputs, strides)

    def fit(self, candidate: Candidate, match: str) -> tuple[tuple, tuple] | None:
        """The candidate's (input slots, output slots) laid out on this template, or None if it does not fit."""
        inputs = self._fit_side(candidate.inputs, self.inputs, match)
        if inputs is None:
            return None
        if not self.outputs:
            return inputs, ()
        outputs = self._fit_side(candidate.outputs, self.outputs, match)
        return None if outputs is None else (inputs, outputs)

    @staticmethod
    def _fit_side(shapes: Sequence[Shape | None], slots: tuple[Slot, ...], match: str) -> tuple | None:
        if match == MATCH_SLOTS:
            shapes = list(shapes)
            while len(shapes) > len(slots) and shapes[-1] is None:
                shapes.pop()
            if len(shapes) > len(slots):
                return None
            shapes += [None] * (len(slots) - len(shapes))
            laid_out = tuple(_stored(shape, slot) for shape, slot in zip(shapes, slots))
            return None if _UNALIGNED in laid_out else laid_out
        tensors = [shape for shape in shapes if shape is not None]
        positions = [index for index, slot in enumerate(slots) if slot.rank]
        if len(tensors) != len(positions):
            return None
        laid_out: list[Shape | None] = [None] * len(slots)
        for shape, index in zip(tensors, positions):
            if len(shape) != slots[index].logical_rank:
                return None
            laid_out[index] = _stored(shape, slots[index])
        return None if _UNALIGNED in laid_out else tuple(laid_out)


_UNALIGNED = ("unaligned",)


def _stored(shape: Shape | None, slot: Slot):
    """The shape as the slot stores it; _UNALIGNED for an ND shape that FRACTAL_NZ could only store padded
    (its storage shape would read back as the padded matrix, not the kernel's)."""
    if shape is not None and slot.is_nz and len(shape) == slot.logical_rank and len(shape) >= 2:
        storage = nd_to_fractal_nz(shape, slot.dtype)
        *_, rows, cols = shape
        if rows % NZ_BLOCK_ROWS or cols % storage[-1]:
            return _UNALIGNED
        return storage
    return shape


def _slots(shapes, formats: list[str], dtypes: list[str]) -> tuple[Slot, ...]:
    def at(names, index):
        return names[index] if index < len(names) else ""
    return tuple(Slot(len(shape) if shape else 0, at(formats, i), at(dtypes, i)) for i, shape in enumerate(shapes))


def templates_from_rows(rows: Sequence[Mapping[str, str]], *, path=None, first_line: int = 2
                        ) -> tuple[list[Template], int]:
    """Distinct templates of a kernel type's profiled rows (first-seen order), and how many rows could not be one.

    A row whose shapes cannot be parsed (N/A, malformed) cannot be a template; it is counted, not fatal:
    the row itself is carried through unchanged.
    """
    templates: dict[Template, tuple[float, tuple]] = {}
    unusable = 0
    for offset, row in enumerate(rows):
        try:
            inputs = parse_shapes(row.get(INPUT_SHAPES, ""), path=path, row=first_line + offset, field=INPUT_SHAPES)
            outputs = parse_shapes(row.get(OUTPUT_SHAPES, ""), path=path, row=first_line + offset,
                                   field=OUTPUT_SHAPES)
        except OpperfError:
            unusable += 1
            continue
        metadata = tuple((column, row[column]) for column in INHERITED_COLUMNS if column in row)
        template = Template(metadata,
                            _slots(inputs, parse_names(row.get(INPUT_FORMATS, "")),
                                   parse_names(row.get(INPUT_DTYPES, ""))),
                            _slots(outputs, parse_names(row.get(OUTPUT_FORMATS, "")),
                                   parse_names(row.get(OUTPUT_DTYPES, ""))))
        strides = row.get(INPUT_STRIDES, "")
        rank = (_shows_layout(inputs, strides), _calls(row))
        if template not in templates or rank > templates[template][0]:
            templates[template] = (rank, _layouts(inputs, strides))
    return [Template(t.metadata, t.inputs, t.outputs, layouts) for t, (_, layouts) in templates.items()], unusable


def _shows_layout(inputs: Sequence[Shape | None], strides_field: str) -> bool:
    """Whether a row's recorded strides say how its tensors lie in memory: they do when a slot is recorded
    strided, or when every tensor has two dims longer than 1. A decode row (1, 1, 25600) of a slice of a
    (1, 1, 51200) buffer reads as dense (torch ignores the strides of size-1 dims), so the template's layout
    comes from its most-called row that shows one, else from its most-called row."""
    if strides_field.strip(" ;"):
        return True
    return all(shape is None or sum(1 for d in shape if d > 1) >= 2 for shape in inputs if shape)


def _calls(row: Mapping[str, str]) -> float:
    try:
        return float(row.get(PROFILING_SAMPLE_COUNT, "") or 0)
    except ValueError:
        return 0.0


def _layouts(inputs: Sequence[Shape | None], strides_field: str) -> tuple[Layout | None, ...]:
    """Each input slot's layout from the row's Input Strides (None where dense or not recorded)."""
    slots = split_slots(strides_field) if strides_field else []
    found = []
    for index, shape in enumerate(inputs):
        try:
            strides = parse_strides(slots[index]) if index < len(slots) else None
        except OpperfError:
            strides = None
        found.append(Layout.of(tuple(shape), strides) if shape and strides else None)
    return tuple(found)
