#!/usr/bin/env python
"""Check a database the way its consumer (msmodeling's runtime) will use it: findable, unique, dense, interpolable.

  python scripts/check_database.py data/CPU/torch/torch2.13.0_cpu
  python scripts/check_database.py data/H100/torch/torch2.11.0_cuda13.0 --json check.json --markdown check.md

Per kernel type: rows (and rows kept in layouts/), rows with a duration, rows the runtime's lookup answers
with themselves, duplicate runtime keys, density per axis against config/density_standard.yaml, and the
holdout interpolation error (each interior replayed row predicted from its neighbours by the runtime's rule).
Exit 0 when every row with a duration is findable and no runtime key repeats, 1 otherwise, 2 on bad input.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opperf.cli import add_logging_args, run_cli  # noqa: E402
from opperf.database.report import check_database, write_reports  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("database", help="a database directory: data/{device}/{stack}/{version_dir}")
    parser.add_argument("--density-standard", default="config/density_standard.yaml",
                        help="the axis density standard (default: %(default)s)")
    density = parser.add_argument_group("density (the grid's axes against the standard)")
    density.add_argument("--target-models", default=None,
                         help="comma-separated models the database's grid was generated for: checks each axis "
                              "point set of that grid on the replayed rows (default: density not checked)")
    density.add_argument("--grid-config", default="config/grid.yaml", help="grid patterns (default: %(default)s)")
    density.add_argument("--models", default="config/models.yaml", help="model configs (default: %(default)s)")
    density.add_argument("--max-tokens", type=int, default=None,
                         help="the grid's token cap (default: grid.yaml's for the database's back end)")
    density.add_argument("--require-density", action="store_true",
                         help="fail (exit 1) when an axis is below the standard, not only report it")
    consumer = parser.add_argument_group("the consumer's queries, end to end")
    consumer.add_argument("--consumer-models", default=None,
                          help="comma-separated models (names of --models or transformers config.json paths) whose "
                               "queries over --scenario-space the runtime must answer exactly or by legal "
                               "interpolation; any that would fall back to roofline fails the check")
    consumer.add_argument("--consumer-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                          help="activation dtype of those queries (default: %(default)s)")
    consumer.add_argument("--scenarios", default=None,
                          help="scenario spaces YAML (default: config/scenarios.yaml)")
    consumer.add_argument("--scenario-space", default="default",
                          help="the space of config/scenarios.yaml the queries are recorded over (default: "
                               "%(default)s: TP 1/4/8, prefill 1..8k, decode batch 1..64)")
    consumer.add_argument("--consumer-recorder", default="auto", choices=["auto", "msmodeling", "transformers"],
                          help="who records the queries of config.json models: msmodeling's own runner (then "
                               "msmodeling's own data sources answer them), opperf's transformers recorder (opperf's "
                               "model of the runtime answers), or auto: the recorder op_mapping.yaml records for the "
                               "model (opperf.consumer_queries), else transformers (default: %(default)s)")
    consumer.add_argument("--msmodeling", default=None,
                          help="msmodeling's checkout (default: $OPPERF_MSMODELING_DIR, else ../shared/msmodeling)")
    consumer.add_argument("--devices", default=None,
                          help="device catalog msmodeling records on (the database's device; default: "
                               "config/devices.yaml)")
    parser.add_argument("--json", help="write the full result as JSON here")
    parser.add_argument("--markdown", help="write the per-kernel-type table as markdown here")
    add_logging_args(parser)
    return parser


def _names(text: str | None) -> list[str]:
    return [name.strip() for name in (text or "").split(",") if name.strip()]


def _backend(database: str) -> str:
    from opperf.consumer.runtime import load_op_mapping

    return (load_op_mapping(database).get("opperf") or {}).get("backend", "cpu")


def _density_settings(args: argparse.Namespace):
    from opperf.grid import load_grid_config, load_models, prepare_settings

    return prepare_settings(grid_config=load_grid_config(args.grid_config), models=load_models(args.models),
                            target_models=_names(args.target_models), rows=0, seed=0, max_hbm_gb=1e9,
                            max_tokens=args.max_tokens, backend=_backend(args.database), models_path=args.models)


def _consumer_gates(args: argparse.Namespace):
    """(opperf's recorded queries for its gate or None, msmodeling's gate or None): each model by its recorder."""
    from opperf.consumer.recorder import MSMODELING, recorders_for

    names = _names(args.consumer_models)
    by_model, install = recorders_for(args.consumer_recorder, names, args.models, args.database, args.msmodeling,
                                      args.consumer_dtype)
    ours = [m for m in names if by_model[m] != MSMODELING]
    queries = None
    if ours:
        from opperf.grid.queries import record_consumer_queries

        queries = record_consumer_queries(args.models, ours, _backend(args.database), args.consumer_dtype,
                                          args.scenarios, args.scenario_space)
    theirs = [m for m in names if by_model[m] == MSMODELING]
    if not theirs:
        return queries, None
    from opperf.consumer.msmodeling_gate import database_gate

    return queries, database_gate(install, args.database, theirs, args.models, scenarios=args.scenarios,
                                  space=args.scenario_space, devices=args.devices)


def main(args: argparse.Namespace) -> int:
    queries, gate = _consumer_gates(args) if args.consumer_models else (None, None)
    result = check_database(args.database, density_standard=args.density_standard,
                            density_settings=_density_settings(args) if args.target_models is not None else None,
                            consumer_queries=queries, require_density=args.require_density)
    if gate is not None:
        from opperf.consumer.msmodeling_gate import add_gate

        add_gate(result, gate)
    print(result["table"])
    write_reports(result, json_path=args.json, markdown_path=args.markdown)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(run_cli(build_parser(), main))
