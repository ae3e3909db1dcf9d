#!/usr/bin/env python
"""Add model-derived theory rows to every kernel type's CSV of a database (stage 3, the shape grid)."""

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opperf.cli import add_logging_args, run_cli  # noqa: E402
from opperf.devices import DEFAULT_CATALOG, SEED_DEFAULT_DEVICE, load_catalog, resolve_device  # noqa: E402
from opperf.errors import OpperfError  # noqa: E402
from opperf.grid import load_grid_config, load_models, prepare_settings, run_grid  # noqa: E402
from opperf.grid.config import DEFAULT_GRID_CONFIG  # noqa: E402
from opperf.log import get_logger  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
log = get_logger("grid")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Append theory shape rows (source=generated, no performance values) to each kernel type's "
                    "CSV, from the patterns of --grid-config and the models of --target-models. Rows inherit "
                    "their kernel type's profiled metadata (OP State, Accelerator Core, dtypes, formats), never "
                    "duplicate an existing row signature, and are dropped when they would not fit --max-hbm-gb. "
                    "Each density axis meets msmodeling's standard (config/density_standard.yaml) up to the token "
                    "cap. The same inputs and --seed give byte-identical CSVs.",
        epilog="Where: --data-dir DIR (in place), or --input-dir PARSED --output-dir GRID (the workflow's form), "
               "or --device/--vllm-version/--torch-version/--cann-version (→ data/<device>/vllm_ascend/"
               "vllm<v>_torch<t>_cann<c>, in place). Example: %(prog)s --data-dir data/A3/vllm_ascend/"
               "vllm0.18.0_torch2.9.0_cann8.5 --target-models qwen3-32b,dsv3 --max-hbm-gb 64")
    where = parser.add_argument_group("database")
    where.add_argument("--data-dir", help="database directory to extend in place (holds kernel_types.txt)")
    where.add_argument("--input-dir", help="parse stage output directory (read only)")
    where.add_argument("--output-dir", help="directory to write (created complete, or replaced)")
    where.add_argument("--device", help=f"device key or full name from --devices (default: from the path, else "
                                        f"{SEED_DEFAULT_DEVICE}); sets the default --max-hbm-gb and token cap")
    where.add_argument("--vllm-version", help="with --torch-version/--cann-version: locate the database")
    where.add_argument("--torch-version")
    where.add_argument("--cann-version")
    where.add_argument("--database-root", default="data", help="root of data/<device>/... (default: %(default)s)")
    grid = parser.add_argument_group("grid")
    grid.add_argument("--target-models", default="",
                      help="comma-separated model names or aliases from --models (e.g. qwen3-32b,dsv3); GEMM (N, K) "
                           "pairs, attention and MoE layouts come from them over their tp_sizes/ep_sizes. Empty: "
                           "the generic grids of --grid-config")
    grid.add_argument("--rows", type=int, default=0,
                      help="most generated rows per CSV, reached by dropping whole buckets (sweeps and the buckets "
                           "fewest target-model configurations use first; the log names them), never by thinning "
                           "one (0 = no cap; default: %(default)s)")
    grid.add_argument("--seed", type=int, default=0,
                      help="orders buckets of equal use under --rows (default: %(default)s)")
    grid.add_argument("--max-hbm-gb", type=float, default=None,
                      help="device memory budget in GB (GiB) per row (default: the device's memory_gb)")
    grid.add_argument("--backend", choices=["cpu", "cuda", "npu"], default=None,
                      help="back end of the device (default: the device catalog's); picks the token and axis caps")
    grid.add_argument("--max-tokens", type=int, default=None,
                      help="cap on every token axis (M, elementwise and MoE tokens, attention lengths, pad; each "
                           "also stops at its standard range) (default: grid config's cap for the device's back end)")
    grid.add_argument("--grid-config", default=str(DEFAULT_GRID_CONFIG), help="patterns (default: config/grid.yaml)")
    grid.add_argument("--models", default=str(ROOT / "config" / "models.yaml"),
                      help="model configs (default: config/models.yaml)")
    grid.add_argument("--devices", default=str(DEFAULT_CATALOG), help="device catalog (default: config/devices.yaml)")
    grid.add_argument("--trace-dir", help="write GRID spec/result trace files per kernel type under this directory")
    consumer = parser.add_argument_group("the performance model's own queries")
    consumer.add_argument("--consumer-models", default="",
                          help="comma-separated models — names from --models (the reference decoder) or "
                               "transformers config.json paths (the model's own code, run on meta) — whose op "
                               "queries, as a dispatch-mode performance model (msmodeling's TensorCast) issues them, "
                               "each become a row, over --scenario-space (cpu/cuda back ends; rows the HBM budget "
                               "cannot hold are left out and counted)")
    consumer.add_argument("--consumer-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                          help="activation dtype of those queries (default: %(default)s)")
    consumer.add_argument("--scenarios", default=None,
                          help="scenario spaces YAML of --consumer-models (default: config/scenarios.yaml)")
    consumer.add_argument("--scenario-space", default="default",
                          help="which space of --scenarios: prefill token counts, decode batches x contexts, TP "
                               "sizes (default: %(default)s)")
    consumer.add_argument("--num-layers", type=int, default=None,
                          help="depth of a transformers config's steps (default: the config's own; the call counts "
                               "only, the rows are the same)")
    consumer.add_argument("--consumer-recorder", default="auto", choices=["auto", "msmodeling", "transformers"],
                          help="who records the queries of config.json models: msmodeling's own runner "
                               "(tensor_cast.attention and reshape_and_cache as it issues them; bfloat16 rows), "
                               "opperf's transformers recorder, or auto: msmodeling where --msmodeling finds a "
                               "checkout whose Python imports its runner and --consumer-dtype is bfloat16. "
                               "config/models.yaml names are always opperf's (default: %(default)s)")
    consumer.add_argument("--msmodeling", default=None,
                          help="msmodeling's checkout (default: $OPPERF_MSMODELING_DIR, else ../shared/msmodeling; "
                               "its Python: $OPPERF_MSMODELING_PYTHON, else this one)")
    consumer.add_argument("--queries-only", action="store_true",
                          help="add only the rows of --consumer-models' queries, none from grid.yaml's patterns: "
                               "no row that no query needs")
    add_logging_args(parser)
    return parser


def _directories(args: argparse.Namespace) -> tuple[Path, Path]:
    if args.data_dir:
        if args.input_dir or args.output_dir:
            raise OpperfError("give --data-dir, or --input-dir with --output-dir, not both", field="--data-dir")
        return Path(args.data_dir), Path(args.data_dir)
    if args.input_dir or args.output_dir:
        if not (args.input_dir and args.output_dir):
            raise OpperfError("--input-dir and --output-dir go together", field="--input-dir")
        return Path(args.input_dir), Path(args.output_dir)
    if not (args.vllm_version or args.torch_version or args.cann_version):
        raise OpperfError("say which database: --data-dir, --input-dir/--output-dir, or --device with "
                          "--vllm-version/--torch-version/--cann-version", field="--data-dir")
    from opperf.parse.stage import database_path_for

    directory = database_path_for(args.device or SEED_DEFAULT_DEVICE, args.vllm_version, args.torch_version,
                                  args.cann_version, args.database_root, catalog=load_catalog(args.devices))
    return directory, directory


def _device(args: argparse.Namespace, input_dir: Path):
    catalog = load_catalog(args.devices)
    if args.device:
        return resolve_device(args.device, catalog)
    for candidate in (input_dir.parent.parent.parent.name, input_dir.parent.parent.name):
        if candidate in catalog:      # results/{device}/{stack}/{version}/parsed or data/{device}/{stack}/{version}
            return catalog[candidate]
    return resolve_device(SEED_DEFAULT_DEVICE, catalog)


def _device_budget_backend(args: argparse.Namespace, input_dir: Path) -> tuple[str, float, str]:
    """(device name, HBM budget in GB, back end): from the flags, the catalog filling in what they leave out."""
    if args.max_hbm_gb is not None and args.backend:
        return args.device or "", args.max_hbm_gb, args.backend
    device = _device(args, input_dir)
    return (device.name, args.max_hbm_gb if args.max_hbm_gb is not None else device.memory_gb,
            args.backend or device.backend)


def _with_consumer_rows(settings, args: argparse.Namespace, backend: str, input_dir: Path):
    """The settings with the rows of the consumer's queries for --consumer-models, recorded by msmodeling's runner
    or opperf's (--consumer-recorder), and the record of who recorded them (consumer_queries.json)."""
    from opperf.consumer.recorder import (MSMODELING, TRANSFORMERS, choose_recorder, consumer_record,
                                          record_msmodeling_rows)
    from opperf.grid.queries import ACCELERATOR_CORE_BY_BACKEND, QueryRows, query_rows, record_consumer_queries
    from opperf.model_names import check_distinct_names, model_reference

    names = [m.strip() for m in args.consumer_models.split(",") if m.strip()]
    check_distinct_names([model_reference(model, args.models) for model in names], field="--consumer-models")
    choice = choose_recorder(args.consumer_recorder, names, args.models, args.consumer_dtype, args.msmodeling)
    log.info("%s", choice.describe())
    core = ACCELERATOR_CORE_BY_BACKEND.get(backend)
    rows = QueryRows()
    for model in choice.models(MSMODELING):
        try:
            recorded = record_msmodeling_rows(choice.install, [model], args.models, scenarios=args.scenarios,
                                              space=args.scenario_space, device=_device(args, input_dir),
                                              accelerator_core=core, estimator=settings.estimator,
                                              layers=args.num_layers or 2)
        except OpperfError as exc:
            if args.consumer_recorder != "auto":
                raise
            # msmodeling's runner does not build every architecture (docs/msmodeling.md): auto falls back per model.
            log.warning("auto: msmodeling's runner does not build %s (%s); opperf's transformers recorder records it",
                        model, exc.reason.strip().splitlines()[-1])
            choice.by_model[model] = TRANSFORMERS
            continue
        recorded.recorder = MSMODELING
        rows = rows.merged(recorded) if rows.recorder else recorded
    if choice.models(TRANSFORMERS):
        recorded = record_consumer_queries(args.models, choice.models(TRANSFORMERS), backend, args.consumer_dtype,
                                           args.scenarios, args.scenario_space, args.num_layers)
        opperfs = query_rows(recorded, core, settings.estimator)
        opperfs.recorder = TRANSFORMERS
        rows = rows.merged(opperfs) if rows.recorder else opperfs
    record = consumer_record(choice, args.models, args.scenario_space)
    settings.settings_text.update(consumer_models=names, consumer_dtype=args.consumer_dtype,
                                  scenario_space=args.scenario_space, queries_only=args.queries_only,
                                  consumer_recorded_by=record["recorded_by"])
    return dataclasses.replace(settings, consumer_rows=rows, patterns=not args.queries_only, consumer_record=record)


def main(args: argparse.Namespace) -> int:
    input_dir, output_dir = _directories(args)
    device_name, max_hbm_gb, backend = _device_budget_backend(args, input_dir)
    grid_config = load_grid_config(args.grid_config)
    settings = prepare_settings(
        grid_config=grid_config, models=load_models(args.models),
        target_models=[m.strip() for m in args.target_models.split(",") if m.strip()],
        rows=args.rows, seed=args.seed, max_hbm_gb=max_hbm_gb, max_tokens=args.max_tokens, backend=backend,
        models_path=args.models)
    settings.settings_text["device"] = device_name
    if args.consumer_models.strip():
        settings = _with_consumer_rows(settings, args, backend, input_dir)
    elif args.queries_only:
        raise OpperfError("--queries-only needs --consumer-models (whose queries the rows are)",
                          field="--queries-only")
    run_grid(input_dir, output_dir, settings, trace_dir=args.trace_dir)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(build_parser(), main))
