"""Message sizes and data types of the collective benchmarks.

A bytes grid is a list of per-rank message sizes in bytes. Each item is an integer (`4096`), a size with
a binary unit (`4KiB`, `1MiB`, `1GiB`; `KB`/`MB` are read as the same binary units, as the peer's files
use them), or an inclusive power-of-two range `1KiB..1MiB`. With no items, the sizes of the density standard
(`config/density_standard.yaml`, message_bytes: 128 B to 512 MiB, each at most twice the one before).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from opperf.density import load_standard
from opperf.errors import OpperfError

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

_UNITS = {"": 1, "b": 1, "k": KIB, "kb": KIB, "kib": KIB, "m": MIB, "mb": MIB, "mib": MIB,
          "g": GIB, "gb": GIB, "gib": GIB}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([A-Za-z]*)\s*$")


@dataclass(frozen=True)
class CommDtype:
    """A data type the benchmarks move: torch name, the contract's CSV spelling, bytes per element, and
    the largest integer the type represents exactly (which bounds a checkable reduction)."""
    torch_name: str
    csv_name: str
    element_bytes: int
    largest_exact_integer: int


# The contract spells these as the peer's HCCL files do (DT_FP16, not DT_FLOAT16).
DTYPES: dict[str, CommDtype] = {
    "bfloat16": CommDtype("bfloat16", "DT_BF16", 2, 256),
    "float16": CommDtype("float16", "DT_FP16", 2, 2048),
    "float32": CommDtype("float32", "DT_FLOAT", 4, 1 << 24),
    "int8": CommDtype("int8", "DT_INT8", 1, 127),
}


def comm_dtype(name: str) -> CommDtype:
    """`bfloat16` or `torch.bfloat16` → its CommDtype; anything else is an error listing the choices."""
    key = name.strip().removeprefix("torch.")
    if key not in DTYPES:
        raise OpperfError(f"unsupported dtype {name!r} (choose from {', '.join(DTYPES)})", field="--dtype")
    return DTYPES[key]


def parse_size(text: str) -> int:
    """`4096` → 4096, `4KiB` → 4096, `1MiB` → 1048576."""
    match = _SIZE_RE.match(str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise OpperfError(f"bad message size {text!r} (examples: 4096, 4KiB, 1MiB, 1KiB..1MiB)",
                          field="--bytes-grid")
    value = int(match.group(1)) * _UNITS[unit]
    if value < 1:
        raise OpperfError(f"message size {text!r} must be at least 1 byte", field="--bytes-grid")
    return value


def powers_of_two(min_bytes: int, max_bytes: int) -> list[int]:
    """Every power of two from min_bytes to max_bytes inclusive (both must be powers of two)."""
    for value in (min_bytes, max_bytes):
        if value < 1 or value & (value - 1):
            raise OpperfError(f"range bound {value} is not a power of two", field="--bytes-grid")
    if min_bytes > max_bytes:
        raise OpperfError(f"range {min_bytes}..{max_bytes} is empty", field="--bytes-grid")
    sizes, value = [], min_bytes
    while value <= max_bytes:
        sizes.append(value)
        value *= 2
    return sizes


def parse_bytes_grid(items: Iterable[str | int] | None) -> list[int]:
    """The sorted, de-duplicated grid of the `--bytes-grid` items (default: the density standard's sizes)."""
    if not items:
        return load_standard().message_bytes.points()
    sizes: set[int] = set()
    for item in items:
        text = str(item)
        if ".." in text:
            low, high = text.split("..", 1)
            sizes.update(powers_of_two(parse_size(low), parse_size(high)))
        else:
            sizes.add(parse_size(text))
    return sorted(sizes)


def format_size(num_bytes: int) -> str:
    """1048576 → `1MiB`, 1536 → `1536B` (exact only)."""
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if num_bytes >= scale and num_bytes % scale == 0:
            return f"{num_bytes // scale}{unit}"
    return f"{num_bytes}B"
