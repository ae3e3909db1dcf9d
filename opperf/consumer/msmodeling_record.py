"""Record the op queries msmodeling's own `ModelRunner` issues for one `text-generate` run.

    python msmodeling_record.py MSMODELING_DIR [--device-profile FILE] --output QUERIES.json \
        -- MODEL_DIR --num-queries B --query-length T [--context-length C --decode] [other text-generate options]

The arguments after `--` are `msmodeling inference text-generate`'s, parsed by its own parser; the runner is built
and run as its CLI builds and runs it (`UserInputConfig.from_args`, `ModelRunner`, `run_inference` with
`generate_inputs`). Every op the runtime hands its performance model is recorded: the runtime wraps each model in
a `CachingPerformanceModel` that asks the model once per distinct op signature, so the recorder *is* such a cache
(the runtime then leaves it unwrapped) and counts every call before answering from the roofline model.
Output: {"msmodeling_args": [...], "calls": [{"op", "args", "kwargs", "out", "count"}]}, tensors as
{"shape", "dtype", "stride" (non-contiguous only), "values" (small integer tensors off the meta device: seq_lens,
query_lens, block tables, slot mappings)}. Standalone on purpose: it runs in msmodeling's environment.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import tempfile

VALUES_UP_TO = 65536   # integer tensors up to this many elements keep their values (metadata, not activations)


def describe(value, torch):
    """An op argument as JSON: tensors by shape/dtype (and values where they are small integer metadata)."""
    if isinstance(value, torch.Tensor):
        spec = {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
        if value.dim() and not value.is_contiguous():
            spec["stride"] = list(value.stride())
        if (value.device.type != "meta" and not value.is_floating_point() and not value.is_complex()
                and value.numel() <= VALUES_UP_TO):
            spec["values"] = value.detach().cpu().reshape(-1).tolist()
        return spec
    if isinstance(value, (list, tuple)):
        return [describe(item, torch) for item in value]
    if isinstance(value, dict):
        return {str(key): describe(item, torch) for key, item in value.items()}
    if isinstance(value, torch.dtype):
        return {"dtype_value": str(value).removeprefix("torch.")}
    if isinstance(value, (torch.device, torch.memory_format, torch.layout)):
        return {"repr": str(value)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return {"repr": repr(value)}


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="msmodeling_record.py")
    parser.add_argument("msmodeling")
    parser.add_argument("--device-profile")
    parser.add_argument("--output", required=True)
    own = parser.parse_args(argv[:split])
    text_generate_args = argv[split + 1:]

    sys.path.insert(0, own.msmodeling)
    if own.device_profile:
        runpy.run_path(own.device_profile, run_name="opperf_device_profile")
    import torch
    from cli.inference.text_generate import arg_parse
    from tensor_cast.core.input_generator import generate_inputs
    from tensor_cast.core.model_runner import ModelRunner
    from tensor_cast.core.user_config import UserInputConfig
    from tensor_cast.performance_model.analytic import AnalyticPerformanceModel
    from tensor_cast.performance_model.base import CachingPerformanceModel

    class RecordingModel(CachingPerformanceModel):
        """Counts every op call, then answers as the runtime's own cache of a roofline model would."""

        def __init__(self, device_profile):
            super().__init__(AnalyticPerformanceModel(device_profile))
            self.calls: dict[str, dict] = {}

        def process_op(self, op_invoke_info):
            call = {"op": str(op_invoke_info.func).removeprefix("torch.ops."),
                    "args": describe(list(op_invoke_info.args), torch),
                    "kwargs": describe(dict(op_invoke_info.kwargs or {}), torch),
                    "out": describe(op_invoke_info.out, torch)}
            key = json.dumps(call, sort_keys=True)
            self.calls.setdefault(key, {**call, "count": 0})["count"] += 1
            return super().process_op(op_invoke_info)

    args = arg_parse(text_generate_args)
    user_input = UserInputConfig.from_args(args)
    runner = ModelRunner(user_input)
    recorder = RecordingModel(runner.device_profile)
    runner.perf_models = [recorder]
    runner.run_inference(generate_inputs_func=generate_inputs)

    document = {"msmodeling_args": text_generate_args, "device": user_input.device,
                "calls": list(recorder.calls.values())}
    directory = os.path.dirname(os.path.abspath(own.output))
    handle, temporary = tempfile.mkstemp(prefix=".record-", suffix=".json", dir=directory)
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        json.dump(document, out)
    os.replace(temporary, own.output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
