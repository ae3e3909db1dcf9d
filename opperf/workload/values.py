"""Record the input values a trace cannot hold (opperf.input_values) while the workload runs un-profiled.

A TorchDispatchMode sees every aten call below autograd, with its real tensors: for the ops with recorded
arguments (opperf.input_values.recorded_arguments) it reads those arguments' values (one host sync per such call,
in a pass that is not timed) and keeps them with the call's input shapes, the join key the parse stage matches
trace calls by. Of any call with a TensorList longer than torch.profiler records the members of
(opperf.input_values.PROFILER_LIST_LIMIT), it keeps the members' shapes, strides and dtype.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from opperf.input_values import (COUNTS, DISTINCT, FORMAT_VERSION, INPUT_VALUES, MASK, OFFSETS,
                                 PROFILER_LIST_LIMIT, format_values, recorded_arguments)
from opperf.power_samples import op_base_name


def _counts(op: str, tensor: torch.Tensor, arguments: dict) -> list[int] | None:
    """How many of the tensor's values fall in each bin the op counts them in."""
    if op == "bincount":
        if tensor.numel() == 0 or tensor.dtype.is_floating_point:
            return None
        return torch.bincount(tensor.reshape(-1).to(torch.int64).cpu()).tolist()
    if op == "histc":
        bins, low, high = int(arguments.get("bins", 100)), float(arguments.get("min", 0)), float(arguments.get("max", 0))
        if low == high:          # the range is the data's own: keep it explicit, replay needs one
            return None
        return torch.histc(tensor.detach().float().cpu(), bins=bins, min=low, max=high).to(torch.int64).tolist()
    return None


def _long_list(value) -> bool:
    """A TensorList whose member shapes torch.profiler does not record (more than PROFILER_LIST_LIMIT tensors)."""
    return (isinstance(value, (list, tuple)) and len(value) > PROFILER_LIST_LIMIT
            and all(isinstance(member, torch.Tensor) for member in value))


class ValueRecorder(TorchDispatchMode):
    """Within `with ValueRecorder() as recorder:`, every call of a recorded op, and every call with a TensorList
    longer than the profiler records, adds an entry to `recorder.calls`: `{"op", "shapes": [input shapes, schema
    order], "slots": {schema position: values text}}`, and `"lists": {schema position: {"shapes", "strides",
    "dtype"}}` for the long lists."""

    def __init__(self):
        super().__init__()
        self.calls: list[dict] = []
        self.failed: dict[str, str] = {}     # op → the first reason its values could not be read (the call still runs)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = op_base_name(func._schema.name)
        recorded = recorded_arguments(op)
        if recorded or op == "embedding" or any(_long_list(value) for value in (*args, *kwargs.values())):
            try:
                names = [argument.name for argument in func._schema.arguments]
                arguments = {name: args[position] if position < len(args) else kwargs[name]
                             for position, name in enumerate(names) if position < len(args) or name in kwargs}
                if op == "embedding":
                    # The trace's row is the call inside it, which the mode does not see: ATen's embedding is
                    # weight.index_select(0, indices.reshape(-1)) on every device.
                    op, names = "index_select", ["self", "dim", "index"]
                    arguments = {"self": arguments["weight"], "dim": 0, "index": arguments["indices"].reshape(-1)}
                    recorded = recorded_arguments(op)
                self._record(op, names, arguments, recorded)
            except Exception as exc:  # noqa: BLE001 — recording must never change what the workload runs
                self.failed.setdefault(op, f"{type(exc).__name__}: {exc}"[:200])
        return func(*args, **kwargs)

    def _record(self, op: str, names: list[str], arguments: dict, recorded: dict) -> None:
        shapes = [list(value.shape) if isinstance(value, torch.Tensor) else [] for value in
                  (arguments.get(name) for name in names)]
        slots = {}
        for name, kind in recorded.items():
            tensor = arguments.get(name)
            if kind == DISTINCT and isinstance(tensor, (list, tuple)) and tensor:
                tensor = tensor[0]          # an index list's first member: the row's slot right after self
            if not isinstance(tensor, torch.Tensor):
                continue
            if kind == OFFSETS and not tensor.dtype.is_floating_point and tensor.dim() == 1:
                values = tensor.cpu().tolist()
            elif kind == COUNTS:
                values = _counts(op, tensor, arguments)
            elif kind == MASK and tensor.dtype == torch.bool:
                values = [int(tensor.count_nonzero())]
            elif kind == DISTINCT and not tensor.dtype.is_floating_point and tensor.dtype != torch.bool:
                values = [int(torch.unique(tensor).numel())]
            else:
                values = None
            if values is not None and all(v >= 0 for v in values):
                slots[str(names.index(name))] = format_values(values)
        lists = {str(position): {"shapes": [list(t.shape) for t in value], "strides": [list(t.stride()) for t in value],
                                 "dtype": str(value[0].dtype).removeprefix("torch.")}
                 for position, value in enumerate(arguments.get(name) for name in names) if _long_list(value)}
        if slots or lists:
            self.calls.append({"op": op, "shapes": shapes, "slots": slots, **({"lists": lists} if lists else {})})

    def write(self, directory: str | Path) -> Path:
        path = Path(directory) / INPUT_VALUES
        document = {"version": FORMAT_VERSION, "calls": self.calls}
        path.write_text(json.dumps(document, separators=(",", ":")) + "\n", encoding="utf-8")
        return path
