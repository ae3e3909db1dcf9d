"""A `DeviceProfile` msmodeling can load for a database's device, written from `config/devices.yaml`.

msmodeling knows Ascend devices and TEST_DEVICE; a database built on an H200 or a CPU names a device it does not
ship. The file this module writes into the database directory constructs the profile (a `DeviceProfile` registers
itself by name), and `msmodeling_launch.py` runs it before msmodeling's CLI. A device msmodeling already ships
(the A2/A3 full names) is left as msmodeling defines it.

Where the values come from: `peak_tflops` (tensor-core / cube peak) are msmodeling's `mma_ops`;
`memory_gb` (GiB, as msmodeling counts device memory) and `memory_bandwidth_gbps` (10^9 B/s) its memory;
`interconnect_gbps` and `comm_grid_shape` its comm grid (dims of 1 dropped: msmodeling refuses a grid dim under 2,
so a one-device catalog entry gets a 2-device grid). What the catalog has no reading of — the general-purpose
(vector / CUDA-core) peak, the efficiencies, the per-op static costs, link latency — comes from the entry's
`msmodeling:` block where it has one, else from msmodeling's own TEST_DEVICE (`GP_FROM_TEST_DEVICE` below). With a
database that answers every query these only price misses (msmodeling's roofline fallback) and weight its m5.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path

from opperf.devices import Device
from opperf.io import write_text_atomic

PROFILE_FILE = "msmodeling_device.py"
# torch dtype names msmodeling's DeviceProfile keys its peaks by; catalog dtypes without one (tf32) are left out.
TORCH_DTYPES = {"float32": "torch.float32", "bfloat16": "torch.bfloat16", "float16": "torch.half",
                "int8": "torch.int8", "float8_e4m3fn": "torch.float8_e4m3fn", "float8_e5m2": "torch.float8_e5m2"}
# msmodeling's TEST_DEVICE (tensor_cast/device.py at 84fec85): its own placeholders for what nobody calibrated.
TEST_DEVICE_DEFAULTS = {"compute_efficiency": 0.7, "memory_efficiency": 0.6,
                        "static_cost_us": {"mma": 5.0, "gp": 2.0, "comm": 0.0},
                        "link_latency_us": 1.3, "comm_efficiency": 0.7}
# TEST_DEVICE's general-purpose peak is 1/32 of its bf16 cube peak (11 of 353.9 TFLOPS), float32 half of that.
GP_FROM_TEST_DEVICE = 11 / 353.9
VENDORS = {"cuda": "NVIDIA", "npu": "HUAWEI", "cpu": "HOST_CPU"}


def msmodeling_name(device: Device) -> str:
    """The name the device goes by in msmodeling (`--device`): the catalog's full name."""
    return device.full_name


def _gp_tflops(device: Device, settings: dict) -> dict[str, float]:
    if settings.get("gp_tflops"):
        return dict(settings["gp_tflops"])
    low_precision = device.peak_tflops.get("bfloat16") or max(device.peak_tflops.values())
    return {"bfloat16": low_precision * GP_FROM_TEST_DEVICE, "float16": low_precision * GP_FROM_TEST_DEVICE,
            "float32": low_precision * GP_FROM_TEST_DEVICE / 2}


def _ops_literal(tflops: dict[str, float]) -> str:
    items = [f"{TORCH_DTYPES[name]}: {float(value)!r} * 1e12" for name, value in tflops.items() if name in TORCH_DTYPES]
    return "{" + ", ".join(items) + "}"


def device_profile_source(device: Device) -> str:
    """The Python file that registers `device` with msmodeling (a no-op where msmodeling already has the name)."""
    settings = {**TEST_DEVICE_DEFAULTS, **device.msmodeling}
    static = {**TEST_DEVICE_DEFAULTS["static_cost_us"], **settings.get("static_cost_us", {})}
    grid = [n for n in device.comm_grid_shape if n >= 2] or [2]
    from_catalog = sorted(k for k in device.msmodeling)
    topology = (f"InterconnectTopology(bandwidth_bytes_ps={float(device.interconnect_gbps or 1)!r} * 1e9, "
                f"latency_s={float(settings['link_latency_us'])!r} * 1e-6, "
                f"comm_efficiency={float(settings['comm_efficiency'])!r}, type=InterconnectType.FULL_MESH)")
    topologies = ", ".join(f"{i}: {topology}" for i in range(len(grid)))
    return f'''"""msmodeling DeviceProfile for opperf device {device.name} ({device.full_name}), {device.backend}.

Written by opperf from config/devices.yaml on {date.today().isoformat()}; run by opperf's msmodeling_launch.py before
msmodeling's CLI so that `--device {msmodeling_name(device)}` is a choice. Catalog: peak_tflops, memory_gb,
memory_bandwidth_gbps, interconnect_gbps, comm_grid_shape {list(device.comm_grid_shape)}. From the entry's
msmodeling block: {", ".join(from_catalog) or "nothing"}; the rest is msmodeling's TEST_DEVICE's.
"""

import torch
from tensor_cast.device import CommGrid, DeviceProfile, InterconnectTopology, InterconnectType, StaticCost

NAME = {msmodeling_name(device)!r}

if NAME not in DeviceProfile.all_device_profiles:
    DeviceProfile(
        name=NAME,
        vendor={VENDORS[device.backend]!r},
        mma_ops={_ops_literal(device.peak_tflops)},
        gp_ops={_ops_literal(_gp_tflops(device, settings))},
        memory_size_bytes={float(device.memory_gb)!r} * 1024**3,
        memory_bandwidth_bytes_ps={float(device.memory_bandwidth_gbps)!r} * 1e9,
        compute_efficiency={float(settings["compute_efficiency"])!r},
        memory_efficiency={float(settings["memory_efficiency"])!r},
        comm_grid=CommGrid(grid=torch.arange({"*".join(map(str, grid))}).reshape({", ".join(map(str, grid))},),
                           topologies={{{topologies}}}),
        static_cost=StaticCost(mma_op_cost_s={float(static["mma"])!r} * 1e-6, gp_op_cost_s={float(static["gp"])!r} * 1e-6,
                               comm_op_cost_s={float(static["comm"])!r} * 1e-6),
    )
'''


def write_device_profile(device: Device, directory: str | Path) -> Path:
    """Write the device's profile file into a database directory (atomically); returns its path."""
    path = Path(directory) / PROFILE_FILE
    write_text_atomic(path, device_profile_source(device))
    return path
