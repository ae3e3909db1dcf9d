#!/usr/bin/env python
"""Do a kernel's input values change its power, clock and time? The workload's own tensors against replay's draw.

The dense reference decoder's 64 x 1,024-token prefill replays 4-15 % fast on an H100 and an H200 and is what keeps
its time-weighted gap over 3 % (docs/replay.md, "The remaining error, by cause"). The workload ran those calls at a
lower SM clock and a higher power than replay (the 65,536 x 25,600 x 5,120 down GEMM: 1,709 MHz and 609 W against
1,845 MHz and 521 W, H200, 2026-11-28). Heaters of any length did not reproduce that state. A GEMM's power depends
on how many bits its operands toggle, so this probe asks whether the values are the difference: replay fills
inputs with standard normal draws (opperf.replay.inputs), the workload with its activations and its weights
(normal x fan_in^-0.5).

It builds one layer of the reference decoder at the model's dims, runs the prefill once and keeps the inputs of its
MLP (gate_up GEMM, silu of the gate slice, mul by the up slice, down GEMM), then times each kernel with
- `workload`: those very tensors;
- `replay`: standard normal draws of the same shapes, dtypes and strides, as replay makes them;
- `scaled`: normal draws with each workload tensor's own standard deviation (the scale apart from the values);
each after `--rest-s` of idle, `--reps` calls back to back (CUDA events), with NVML's SM clock and power sampled
every 2 ms. The variants alternate within each round, so drift falls on all of them alike.

    python benchmarks/value_power_probe.py [--model Qwen3-32B --batch 64 --tokens 1024] --output OUT.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opperf.workload.model import ReferenceDecoder, load_model_dims  # noqa: E402
from opperf.workload.power import NvmlSampler  # noqa: E402

VARIANTS = ("workload", "replay", "scaled")


def captured_mlp_inputs(model: ReferenceDecoder, token_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """The MLP's operands in the prefill of `token_ids`: F.linear is wrapped for one forward pass."""
    layer = model.layers[0]
    seen: dict[str, torch.Tensor] = {}
    linear = F.linear

    def recording(x, weight, bias=None):
        out = linear(x, weight, bias)
        if weight is layer["gate_up"]:
            seen["x"], seen["gate_up_out"] = x.reshape(-1, x.shape[-1]), out.reshape(-1, out.shape[-1])
        elif weight is layer["down"]:
            seen["hidden"] = x.reshape(-1, x.shape[-1])
        return out

    F.linear = recording
    try:
        model.prepare_rope(token_ids.shape[1])
        model.forward(token_ids, 0, model.new_cache())
    finally:
        F.linear = linear
    torch.cuda.synchronize()
    return {**seen, "w_gate_up": layer["gate_up"], "w_down": layer["down"]}


def kernels(t: dict[str, torch.Tensor]) -> dict:
    """Each MLP kernel as the workload launched it, over the tensors `t` (one variant's)."""
    half = t["gate_up_out"].shape[-1] // 2
    gate, up = t["gate_up_out"][:, :half], t["gate_up_out"][:, half:]
    activated = F.silu(gate)
    return {"mm gate_up": lambda: torch.mm(t["x"], t["w_gate_up"].t()),
            "silu": lambda: F.silu(gate),
            "mul": lambda: activated * up,
            "mm down": lambda: torch.mm(t["hidden"], t["w_down"].t())}


def redrawn(tensor: torch.Tensor, generator: torch.Generator, std: float | None) -> torch.Tensor:
    """A draw of `tensor`'s shape and dtype: standard normal (std None), else normal with that std."""
    values = torch.randn(tensor.shape, generator=generator, device=tensor.device, dtype=torch.float32)
    return (values * std if std is not None else values).to(tensor.dtype)


def timed_block(fn, reps: int, rest_s: float, sampler: NvmlSampler | None) -> dict:
    torch.cuda.synchronize()
    time.sleep(rest_s)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    start_us = time.monotonic_ns() / 1000.0
    for begin, end in events:
        begin.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    end_us = time.monotonic_ns() / 1000.0
    times = [b.elapsed_time(e) * 1000.0 for b, e in events]
    state = sampler.state_during(start_us, end_us) if sampler else None
    return {"median_us": statistics.median(times), "first5_us": statistics.median(times[:5]),
            "last5_us": statistics.median(times[-5:]), "sm_mhz": state[0] if state else None,
            "power_w": state[1] if state else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="Qwen3-32B")
    parser.add_argument("--models", type=Path, default=Path(__file__).resolve().parents[1] / "config" / "models.yaml")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rest-s", type=float, default=1.0)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()

    dims = load_model_dims(args.models, args.model, num_layers=1)
    model = ReferenceDecoder(dims, "cuda", torch.bfloat16, seed=0)
    token_ids = torch.randint(0, dims.vocab_size, (args.batch, args.tokens),
                              generator=torch.Generator().manual_seed(0)).cuda()
    workload = captured_mlp_inputs(model, token_ids)
    del model
    generator = torch.Generator(device="cuda").manual_seed(1)
    tensors = {"workload": workload,
               "replay": {k: redrawn(v, generator, None) for k, v in workload.items()},
               "scaled": {k: redrawn(v, generator, v.float().std().item()) for k, v in workload.items()}}
    stats = {k: {"std": v.float().std().item(), "mean": v.float().mean().item(),
                 "zero_fraction": (v == 0).float().mean().item()} for k, v in workload.items()}
    calls = {variant: kernels(tensors[variant]) for variant in VARIANTS}
    sampler = NvmlSampler.start_if_available()
    results: dict[str, dict[str, list[dict]]] = {}
    try:
        for round_index in range(args.rounds):
            order = VARIANTS[round_index % 3:] + VARIANTS[:round_index % 3]
            for kernel in calls["workload"]:
                for variant in order:
                    block = timed_block(calls[variant][kernel], args.reps, args.rest_s, sampler)
                    results.setdefault(kernel, {}).setdefault(variant, []).append(block)
                    print(f"round {round_index} {kernel:10s} {variant:8s} {block['median_us']:10.1f} µs  "
                          f"{block['sm_mhz'] or 0:6.0f} MHz  {block['power_w'] or 0:5.0f} W", flush=True)
    finally:
        if sampler:
            sampler.stop()

    table = []
    print("\n| kernel | variant | median µs | vs replay | SM MHz | power W |\n|---|---|---|---|---|---|")
    for kernel, by_variant in results.items():
        base = statistics.median(b["median_us"] for b in by_variant["replay"])
        for variant, blocks in by_variant.items():
            row = {"kernel": kernel, "variant": variant,
                   "median_us": statistics.median(b["median_us"] for b in blocks),
                   "sm_mhz": statistics.median(b["sm_mhz"] or 0 for b in blocks),
                   "power_w": statistics.median(b["power_w"] or 0 for b in blocks)}
            row["vs_replay"] = row["median_us"] / base
            table.append(row)
            print(f"| {kernel} | {variant} | {row['median_us']:.1f} | {row['vs_replay']:.3f} | {row['sm_mhz']:.0f} | "
                  f"{row['power_w']:.0f} |")
    document = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "model": args.model, "batch": args.batch, "tokens": args.tokens, "reps": args.reps,
                "rounds": args.rounds, "rest_s": args.rest_s, "workload_tensor_stats": stats,
                "table": table, "blocks": results}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
