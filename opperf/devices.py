"""The device catalog (`config/devices.yaml`): what the estimators need to know about each device."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from opperf.errors import OpperfError
from opperf.yaml_files import check_schema, read_yaml_mapping

DEFAULT_CATALOG = Path(__file__).resolve().parent.parent / "config" / "devices.yaml"
# The seed's CLIs default --device to this full name (an A3 die) when deriving a database directory.
SEED_DEFAULT_DEVICE = "ATLAS_800_A3_752T_128G_DIE"
BACKENDS = ("cpu", "cuda", "npu")
CATALOG_SCHEMA = "devices.schema.yaml"


@dataclass(frozen=True)
class Device:
    name: str
    full_name: str
    backend: str
    memory_gb: float
    peak_tflops: dict = field(default_factory=dict)
    memory_bandwidth_gbps: float = 0.0
    interconnect: str = ""
    interconnect_gbps: float = 0.0
    comm_grid_shape: tuple[int, ...] = ()
    msmodeling: dict = field(default_factory=dict)   # what msmodeling's DeviceProfile needs beyond the above


def load_catalog(path: str | Path = DEFAULT_CATALOG) -> dict[str, Device]:
    """Every device of a catalog, checked against config/devices.schema.yaml (a bad entry is one line naming
    the file, line and field)."""
    path = Path(path)
    raw = read_yaml_mapping(path, "device catalog")
    check_schema(raw, CATALOG_SCHEMA, path)
    return {str(name): Device(name=str(name), full_name=entry["full_name"], backend=entry["backend"],
                              memory_gb=float(entry["memory_gb"]), peak_tflops=dict(entry["peak_tflops"]),
                              memory_bandwidth_gbps=float(entry["memory_bandwidth_gbps"]),
                              interconnect=str(entry.get("interconnect", "")),
                              interconnect_gbps=float(entry.get("interconnect_gbps", 0)),
                              comm_grid_shape=tuple(entry.get("comm_grid_shape", ())),
                              msmodeling=dict(entry.get("msmodeling") or {}))
            for name, entry in raw.items()}


def resolve_device(name: str, catalog: dict[str, Device] | None = None) -> Device:
    """A catalog key (`A3`) or a full name (`ATLAS_800_A3_752T_128G_DIE`) → its Device."""
    catalog = catalog if catalog is not None else load_catalog()
    if name in catalog:
        return catalog[name]
    for device in catalog.values():
        if device.full_name == name:
            return device
    raise OpperfError(f"unknown device {name!r}; known: {', '.join(sorted(catalog))} "
                      f"(or their full names) — add it to config/devices.yaml")
