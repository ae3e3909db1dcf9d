#!/usr/bin/env python
"""Does where a copy's input lies in memory, or the cache state it is read in, make clone's steps?

The H100 database's clone rows step along heads where no line can follow them (issue 19): the transposed
(1, h, 1, T, 56) copy at T = 1,000 took 1.6 / 4.0 / 2.1 / 3.8 µs at h = 8/16/32/64, with per-call CVs of 0.1-0.29,
and two re-replays gave the same steps. Replay allocates each row's input once, so a row's time could be that of
one placement of its bytes, and a neighbour's of another. This times each shape with its input at several
byte offsets of one pool, under three cache states, and prints per shape the spread of the per-placement medians
against the spread of calls within one placement:

- insitu: flush (read 2x L2), then the input rewritten from a twin (resident, dirty), as replay's default;
- clean: flush, then the input read once (resident, clean);
- cold: flush only.

    python benchmarks/copy_placement_probe.py [--calls 25] [--json OUT]
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

OFFSETS = (0, 512, 4096, 65536, 1 << 20, (3 << 20) + 1536, (16 << 20) + 2560, (29 << 20) + 8192)
STATES = ("insitu", "clean", "cold")


def shapes() -> list[tuple[str, tuple[int, ...], str]]:
    """(label, shape, layout): DeepSeek-V3's transposed rope copy along heads and tokens, and packed copies."""
    found = [(f"T{t} h{h} transposed", (1, h, 1, t, 56), "transposed")
             for t in (1000, 3000, 4096) for h in (8, 16, 32, 64, 128)]
    found += [(f"b{b} h{h} packed", (b, h, 1, 1025, 56), "packed") for b, h in ((1, 8), (1, 16), (2, 8), (3, 8),
                                                                                 (1, 32), (1, 64), (4, 16), (8, 8))]
    return found


def view_at(pool: torch.Tensor, offset: int, shape: tuple[int, ...], layout: str) -> torch.Tensor:
    numel = 1
    for size in shape:
        numel *= size
    flat = pool[offset // 2: offset // 2 + numel]
    if layout == "packed":
        return flat.view(shape)
    _, h, _, t, d = shape
    return flat.view(t, h, d).permute(1, 0, 2)[None, :, None]       # (1, h, 1, T, d), heads innermost but d


def main(argv=None) -> int:
    args = calls_arguments(__doc__, 25, argv)
    device = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    flush = torch.ones(2 * l2 // 4, dtype=torch.int32, device=device)
    largest = max(torch.Size(s).numel() for _, s, _ in shapes())
    pool = torch.randn(largest + OFFSETS[-1] // 2 + 4096, dtype=torch.bfloat16, device=device)
    twin = torch.empty(largest, dtype=torch.bfloat16, device=device)
    session = RangeSession([torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA], strict=True)
    plan = []
    for label, shape, layout in shapes():
        for state in STATES:
            for offset in OFFSETS:
                x = view_at(pool, offset, shape, layout)
                storage = pool[offset // 2: offset // 2 + x.numel()]
                mirror = twin[: x.numel()]
                mirror.copy_(storage)
                name = session.range_name((label, state, offset), args.calls, state)
                for _ in range(args.calls + 3):
                    flush.sum()
                    if state == "insitu":
                        storage.copy_(mirror)
                    elif state == "clean":
                        storage.sum()
                    if _ >= 3:
                        with torch.profiler.record_function(name):
                            x.clone()
                    else:
                        x.clone()
                plan.append((label, shape, layout, state, offset))
        torch.cuda.synchronize()
    results = session.collect(range_device_times, "cupti")
    table = []
    print(f"{'shape':28} {'state':7} {'placement medians (µs)':>60}  spread  within")
    for label, shape, layout in shapes():
        for state in STATES:
            per = {o: results[(label, state, o)].samples_us for o in OFFSETS}
            medians = {o: statistics.median(s) for o, s in per.items()}
            within = statistics.median(statistics.pstdev(s) / statistics.mean(s) for s in per.values())
            spread = (max(medians.values()) - min(medians.values())) / min(medians.values())
            table.append({"shape": list(shape), "label": label, "layout": layout, "state": state,
                          "placement_medians_us": {str(o): round(m, 3) for o, m in medians.items()},
                          "placement_means_us": {str(o): round(statistics.mean(s), 3) for o, s in per.items()},
                          "spread_between_placements": round(spread, 4), "median_cv_within": round(within, 4)})
            cells = " ".join(f"{m:6.2f}" for m in medians.values())
            print(f"{label:28} {state:7} {cells:>60}  {spread:6.1%}  {within:6.1%}")
    result = {"device": torch.cuda.get_device_name(device), "torch": torch.__version__,
              "driver": driver_version(),
              "offsets_bytes": list(OFFSETS), "calls": args.calls, "rows": table}
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
