#!/usr/bin/env python
"""Profile the reference decoder, or a transformers model from its config.json, on a back end (stage 1); writes a
raw profile directory."""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opperf.cli import add_logging_args, positive_int, run_cli  # noqa: E402
from opperf.versions import check_stack_matches  # noqa: E402
from opperf.workload.model import load_model_dims  # noqa: E402
from opperf.workload.profile import (DTYPES, EXPERTS_IMPLEMENTATIONS, KV_CACHES, WorkloadPlan,  # noqa: E402
                                    profile_workload)
from opperf.workload.routing import ROUTINGS  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Run a Llama-style reference decoder (random weights, dims from --models), or any HuggingFace "
                    "transformers causal LM from its config.json (--transformers-config; random weights, nothing "
                    "downloaded; needs pip install -e '.[transformers]'), under the back end's profiler: prefill "
                    "at each --prefill-lengths, then --decode-steps decode steps over a written KV cache. cpu/cuda write "
                    "OUTPUT/trace.json (torch.profiler Chrome trace, record_shapes); npu writes the "
                    "torch_npu.profiler bundle with kernel_details.csv.")
    parser.add_argument("--backend", choices=["cpu", "cuda", "npu"], default="cpu",
                        help="where the workload runs and which profiler records it: cpu and cuda torch.profiler, "
                             "npu torch_npu.profiler (default: %(default)s)")
    parser.add_argument("--models", default="config/models.yaml", help="model config file (default: %(default)s)")
    parser.add_argument("--model", default="opperf-tiny",
                        help="model name or alias in --models, any case or punctuation (default: %(default)s)")
    parser.add_argument("--transformers-config", metavar="CONFIG_JSON",
                        help="a transformers config.json (or its directory): profile that model instead of the "
                             "reference decoder (--models/--model are then not used)")
    parser.add_argument("--kv-cache", choices=KV_CACHES, default="dynamic",
                        help="with --transformers-config: 'dynamic' runs the model's own attention and "
                             "transformers' cache; 'paged' a paged KV cache (128-token blocks) written and read by "
                             "opperf's replay of tensor_cast.reshape_and_cache / tensor_cast.attention, the step "
                             "msmodeling's runner predicts (default: %(default)s)")
    parser.add_argument("--experts-implementation", choices=EXPERTS_IMPLEMENTATIONS, default=None,
                        help="with --transformers-config, a MoE model's experts: transformers' grouped_mm (its "
                             "choice where torch runs it), batched_mm or eager (a loop over the experts that get "
                             "tokens), or tensor_cast (msmodeling's MoE layer's graph: three GEMMs per expert, the "
                             "step its runner predicts) (default: transformers' choice)")
    parser.add_argument("--routing", choices=ROUTINGS, default="model",
                        help="with --transformers-config, a MoE model's expert ids: its router's ('model'; a model "
                             "built from its config routes every token to the same experts) or 'balanced' (each "
                             "expert an even share, as msmodeling's MoE layer assumes) (default: %(default)s)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32",
                        help="dtype of the weights and activations (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=1, help="prefill batch size (default: %(default)s)")
    parser.add_argument("--decode-batch-sizes", type=int, nargs="+",
                        help="decode at each of these batch sizes, each over its own KV cache (default: --batch-size)")
    parser.add_argument("--num-layers", type=int,
                        help="decoder layers to build (default: the model's own; a few measure the same kernels)")
    parser.add_argument("--prefill-lengths", type=int, nargs="+", default=[16, 64],
                        help="prompt lengths in tokens, one prefill pass each (default: 16 64)")
    parser.add_argument("--decode-steps", type=int, default=4,
                        help="decode steps (one token each) over a KV cache holding --decode-context tokens; 0 = "
                             "prefill only (default: %(default)s)")
    parser.add_argument("--decode-context", type=int, default=64,
                        help="tokens in each decode batch's KV cache, written before the profile: no prefill of "
                             "the context is in it (docs/design.md, stage 1) (default: %(default)s)")
    parser.add_argument("--profile-iterations", type=positive_int, default=1,
                        help="run the whole workload this many times under the profiler: every row's profiled time "
                             "becomes a mean over that many times its calls, a steadier ground truth for the small "
                             "kernels (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the random weights and token ids: the same seed profiles the same inputs "
                             "(default: %(default)s)")
    parser.add_argument("--version-dir",
                        help="the database version directory this profile is for (torch2.13.0_cpu, "
                             "torch2.13.0_cuda13.0, …): refuse to profile if this host's torch/CUDA/CANN differ")
    parser.add_argument("--output", required=True, help="profile directory to create (replaced atomically)")
    add_logging_args(parser)
    return parser


def main(args: argparse.Namespace) -> int:
    if args.version_dir:
        check_stack_matches(args.version_dir, args.backend)
    config = None
    if args.transformers_config:
        from opperf.workload.transformers_model import read_config

        dims, config = None, read_config(args.transformers_config, num_layers=args.num_layers)
    else:
        dims = load_model_dims(args.models, args.model, num_layers=args.num_layers)
    plan = WorkloadPlan(batch_size=args.batch_size, prefill_lengths=tuple(args.prefill_lengths),
                        decode_steps=args.decode_steps, decode_context=args.decode_context, seed=args.seed,
                        profile_iterations=args.profile_iterations,
                        decode_batch_sizes=tuple(args.decode_batch_sizes or ()))
    profile_workload(dims, plan, args.backend, args.dtype, args.output, transformers_config=config,
                     config_path=args.transformers_config or "", kv_cache=args.kv_cache,
                     experts=args.experts_implementation, routing=args.routing)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(build_parser(), main))
