"""Record the op queries msmodeling's own `ModelRunner` issues for a model over scenarios, in one process.

    python msmodeling_record.py MSMODELING_DIR [--device-profile FILE] --output QUERIES.json \
        --scenario prefill:64 --scenario decode:4x512 [...] [--one-layer-counts] \
        -- MODEL_DIR [text-generate options every scenario shares]

A scenario is opperf's (opperf.consumer.scenarios.parse_scenario_text): `prefill:T` runs `--num-queries 1
--query-length T`, `decode:BxC` runs `--num-queries B --query-length 1 --context-length C --decode`, each after the
shared options.
Each scenario's arguments are parsed by `msmodeling inference text-generate`'s own parser and run as its CLI runs
them (its preamble, `UserInputConfig.from_args`, a `ModelRunner` of its own, `run_inference` with
`generate_inputs`); what the scenarios share is the process: msmodeling's imports (most of its start-up) and the
device registry. Every op the runtime hands its performance model is recorded: the runtime wraps each model in a
`CachingPerformanceModel` that asks the model once per distinct op signature, so the recorder *is* such a cache
(the runtime then leaves it unwrapped) and counts every call before answering from the roofline model.

`--one-layer-counts` runs each scenario a second time at `--num-hidden-layers-override 1` and gives each call its
count there too (`count_one_layer`): with the layers identical, the calls per layer and so the calls of a step of
any depth follow (opperf.consumer.msmodeling_queries).

Output: {"msmodeling_args_common": [...], "device", "scenarios": [{"name", "msmodeling_args": [...], "calls":
[{"op", "args", "kwargs", "out", "view", "count"[, "count_one_layer"]}]}]}, calls in the order the runner first
issues them; tensors as {"shape", "dtype", "stride" (non-contiguous only), "values" (small integer tensors off
the meta device: seq_lens, query_lens, query start locations)}. It runs in msmodeling's environment and imports
nothing of opperf but its scenario parser (standard library and PyYAML, which msmodeling needs too).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import tempfile
from pathlib import Path

VALUES_UP_TO = 65536   # integer tensors up to this many elements keep their values (metadata, not activations)
# text-generate options a scenario sets: given among the shared options they would reach every scenario
# (`--decode` cannot be undone by a later scenario's arguments).
SCENARIO_OPTIONS = ("--num-queries", "--query-length", "--context-length", "--decode")


def scenario_arguments(text: str) -> list[str]:
    """msmodeling's text-generate arguments of an opperf scenario (`prefill:T`, `decode:BxC`)."""
    from opperf.consumer.scenarios import parse_scenario_text

    scenario = parse_scenario_text(text)
    if scenario.phase == "prefill":
        return ["--num-queries", "1", "--query-length", str(scenario.tokens)]
    return ["--num-queries", str(scenario.batch), "--query-length", "1", "--context-length", str(scenario.context),
            "--decode"]


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


def rebuild(value, torch, *, device: str = "meta", dtypes: dict | None = None):
    """`describe`'s inverse: tensors on `device` (with their recorded values, where they have them, on the cpu),
    dtypes renamed by `dtypes` (torch name → torch name); devices, layouts and memory formats as None."""
    dtypes = dtypes or {}
    if isinstance(value, dict) and "shape" in value and "dtype" in value:
        dtype = getattr(torch, dtypes.get(value["dtype"], value["dtype"]))
        if "values" in value:
            return torch.tensor(value["values"], dtype=dtype).reshape(value["shape"])
        if "stride" in value:
            return torch.empty_strided(value["shape"], value["stride"], dtype=dtype, device=device)
        return torch.empty(value["shape"], dtype=dtype, device=device)
    if isinstance(value, dict) and "dtype_value" in value:
        return getattr(torch, dtypes.get(value["dtype_value"], value["dtype_value"]))
    if isinstance(value, dict) and set(value) == {"repr"}:
        return None
    if isinstance(value, dict):
        return {key: rebuild(item, torch, device=device, dtypes=dtypes) for key, item in value.items()}
    if isinstance(value, list):
        return [rebuild(item, torch, device=device, dtypes=dtypes) for item in value]
    return value


def _prepare_as_cli(args, logger) -> None:
    """What `cli.inference.text_generate.main` does between parsing and building the runner."""
    from cli.utils import draft_method
    from tensor_cast import config
    from tensor_cast.core.compilation_config import apply_compilation_config

    if args.graph_log_url:
        config.compilation.debug.graph_log_url = args.graph_log_url
    apply_compilation_config(args.compilation_config)
    method = draft_method(args)
    if args.decode and method is not None:
        decode_query_len = int(getattr(args, "num_speculative_tokens", 0) or 0) + 1
        if decode_query_len >= 2 and int(args.query_length) != decode_query_len:
            logger.warning("draft decode sets --query-length to num_speculative_tokens+1 (%d); was %d",
                           decode_query_len, args.query_length)
            args.query_length = decode_query_len
    for plugin_path in args.fusion_plugin or ():
        from tensor_cast.plugins.loader import load_plugin
        from tensor_cast.plugins.validator import validate_plugin

        result = validate_plugin(plugin_path)
        if not result:
            raise SystemExit(f"--fusion-plugin {plugin_path}: validation failed at {result.layer}: {result.detail}")
        load_plugin(plugin_path)


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="msmodeling_record.py")
    parser.add_argument("msmodeling")
    parser.add_argument("--device-profile")
    parser.add_argument("--output", required=True)
    parser.add_argument("--scenario", action="append", required=True, dest="scenarios",
                        help="prefill:TOKENS or decode:BATCHxCONTEXT (repeat the option)")
    parser.add_argument("--one-layer-counts", action="store_true")
    own = parser.parse_args(argv[:split])
    common = argv[split + 1:]

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))     # opperf's scenario parser
    from opperf.errors import OpperfError

    shared = [option for option in common if option.split("=", 1)[0] in SCENARIO_OPTIONS]
    if shared:
        print(f"msmodeling_record.py: {shared[0]} is set by each --scenario, not among the shared options",
              file=sys.stderr)
        return 2
    if len(set(own.scenarios)) != len(own.scenarios):
        twice = next(s for s in own.scenarios if own.scenarios.count(s) > 1)
        print(f"msmodeling_record.py: --scenario {twice} is given twice", file=sys.stderr)
        return 2
    try:
        scenarios = [(text, [*common, *scenario_arguments(text)]) for text in own.scenarios]
    except OpperfError as exc:
        print(f"msmodeling_record.py: --scenario: {exc}", file=sys.stderr)
        return 2

    sys.path.insert(0, own.msmodeling)
    if own.device_profile:
        runpy.run_path(own.device_profile, run_name="opperf_device_profile")
    import logging

    import torch
    from cli.inference.text_generate import arg_parse
    from tensor_cast.core.input_generator import generate_inputs
    from tensor_cast.core.model_runner import ModelRunner
    from tensor_cast.core.user_config import UserInputConfig
    from tensor_cast.performance_model.analytic import AnalyticPerformanceModel
    from tensor_cast.performance_model.base import CachingPerformanceModel

    logger = logging.getLogger("msmodeling_record")

    class RecordingModel(CachingPerformanceModel):
        """Counts every op call, then answers as the runtime's own cache of a roofline model would."""

        def __init__(self, device_profile):
            super().__init__(AnalyticPerformanceModel(device_profile))
            self.calls: dict[str, dict] = {}

        def process_op(self, op_invoke_info):
            func = op_invoke_info.func
            call = {"op": str(func).removeprefix("torch.ops."),
                    "args": describe(list(op_invoke_info.args), torch),
                    "kwargs": describe(dict(op_invoke_info.kwargs or {}), torch),
                    "out": describe(op_invoke_info.out, torch)}
            key = json.dumps(call, sort_keys=True)
            view = bool(getattr(func, "is_view", False)) or func is torch.ops.aten._unsafe_view.default
            self.calls.setdefault(key, {**call, "view": view, "count": 0})["count"] += 1
            return super().process_op(op_invoke_info)

    def record(arguments: list[str]) -> tuple[object, dict[str, dict]]:
        args = arg_parse(arguments)            # msmodeling's own parser: its errors exit 2 with its message
        _prepare_as_cli(args, logger)
        user_input = UserInputConfig.from_args(args)
        runner = ModelRunner(user_input)
        recorder = RecordingModel(runner.device_profile)
        runner.perf_models = [recorder]
        runner.run_inference(generate_inputs_func=generate_inputs)
        return user_input, recorder.calls

    for _text, arguments in scenarios:         # every scenario's arguments parse before any runs
        arg_parse(arguments)
    results, device = [], None
    for text, arguments in scenarios:
        user_input, calls = record(arguments)
        device = user_input.device
        if own.one_layer_counts:
            _, one_layer = record([*arguments, "--num-hidden-layers-override", "1"])
            for key, call in calls.items():
                call["count_one_layer"] = one_layer[key]["count"] if key in one_layer else 0
        results.append({"name": text, "msmodeling_args": arguments, "calls": list(calls.values())})

    document = {"msmodeling_args_common": common, "device": device, "scenarios": results}
    directory = os.path.dirname(os.path.abspath(own.output))
    handle, temporary = tempfile.mkstemp(prefix=".record-", suffix=".json", dir=directory)
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        json.dump(document, out)
    os.replace(temporary, own.output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
