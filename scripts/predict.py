#!/usr/bin/env python
"""Predict one step of a model at scenarios nobody profiled, from a database: per scenario the device time, per
kernel type, and how each query was answered (EXACT, INTERPOLATED, ILLEGAL, MISS -> roofline)."""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opperf.cli import add_logging_args, positive_int, run_cli  # noqa: E402
from opperf.errors import OpperfError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Record the op queries of one forward step of a model (a transformers config.json run on meta "
                    "tensors, or a config/models.yaml entry), as msmodeling's TensorCast records a model run, for "
                    "each --scenario; answer each from --database as msmodeling's runtime does (opperf's model of "
                    "it), or let msmodeling's own runner predict the step (--runner); print the predicted device "
                    "time of the step, "
                    "its share answered EXACT / INTERPOLATED / ILLEGAL / MISS (roofline) and its largest kernel "
                    "types.",
        epilog="Example: %(prog)s --database data/H200/torch/torch2.11.0_cuda13.0 --transformers-config "
               "my_model/config.json --scenario prefill:1536 --scenario decode:16x1024 --json prediction.json")
    parser.add_argument("--database", required=True, help="database directory (holds op_mapping.yaml)")
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--transformers-config", metavar="CONFIG_JSON", help="a transformers config.json (or its "
                       "directory); random weights on meta, nothing downloaded")
    model.add_argument("--model", action="append", help="a model name or alias of --models (the reference "
                       "decoder); repeat for several")
    parser.add_argument("--models", default=str(ROOT / "config" / "models.yaml"),
                        help="model configs (default: config/models.yaml)")
    parser.add_argument("--scenario", action="append", required=True, metavar="SCENARIO",
                        help="prefill:TOKENS (batch 1) or decode:BATCHxCONTEXT (CONTEXT tokens in the KV cache); "
                             "repeat for several")
    parser.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel size: one rank's share of the "
                        "heads, intermediate widths and vocabulary (default: %(default)s)")
    parser.add_argument("--num-layers", type=positive_int, default=None,
                        help="decoder layers of the step (default: the model's own)")
    parser.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                        help="the model's dtype, its queries recorded in it (default: the database's, op_mapping.yaml "
                             "opperf.dtype; needed where the database holds several; a dtype the database holds no "
                             "rows of is refused)")
    parser.add_argument("--attention", choices=["cpu", "cuda", "math"], default=None,
                        help="the kernel scaled_dot_product_attention dispatches to (default: the database's back "
                             "end)")
    parser.add_argument("--runner", choices=["auto", "msmodeling", "opperf"], default="auto",
                        help="who predicts: msmodeling's own runner (its text-generate on the database, through "
                             "opperf's launcher: its step time and hit/miss account), opperf's model of its runtime, "
                             "or auto: msmodeling's runner where a checkout is found and the database's queries "
                             "were recorded by it, else opperf's model (default: %(default)s; docs/msmodeling.md, "
                             "\"Predictions\")")
    parser.add_argument("--msmodeling", default=None,
                        help="msmodeling's checkout (default: $OPPERF_MSMODELING_DIR, else ../shared/msmodeling; its "
                             "Python: $OPPERF_MSMODELING_PYTHON)")
    parser.add_argument("--json", help="write the predictions here: {scenarios: [{name, predicted_us, "
                                       "status_time_share, by_kernel_type, queries}]}")
    parser.add_argument("--markdown", help="write the predictions here as a page (the workflow's report shows it)")
    parser.add_argument("--top", type=int, default=6, help="kernel types listed per scenario (default: %(default)s)")
    add_logging_args(parser)
    return parser


def main(args: argparse.Namespace) -> int:
    from opperf.consumer.msmodeling_predict import choose_runner
    from opperf.consumer.scenarios import parse_scenario_option
    from opperf.model_names import model_reference

    database = Path(args.database)
    if not (database / "op_mapping.yaml").is_file():
        raise OpperfError("not a database directory (no op_mapping.yaml)", path=database)
    for text in args.scenario:
        parse_scenario_option(text)                  # every scenario read before any model is built
    names = [args.transformers_config] if args.transformers_config else args.model
    references = [model_reference(name, args.models, field="--model") for name in names]
    runner = choose_runner(args.runner, args.msmodeling, database, references, args.dtype)
    if runner.install is not None:
        return predict_with_msmodeling(args, database, references, runner)
    return predict_with_opperf(args, database, runner.said)


def predict_with_msmodeling(args: argparse.Namespace, database: Path, references, runner) -> int:
    """Each model's steps as msmodeling's own runner predicts them from the database, one text-generate per
    scenario (opperf.consumer.msmodeling_predict)."""
    from opperf.consumer.msmodeling_predict import runner_predictions, runner_table
    from opperf.io import write_text_atomic
    from opperf.log import get_logger

    log = get_logger("predict")
    print(runner.said)
    documents, pages = [], []
    for reference in references:
        predictions = runner_predictions(
            runner.install, database, reference.config_path, args.scenario, num_layers=args.num_layers, tp=args.tp,
            progress=lambda p, name=reference.name: log.info("%s %s: %.1f µs, m1 %d/%d", name, p.scenario,
                                                             p.predicted_us, p.m1_hit, p.m1_total))
        print(f"{reference.name} from {database} (msmodeling's runner; m1: the ops its database answered of those it "
              "asked; a MISS is priced at its roofline)")
        table = runner_table(predictions, args.top)
        print(table)
        pages.append(f"## {reference.name}\n\n```\n{table}\n```\n")
        documents += [{"model": reference.name, **p.as_json()} for p in predictions]
    answered_by = f"msmodeling's runner ({runner.install.commit or 'commit unknown'})"
    if args.json:
        models = [d["model"] for d in documents]
        document = {"database": str(database), "model": models[0] if len(set(models)) == 1 else sorted(set(models)),
                    "answered_by": answered_by, "runner": "msmodeling", "why": runner.reason,
                    "msmodeling_commit": runner.install.commit, "tp": args.tp, "scenarios": documents}
        write_text_atomic(args.json, json.dumps(document, indent=1) + "\n")
    if args.markdown:
        write_text_atomic(args.markdown, f"# Predicted steps from {database}\n\nPredicted by {answered_by}: its "
                          f"text-generate on the database (TP {args.tp}), its step time and its own account of the ops "
                          "it asked (m1) and the share of the step answered from the database; a MISS is priced at "
                          "its roofline (docs/msmodeling.md, \"Predictions\").\n\n" + "\n".join(pages))
    return 0


def predict_with_opperf(args: argparse.Namespace, database: Path, said: str) -> int:
    import torch

    from opperf.consumer.model_queries import model_source, parse_scenario, position_limit_warning, scenario_tp_sizes
    from opperf.consumer.predict import predict, prediction_dtype, prediction_table
    from opperf.consumer.runtime import load_op_mapping
    from opperf.io import write_text_atomic
    from opperf.log import get_logger

    backend = (load_op_mapping(database).get("opperf") or {}).get("backend", "cuda")
    attention = args.attention or ("cpu" if backend == "cpu" else "cuda")
    answerer = "opperf's model of msmodeling's runtime"
    dtype = prediction_dtype(database, args.dtype)
    print(dtype.said)
    print(said)
    documents, pages = [], []
    for name in ([args.transformers_config] if args.transformers_config else args.model):
        source = model_source(name, args.models, num_layers=args.num_layers)
        if args.tp > 1:                             # a TP size the model does not split by is one line, not a trace
            _, left_out = scenario_tp_sizes(source, [args.tp], dtype=getattr(torch, dtype.name), attention=attention)
            if args.tp in left_out:
                raise OpperfError(f"model {source.name!r}: {left_out[args.tp]}", field="--tp")
        scenarios = [parse_scenario(text, source.name, args.tp) for text in args.scenario]
        for scenario in scenarios:
            warning = position_limit_warning(scenario, source.max_positions)
            if warning:
                get_logger("predict").warning("%s: %s", source.name, warning)
        predictions = predict(database, source, scenarios, dtype=getattr(torch, dtype.name), attention=attention)
        print(f"{source.name} from {database} (answered by {answerer}; MISS = the device's roofline)")
        table = prediction_table(predictions, args.top)
        print(table)
        pages.append(f"## {source.name}\n\n```\n{table}\n```\n")
        documents += [{"model": source.name, **p.as_json(rows=True)} for p in predictions]
    if args.json:
        models = [d["model"] for d in documents]
        document = {"database": str(database), "model": models[0] if len(set(models)) == 1 else sorted(set(models)),
                    "answered_by": answerer, "tp": args.tp, "dtype": dtype.name, "scenarios": documents}
        write_text_atomic(args.json, json.dumps(document, indent=1) + "\n")
    if args.markdown:
        write_text_atomic(args.markdown, f"# Predicted steps from {database}\n\nAnswered by {answerer}, {dtype.name}, "
                          f"TP {args.tp}; MISS is priced at the device's roofline. Per scenario: the step's predicted "
                          "device time (Σ answer × calls), the share of it answered EXACT / INTERPOLATED / ILLEGAL / "
                          "MISS, then its largest kernel types (docs/grid.md, \"A prediction\").\n\n"
                          + "\n".join(pages))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(build_parser(), main))
