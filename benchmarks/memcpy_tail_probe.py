#!/usr/bin/env python
"""Which execution branch does a dense CUDA copy take, by its byte count? (issue 19's clone steps)

A clone or same-dtype copy_ of a dense tensor (packed, or a permutation of packed, whose output keeps its
strides) is not a TensorIterator kernel on CUDA: the iterator coalesces to one contiguous run and ATen issues
one cudaMemcpyAsync device-to-device. The H100 database's clone rows step along heads where no line follows
them: (1, h, 1, 1000, 56) bf16 took 1.57 / 3.94 / 2.26 / 3.88 µs at h = 8/16/32/64, and the slow ones are the
byte counts that are not whole multiples of 4 KiB (1,792,000 = 2^11 x 875; 3,584,000 = 2^12 x 875). This
times the copy at byte counts on both sides of that boundary, around sizes from 256 KiB to 64 MiB, and
names what the device ran (memcpy activity or kernel, how many per call):

- `bytes`: clone of a packed uint8 tensor of exactly that many bytes;
- `shapes`: the database's own bf16 shapes (packed, heads-major transposed, broadcast), clone and copy_.

Each call runs in replay's default cache state (insitu: flush by reading 2x L2, then the input rewritten from
a twin) and is timed by CUPTI per call, as `scripts/replay.py` times a row.

    python benchmarks/memcpy_tail_probe.py [--calls 30] [--json OUT]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from opperf.replay.timing import RangeSession, range_device_times  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from device_result import calls_arguments, driver_version, write_json  # noqa: E402

KIB, MIB = 1024, 1024 * 1024
BASES = (256 * KIB, 512 * KIB, 768 * KIB, 896 * KIB, MIB, MIB + 128 * KIB, MIB + 256 * KIB, MIB + 512 * KIB,
         MIB + 768 * KIB, 2 * MIB, 3 * MIB, 4 * MIB, 8 * MIB, 16 * MIB, 32 * MIB, 64 * MIB)
DELTAS = (0, 2, 16, 256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 65536)


def byte_cases() -> list[tuple[str, int]]:
    return [(f"{base + delta}", base + delta) for base in BASES for delta in DELTAS]


def shape_cases() -> list[tuple[str, tuple[int, ...], str, str]]:
    """(label, shape, layout, op): the H100 database's clone rows along heads and tokens."""
    found = []
    for t in (1000, 1024, 1025, 3000, 4096, 4097):
        for h in (8, 16, 32, 64):
            found.append((f"clone (1,{h},1,{t},56) transposed", (1, h, 1, t, 56), "transposed", "clone"))
            found.append((f"clone (1,{h},1,{t},56) packed", (1, h, 1, t, 56), "packed", "clone"))
            found.append((f"copy_ (1,{h},1,{t},56) packed", (1, h, 1, t, 56), "packed", "copy_"))
    for t in (1000, 1025, 4096):
        for h in (1, 2, 4, 8):
            found.append((f"clone (1,{h},8,{t},128) broadcast", (1, h, 8, t, 128), "broadcast", "clone"))
    return found


def view_of(storage: torch.Tensor, shape: tuple[int, ...], layout: str) -> torch.Tensor:
    if layout == "packed":
        return storage.view(shape)
    if layout == "transposed":                      # (T, h, d) buffer read heads-major: dense, not packed
        _, h, _, t, d = shape
        return storage.view(t, h, d).permute(1, 0, 2)[None, :, None]
    b, h, g, t, d = shape                           # a KV head broadcast over its query group (stride 0)
    return storage.view(b, h, 1, t, d).expand(shape)


def device_activities(call) -> list[str]:
    """What the device ran for one call (kernel or memcpy activity names), in a profiler session of its own."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    cpu = torch.autograd.DeviceType.CPU
    return [event.name() for event in prof.profiler.kineto_results.events() if event.device_type() != cpu]


def main(argv=None) -> int:
    args = calls_arguments(__doc__, 30, argv)
    device = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    flush = torch.ones(2 * l2 // 4, dtype=torch.int32, device=device)

    cases = []          # (key, source storage (flat), callable)
    for label, size in byte_cases():
        src = torch.randint(0, 255, (size,), dtype=torch.uint8, device=device)
        cases.append((("bytes", label), src, (lambda x=src: x.clone())))
    for label, shape, layout, op in shape_cases():
        numel = shape[0] * shape[1] * shape[3] * shape[4] if layout == "broadcast" else torch.Size(shape).numel()
        storage = torch.randn(numel, dtype=torch.bfloat16, device=device)
        x = view_of(storage, shape, layout)
        if op == "clone":
            cases.append((("shapes", label), storage, (lambda x=x: x.clone())))
        else:
            dst = torch.empty(shape, dtype=torch.bfloat16, device=device)
            cases.append((("shapes", label), storage, (lambda x=x, dst=dst: dst.copy_(x))))

    session = RangeSession([torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA], strict=True)
    for key, storage, call in cases:
        twin = storage.clone()
        name = session.range_name(key, args.calls, "insitu")
        for i in range(args.calls + 3):
            flush.sum()
            storage.copy_(twin)
            if i >= 3:
                with torch.profiler.record_function(name):
                    call()
            else:
                call()
        torch.cuda.synchronize()
    timed = session.collect(range_device_times, "cupti")

    # What ran: one short profile per case, outside the timed session.
    names = {key: device_activities(call) for key, _, call in cases}

    rows = []
    for key, storage, _ in cases:
        samples = timed[key].samples_us
        activities = names.get(key, [])
        size = storage.numel() * storage.element_size() if key[0] == "bytes" else None
        row = {"set": key[0], "case": key[1], "median_us": round(statistics.median(samples), 3),
               "cv": round(statistics.pstdev(samples) / statistics.mean(samples), 4),
               "p10_us": round(sorted(samples)[len(samples) // 10], 3),
               "p90_us": round(sorted(samples)[(9 * len(samples)) // 10], 3),
               "activities": activities}
        if size is not None:
            row["bytes"] = size
            row["mod_4096"] = size % 4096
        rows.append(row)
        kinds = ", ".join(sorted(set(activities)))[:70]
        print(f"{key[0]:6} {key[1]:42} {row['median_us']:9.3f} µs  cv {row['cv']:6.3f}  "
              f"{len(row['activities'])}x {kinds}")
    result = {"device": torch.cuda.get_device_name(device), "torch": torch.__version__,
              "cuda": torch.version.cuda, "driver": driver_version(), "l2_bytes": l2, "calls": args.calls,
              "cache_state": "insitu", "rows": rows}
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
