#!/usr/bin/env python
"""A database's GEMM rows against the same GEMMs inside the measured steps: for each `mm` call of the held-out steps
of an e2e_prediction work dir (benchmarks/e2e_prediction.py: its measured_steps, the device time of each call's
kernels) whose shapes have a row in the model's database (`mm.csv`, exact shapes), the row's replayed time over the
call's mean time in the step, per shape, and the call-weighted median.

It answers where a MoE step's remaining over-prediction comes from (issue 52): on the H200 the small expert GEMMs
(one to a few hundred rows against a cold weight) replay 4-6 % slower than they run in the step, while the lm_head
GEMM (hundreds of MB of weight) agrees. Beside each profile: the GPU's power inside its steps (NVML, the profile's
power_samples.json) and the matched rows' replay power and power policy, since replay runs a heater GEMM before a
short generated row (opperf.replay.methods, after-gemm) whatever the step's power.

    python benchmarks/probes/gemm_row_vs_step.py /tmp/e2e hf_glm45_air [--variant paged] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from opperf.contract import REPLAY_AVERAGE, parse_shapes  # noqa: E402
from opperf.power_samples import samples_at  # noqa: E402
from opperf.replay.methods import POWER_POLICY  # noqa: E402
from opperf.io import read_database_csv  # noqa: E402


def _e2e():
    spec = importlib.util.spec_from_file_location("e2e_prediction", ROOT / "benchmarks" / "e2e_prediction.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def database_rows(path: Path) -> dict[tuple, dict]:
    """(input shapes) -> {us, power_w, heated} of each mm row: its replayed time, the replay's power, whether a
    heater GEMM ran before each call."""
    rows = {}
    table = read_database_csv(path)
    power = table.get("Replay Power(W)", [""] * len(table))
    policy = table.get("Replay L2 Policy", [""] * len(table))
    for shapes, duration, watts, said in zip(table["Input Shapes"], table[REPLAY_AVERAGE], power, policy):
        if str(duration).strip():
            rows.setdefault(tuple(s for s in parse_shapes(shapes) if s is not None), {
                "us": float(duration), "power_w": float(watts) if str(watts).strip() else None,
                "heated": f"power: {POWER_POLICY}," in str(said)})
    return rows


def step_power(trace: Path) -> float | None:
    """The median NVML power (W) sampled inside the profile's steps (prefill_/decode_ ranges)."""
    events = json.loads(trace.read_text(encoding="utf-8"))["traceEvents"]
    sync = next((e["ts"] for e in events if e.get("name") == "opperf::power_sync"), None)
    samples = samples_at(trace, sync)
    if samples is None or "Power(W)" not in samples.fields:
        return None
    column = samples.fields.index("Power(W)")
    watts = []
    for step in (e for e in events if e.get("cat") == "user_annotation"
                 and str(e.get("name", "")).startswith(("prefill_", "decode_"))):
        for tenth in range(1, 10):
            value = samples.at(step["ts"] + step["dur"] * tenth / 10, step["ts"] + step["dur"] * tenth / 10)
            if value is not None and value[column] is not None:
                watts.append(value[column])
    return statistics.median(watts) if watts else None


def compare(work: Path, model: str, variant: str, version_dir: str, device: str) -> list[dict]:
    e2e = _e2e()
    rows = database_rows(work / model / "database" / device / "torch" / version_dir / "mm.csv")
    calls: dict = defaultdict(list)
    powers = {}
    for trace in sorted((work / model / "held_out" / variant).glob("*/trace.json")):
        powers[trace.parent.name] = step_power(trace)
        for label, value in e2e.measured_steps(trace).items():
            for (op, shapes, _), times in value["calls"].items():
                if op == "mm" and shapes in rows:
                    calls[(trace.parent.name, label.split("_")[0], shapes)] += times
    return [{"profile": profile, "phase": phase, "shapes": [list(s) for s in shapes], "calls": len(times),
             "step_us": round(statistics.mean(times), 3), "row_us": rows[shapes]["us"],
             "row_over_step": round(rows[shapes]["us"] / statistics.mean(times), 4),
             "step_power_w": powers[profile], "row_power_w": rows[shapes]["power_w"],
             "row_heated": rows[shapes]["heated"]}
            for (profile, phase, shapes), times in sorted(calls.items(), key=lambda item: -len(item[1]))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("model")
    parser.add_argument("--variant", default="paged", help="held_out/<variant> (default: %(default)s)")
    parser.add_argument("--device", default="H200")
    parser.add_argument("--version-dir", default="torch2.11.0_cuda13.0")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    found = compare(args.work_dir, args.model, args.variant, args.version_dir, args.device)
    if not found:
        print(f"no mm call of {args.work_dir / args.model / 'held_out' / args.variant} has a row", file=sys.stderr)
        return 1
    print("| profile | phase | shapes | calls | step µs | row µs | row / step | step W | row W | heater |\n"
          "|---|---|---|---:|---:|---:|---:|---:|---:|---|")
    for entry in found:
        print(f"| {entry['profile']} | {entry['phase']} | {entry['shapes']} | {entry['calls']} | {entry['step_us']} | "
              f"{entry['row_us']:.3f} | {entry['row_over_step']} | {entry['step_power_w']} | {entry['row_power_w']} | "
              f"{'yes' if entry['row_heated'] else 'no'} |")
    weighted = [entry["row_over_step"] for entry in found for _ in range(entry["calls"])]
    median = statistics.median(weighted)
    print(f"\ncall-weighted median row / step: {median:.4f} over {len(weighted)} calls")
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "variant": args.variant, "shapes": found,
                                         "call_weighted_median": round(median, 4), "calls": len(weighted)},
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
