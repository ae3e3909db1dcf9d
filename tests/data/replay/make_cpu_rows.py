#!/usr/bin/env python
"""Regenerate cpu_rows.csv: one real row per aten op of the reference workload's CPU trace.

    python scripts/profile_workload.py --output /tmp/wl && python tests/data/replay/make_cpu_rows.py /tmp/wl/trace.json

The rows of the MoE routing ops (topk, sort, bincount, floor_divide, index_add_, max, min, arange,
_local_scalar_dense) are the smallest of their kind in the H100 MoE workload's parsed database
(benchmarks/cuda_replay.py), appended by hand: the CPU reference decoder is dense. So are the PagedAttention and
ReshapeAndCache rows (msmodeling's decode 4 x 512 calls for a tiny model, with their `Runtime actual_seq_lengths_*`
columns; tests/test_replay_tensor_cast.py lays such rows) and the MoeGatingTopK / MoeTokenPermute / MoeTokenUnpermute
rows (its decode 4 x 512 calls for tests/data/workload/tiny_glm4_moe.json, with `Runtime num_experts`;
tests/test_tensor_cast_moe.py).
The workload covers most definitions; `extra_ops_trace` profiles the few the reference decoder does
not call (addmm, baddbmm, gelu, softmax, where, stack, gather, scatter_, ...) the same way. Input slots come straight from torch.profiler's record_shapes (`Input Dims`, `Input type`,
`Concrete Inputs`; a TensorList is flattened into one slot per tensor). Output slots are those
of the same call run once through torch.ops.aten on the CPU, so the rows are what the parse stage
produces for these ops (it infers outputs the same way, with meta tensors).
"""

import csv
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from opperf import contract  # noqa: E402
from opperf.replay.definitions import load_definitions  # noqa: E402
from opperf.replay.engine import replay_row  # noqa: E402
from opperf.replay.inputs import build_case  # noqa: E402
from opperf.replay.verify import describe_outputs, produced_outputs  # noqa: E402
from opperf.replay.timing import CpuProfilerTimer  # noqa: E402


def dtype_name(profiler_type: str) -> str:
    torch_name = contract.PROFILER_TYPE_TO_TORCH.get(profiler_type)
    return contract.TORCH_TO_PROFILER_DTYPE.get(torch_name, "") if torch_name else ""


def row_of(event: dict) -> dict:
    args = event["args"]
    shapes, dtypes, scalars = [], [], []
    for dims, kind, concrete in zip(args["Input Dims"], args["Input type"], args["Concrete Inputs"]):
        if dims and isinstance(dims[0], list):           # TensorList
            for element in dims:
                shapes.append(",".join(map(str, element)))
                dtypes.append("DT_FLOAT")
                scalars.append("")
            continue
        shapes.append(",".join(map(str, dims)))
        dtypes.append(dtype_name(kind))
        scalars.append(concrete)
    return {contract.INPUT_SHAPES: ";".join(shapes), contract.INPUT_DTYPES: ";".join(dtypes),
            contract.INPUT_FORMATS: ";".join("ND" if s else "" for s in shapes),
            contract.INPUT_SCALARS: ";".join(scalars)}


def extra_ops_trace(path: Path) -> None:
    """A torch.profiler trace (record_shapes) of the ops with a definition that the workload does not call."""
    import torch
    import torch.nn.functional as F

    x, w, b = torch.randn(8, 32), torch.randn(16, 32), torch.randn(16)
    batch = torch.randn(2, 8, 32)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        F.linear(x, w, b)                                       # addmm
        torch.baddbmm(torch.randn(2, 8, 8), batch, batch.transpose(1, 2))
        torch.sub(x, x, alpha=2)
        torch.div(x, x + 3)
        torch.sqrt(x.abs())
        torch.exp(x)
        F.gelu(x, approximate="tanh")
        F.relu(x)
        torch.sigmoid(x)
        torch.tanh(x)
        torch.softmax(x, dim=-1)
        torch.where(x > 0, x, x * 2)
        torch.zeros(4, 8)
        x.t().contiguous()
        batch.permute(2, 0, 1)
        batch[:1].squeeze(0)
        y = x.clone()
        y.add_(x, alpha=0.5)
        y.mul_(x)
        torch.stack([x, x], dim=0)
        torch.gather(x, 1, torch.randint(0, 32, (8, 4)))
        torch.zeros(8, 4).scatter_(1, torch.randint(0, 4, (8, 1)), 1)     # scatter_: a router's group mask
    prof.export_chrome_trace(str(path))


def main(trace_path: str) -> None:
    import tempfile

    definitions = load_definitions(Path(__file__).resolve().parents[3] / "config" / "kernels" / "torch", "cpu")
    events = [e for e in json.load(open(trace_path))["traceEvents"] if e.get("cat") == "cpu_op"]
    with tempfile.TemporaryDirectory() as scratch:
        extra = Path(scratch) / "extra.json"
        extra_ops_trace(extra)
        events += [e for e in json.load(open(extra))["traceEvents"] if e.get("cat") == "cpu_op"]
    rows, seen = [], set()
    for event in events:
        kernel_type = event["name"].removeprefix("aten::")
        if kernel_type in seen or kernel_type not in definitions:
            continue
        seen.add(kernel_type)
        row = row_of(event)
        case = build_case(definitions[kernel_type], row, "cpu")
        outputs = produced_outputs(case.run())
        shapes, dtypes = describe_outputs(outputs).split(" | ")
        row.update({"Type": kernel_type, contract.OP_STATE: "dynamic", contract.ACCELERATOR_CORE: "CPU",
                    contract.OUTPUT_SHAPES: shapes, contract.OUTPUT_DTYPES: dtypes,
                    contract.OUTPUT_FORMATS: ";".join("ND" if s else "" for s in shapes.split(";")) if shapes else ""})
        outcome = replay_row(definitions[kernel_type], row, backend="cpu", device="cpu", timer=CpuProfilerTimer(),
                         repeat_count=1)
        assert outcome.status == "ok", (kernel_type, outcome)
        rows.append(row)
    columns = ["Type", *contract.BASE_COLUMNS, contract.INPUT_SCALARS]
    with open(Path(__file__).with_name("cpu_rows.csv"), "w", newline="") as handle:
        writer = csv.DictWriter(handle, columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(sorted(rows, key=lambda r: r["Type"]))
    print(f"{len(rows)} rows: {', '.join(sorted(seen))}")
    missing = sorted(set(definitions) - seen)
    print(f"definitions without a row: {', '.join(missing) or 'none'}")


if __name__ == "__main__":
    main(sys.argv[1])
