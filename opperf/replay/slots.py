"""Give each concurrent replay job its own device.

`snakemake --resources gpu=K` (or `npu=K`) bounds how many replay jobs run at once but says nothing
about *which* device each gets. Each job takes the first free device id by holding an exclusive
`fcntl.flock` on `<slots dir>/<backend>-<id>.lock`; the kernel releases it when the job ends, even
on a crash, so a slot never leaks. The child then sees only its device through
CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from opperf.errors import OpperfError
from opperf.log import get_logger

DEFAULT_SLOTS_DIR = Path(".snakemake") / "opperf-slots"
VISIBLE_DEVICES_VARIABLE = {"cuda": "CUDA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}

log = get_logger("replay.slots")


def parse_device_ids(text: str, *, field: str = "--device-ids") -> list[int]:
    """`0,1,3` → [0, 1, 3] (strict: non-negative integers, no repeats)."""
    ids = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise OpperfError(f"device id {part!r} is not a non-negative integer (expected e.g. 0,1,2,3)", field=field)
        ids.append(int(part))
    if len(set(ids)) != len(ids):
        raise OpperfError(f"device ids repeat: {text!r}", field=field)
    return ids


def cuda_device_count() -> int:
    """The GPUs the driver lists (nvidia-smi), so the job's parent never imports torch or opens a CUDA context
    (seconds on a GPU host); torch's own count where nvidia-smi is missing."""
    try:
        listed = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                                text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        listed = None
    if listed is not None and listed.returncode == 0:
        return sum(1 for line in listed.stdout.splitlines() if line.strip())
    import torch

    return torch.cuda.device_count()


def default_device_ids(backend: str) -> list[int]:
    """The devices this host offers the back end: the visible-devices variable if set, else all of them."""
    if backend == "cpu":
        return []
    variable = VISIBLE_DEVICES_VARIABLE[backend]
    if os.environ.get(variable, "").strip():
        # Ids *within* the visible set are 0..n-1 after the variable applies; the child gets the real id.
        return parse_device_ids(os.environ[variable], field=variable)
    if backend == "cuda":
        return list(range(cuda_device_count()))
    # Says what is missing (torch_npu, CANN, a visible device) as a DeviceUnavailableError.
    from opperf.replay.npu.environment import check_npu_available
    return list(range(check_npu_available()))


@contextlib.contextmanager
def device_slot(backend: str, device_ids: Sequence[int], directory: str | Path = DEFAULT_SLOTS_DIR,
                wait_timeout_s: float = 24 * 3600, poll_s: float = 0.2) -> Iterator[int | None]:
    """Hold one free device id of `device_ids` for the duration of the block (None for cpu)."""
    if backend == "cpu":
        yield None
        return
    if not device_ids:
        raise OpperfError(f"no {backend} device ids to allocate from (is a device visible? "
                          f"set {VISIBLE_DEVICES_VARIABLE[backend]} or --device-ids)")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_timeout_s
    while True:
        for device_id in device_ids:
            handle = open(directory / f"{backend}-{device_id}.lock", "a+")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            try:
                handle.seek(0)
                handle.truncate()
                handle.write(f"{os.getpid()}\n")
                handle.flush()
                log.info("holding %s device %d (lock %s)", backend, device_id, handle.name)
                yield device_id
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
                handle.close()
            return
        if time.monotonic() > deadline:
            raise OpperfError(f"no free {backend} device among {list(device_ids)} after {wait_timeout_s:g} s "
                              f"(lock files in {directory})")
        time.sleep(poll_s)


def visible_devices_env(backend: str, device_id: int | None) -> dict[str, str]:
    """The environment entry that confines a child to its slot's device."""
    if device_id is None or backend == "cpu":
        return {}
    return {VISIBLE_DEVICES_VARIABLE[backend]: str(device_id)}
