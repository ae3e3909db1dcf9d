"""Run the reference decoder (or a transformers model from its config) under the back end's profiler and leave a
raw profile for the parse stage.

cpu/cuda: torch.profiler with record_shapes, exported as a Chrome trace (`trace.json`), and beside it the input
values a trace cannot hold (MoE splits, masks, distinct indices: `input_values.json`, opperf.input_values),
recorded in the first warm-up.
npu: torch_npu.profiler, whose output directory holds `kernel_details.csv` (the format real
vLLM-Ascend profiles come in), parsed exactly like a user's profile.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from opperf.errors import DeviceUnavailableError, OpperfError
from opperf.input_values import INPUT_VALUES
from opperf.contract import EXECUTION_TRACE, WORKLOAD_MANIFEST
from opperf.io import staged_directory
from opperf.log import PROFILER_NOISE, get_logger, span, stderr_without
from opperf.workload.routing import ROUTINGS, balance_routing
from opperf.workload.model import DecoderDims, ReferenceDecoder, WrittenCache
from opperf.workload.values import ValueRecorder

log = get_logger("workload")

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
KV_CACHES = ("dynamic", "paged")     # a transformers model's own cache and attention, or the paged step's
# experts_implementation values a MoE model may be profiled with: transformers' own (transformers.integrations.moe)
# and msmodeling's graph (opperf.workload.tensor_cast_experts).
EXPERTS_IMPLEMENTATIONS = ("eager", "grouped_mm", "batched_mm", "tensor_cast")
CHROME_TRACE_NAME = "trace.json"
PLAIN_PASSES = 2             # un-profiled passes timed before the profile (after one more, untimed, that settles
                             # the allocator and caches): the overhead guard's reference and its noise
OVERHEAD_NOISE_FACTOR = 2    # a profiled pass beyond 1 + max(2 x the plain passes' spread, 5 %) is called inflated
OVERHEAD_MIN_FLOOR = 0.05


@dataclass(frozen=True)
class WorkloadPlan:
    """What to run: prefill at each length (batch `batch_size`), then, per decode batch size, `decode_steps`
    decode steps over a KV cache holding `decode_context` tokens (written before the profile, not computed:
    written_decode_caches); the whole sequence `profile_iterations` times under the profiler, so each row's profiled
    time is a mean over that many times its calls (one pass gives a 2 µs kernel one or two samples, whose
    state-to-state scatter becomes the ground truth)."""
    batch_size: int = 1
    prefill_lengths: tuple[int, ...] = (16, 64)
    decode_steps: int = 4
    decode_context: int = 64
    warmup_iterations: int = 1
    profile_iterations: int = 1
    seed: int = 0
    decode_batch_sizes: tuple[int, ...] = ()      # () = (batch_size,)

    @property
    def decode_batches(self) -> tuple[int, ...]:
        return self.decode_batch_sizes or (self.batch_size,)

    @property
    def max_positions(self) -> int:
        return max([*self.prefill_lengths, self.decode_context + self.decode_steps])


def torch_device_for(backend: str) -> str:
    """The torch device string of a back end, or a clear error when its hardware is absent."""
    if backend == "cpu":
        return "cpu"
    if backend == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailableError("back end 'cuda' asked for, but torch sees no CUDA device "
                                         f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})")
        return "cuda"
    if backend == "npu":
        try:
            import torch_npu  # noqa: F401  (registers the npu device)
        except ImportError as exc:
            raise DeviceUnavailableError("back end 'npu' asked for, but torch_npu is not installed "
                                         "(install the torch_npu matching your CANN on an Ascend host)") from exc
        if not torch.npu.is_available():
            raise DeviceUnavailableError("back end 'npu' asked for, but no Ascend NPU is visible "
                                         "(check npu-smi info and ASCEND_RT_VISIBLE_DEVICES)")
        return "npu"
    raise OpperfError(f"unknown back end {backend!r} (expected cpu, cuda or npu)")


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "npu":
        torch.npu.synchronize()


def make_token_ids(plan: WorkloadPlan, vocab: int, device: str) -> dict[str, torch.Tensor]:
    """All token ids of a run, made before profiling so the RNG ops stay out of the profile."""
    generator = torch.Generator(device="cpu").manual_seed(plan.seed)
    ids = {f"prefill_{n}": torch.randint(0, vocab, (plan.batch_size, n), generator=generator)
           for n in plan.prefill_lengths}
    if plan.decode_steps:
        for batch in plan.decode_batches:
            for step in range(plan.decode_steps):
                ids[f"decode_b{batch}_{step}"] = torch.randint(0, vocab, (batch, 1), generator=generator)
    return {name: tensor.to(device) for name, tensor in ids.items()}


DECODE_STEPS_ALONE = ("the profile's decode steps are the steps alone, one token per sequence over a KV cache "
                      "holding decode_context tokens; no prefill of the context is in the profile")


def written_decode_caches(model, plan: WorkloadPlan, device: str) -> dict[int, WrittenCache]:
    """Each decode batch's KV cache holding `plan.decode_context` tokens, written once, before any pass (the
    model's `written_cache`): a prefill of the context, whose eager attention holds [batch, heads, context,
    context] scores, would not fit where the decode step does, and its kernels are no part of a decode step. The
    caches of every decode batch are held together through the profile."""
    if not plan.decode_steps:
        return {}
    generator = torch.Generator(device=device).manual_seed(plan.seed)
    return {batch: model.written_cache(batch, plan.decode_context, generator) for batch in plan.decode_batches}


def decode_cache_note(decode_caches: dict[int, WrittenCache]) -> dict:
    """workload.json's `decode_cache`: what the decode steps contain and how their KV caches were made (per
    decode batch where the batches' differ); {} without decode steps."""
    if not decode_caches:
        return {}
    hows = {written.how for written in decode_caches.values()}
    cache = hows.pop() if len(hows) == 1 else {str(batch): w.how for batch, w in decode_caches.items()}
    return {"decode_cache": {"steps": DECODE_STEPS_ALONE, "cache": cache}}


def run_workload(model, plan: WorkloadPlan, token_ids: dict[str, torch.Tensor], device: str,
                 decode_caches: dict[int, WrittenCache]) -> list[str]:
    """Prefill at every length, then decode steps over each batch's written KV cache; returns the step labels it
    ran."""
    labels = []
    for length in plan.prefill_lengths:
        with torch.profiler.record_function(f"prefill_{length}"):
            model.forward(token_ids[f"prefill_{length}"], 0, model.new_cache())
        labels.append(f"prefill_{length}")
    if plan.decode_steps:
        for batch in plan.decode_batches:
            with decode_caches[batch].decoding() as cache:
                for step in range(plan.decode_steps):
                    label = (f"decode_{step}" if plan.decode_batches == (plan.batch_size,)
                             else f"decode_b{batch}_{step}")
                    with torch.profiler.record_function(label):
                        _, cache = model.forward(token_ids[f"decode_b{batch}_{step}"], plan.decode_context + step,
                                                 cache)
                    labels.append(label)
                del cache
    _synchronize(device)
    return labels


def profiled_iterations(model, plan: WorkloadPlan, token_ids: dict[str, torch.Tensor], device: str,
                        decode_caches: dict[int, WrittenCache]) -> list[str]:
    """The workload `plan.profile_iterations` times (inside the profiler); returns each pass's step labels."""
    labels = []
    for _ in range(plan.profile_iterations):
        labels += run_workload(model, plan, token_ids, device, decode_caches)
    return labels


def profile_workload(dims: DecoderDims | None, plan: WorkloadPlan, backend: str, dtype: str,
                     output_dir: str | Path, *, transformers_config: dict | None = None,
                     config_path: str | Path = "", kv_cache: str = "dynamic", experts: str | None = None,
                     routing: str = "model") -> Path:
    """Profile the workload; the complete profile directory appears at `output_dir` (atomically).

    The model is the reference decoder of `dims`, or, given `transformers_config` (a config.json's dict), that
    transformers model with random weights (opperf.workload.transformers_model): with `kv_cache` "dynamic" its own
    attention and cache, with "paged" msmodeling's paged KV cache and opperf's paged kernels
    (opperf.workload.paged_step); `experts` its experts_implementation where not transformers' choice; `routing`
    "balanced" gives a MoE model's experts even shares of the tokens (opperf.workload.routing)."""
    if dtype not in DTYPES:
        raise OpperfError(f"unknown dtype {dtype!r} (expected one of {', '.join(DTYPES)})")
    if kv_cache not in KV_CACHES:
        raise OpperfError(f"unknown KV cache {kv_cache!r} (expected one of {', '.join(KV_CACHES)})",
                          field="--kv-cache")
    if routing not in ROUTINGS:
        raise OpperfError(f"unknown routing {routing!r} (expected one of {', '.join(ROUTINGS)})", field="--routing")
    if (experts is not None or routing != "model") and transformers_config is None:
        raise OpperfError("an experts implementation or routing is a transformers model's: give "
                          "--transformers-config", field="--experts-implementation" if experts else "--routing")
    if kv_cache == "paged" and transformers_config is None:
        raise OpperfError("a paged KV cache is for a transformers model: give --transformers-config",
                          field="--kv-cache")
    device = torch_device_for(backend)
    output_dir = Path(output_dir)
    if transformers_config is not None and kv_cache == "paged":
        from opperf.workload.paged_step import PagedTransformersCausalLM

        model = PagedTransformersCausalLM(transformers_config, device, DTYPES[dtype], seed=plan.seed,
                                          path=config_path, prefill_batch=plan.batch_size,
                                          prefill_lengths=plan.prefill_lengths, decode_steps=plan.decode_steps,
                                          experts=experts)
        vocab_size, description = model.vocab_size, model.description
    elif transformers_config is not None:
        from opperf.workload.transformers_model import TransformersCausalLM

        model = TransformersCausalLM(transformers_config, device, DTYPES[dtype], seed=plan.seed, path=config_path,
                                     experts=experts)
        vocab_size, description = model.vocab_size, model.description
    else:
        model = ReferenceDecoder(dims, device, DTYPES[dtype], seed=plan.seed)
        vocab_size, description = dims.vocab_size, {"source": "reference", "model_dims": asdict(dims)}
    if routing == "balanced":
        description = {**description, **balance_routing(model.model)}
    model.prepare_rope(plan.max_positions)
    token_ids = make_token_ids(plan, vocab_size, device)
    with span("workload.decode_caches", log, batches=len(plan.decode_batches) if plan.decode_steps else 0):
        decode_caches = written_decode_caches(model, plan, device)
    decode_cache = decode_cache_note(decode_caches)
    if decode_cache:
        log.info("decode KV caches %s", decode_cache["decode_cache"]["cache"])
    recorder = ValueRecorder() if backend != "npu" else None
    with span("workload.warmup", log, iterations=plan.warmup_iterations):
        for iteration in range(plan.warmup_iterations):
            # The first warm-up also records the values a trace cannot hold.
            with recorder if iteration == 0 and recorder is not None else contextlib.nullcontext():
                run_workload(model, plan, token_ids, device, decode_caches)
    plain_s = [_timed_pass(model, plan, token_ids, device, decode_caches) for _ in range(PLAIN_PASSES + 1)][1:]
    with staged_directory(output_dir, replace_whole=True) as staging:
        with span("workload.profile", log, backend=backend) as result:
            if backend == "npu":
                labels, profiled_s = _profile_npu(model, plan, token_ids, device, decode_caches, staging)
            else:
                labels, profiled_s = _profile_torch(model, plan, token_ids, device, decode_caches,
                                                    staging / CHROME_TRACE_NAME)
            result["steps"] = len(labels)
            result["iterations"] = plan.profile_iterations
        overhead = profile_overhead(plain_s, profiled_s / plan.profile_iterations, backend)
        if recorder is not None:
            if not plan.warmup_iterations:       # no warm-up to record in: one un-profiled pass after the profile
                with span("workload.record_values", log), recorder:
                    run_workload(model, plan, token_ids, device, decode_caches)
            recorder.write(staging)
            log.info("input values of %d calls recorded (%s)", len(recorder.calls), INPUT_VALUES)
            for op, reason in recorder.failed.items():
                log.warning("input values of %s calls not recorded (replay draws them): %s", op, reason)
        write_manifest(staging, {**description, "profile_overhead": overhead, **decode_cache}, plan, backend, dtype)
    log.info("profile written to %s (%s)", output_dir, ", ".join(labels))
    return output_dir


def _timed_pass(model, plan: WorkloadPlan, token_ids: dict[str, torch.Tensor], device: str,
                decode_caches: dict[int, WrittenCache]) -> float:
    """Wall time of one pass of the workload, un-profiled (run_workload synchronises the device at its end)."""
    _synchronize(device)
    start = time.perf_counter()
    run_workload(model, plan, token_ids, device, decode_caches)
    return time.perf_counter() - start


def profile_overhead(plain_s: list[float], profiled_s: float, backend: str = "cpu") -> dict:
    """How much longer a pass of the workload took under the profiler than without it, against how much two plain
    passes disagree (the noise floor); the workload log warns beyond it and workload.json records it. On the cpu
    back end every op's profiled time carries its share of the profiler's own cost (record_shapes, and anything else
    registered on the ops' scopes), so the ratio says the profiled durations, the database's ground truth, are
    inflated. On a device the kernels' durations do not carry it (the issue 43 measurement: median 0.994 with and
    without the execution-trace observer), but a stretched host side leaves the device idle between kernels, a
    neighbourhood the serving run does not have."""
    plain = statistics.median(plain_s)
    noise = (max(plain_s) - min(plain_s)) / min(plain_s) if min(plain_s) > 0 else 0.0
    ratio = profiled_s / plain if plain > 0 else float("nan")
    floor = max(OVERHEAD_NOISE_FACTOR * noise, OVERHEAD_MIN_FLOOR)
    inflated = bool(ratio > 1 + floor)
    record = {"plain_pass_s": [round(s, 6) for s in plain_s], "profiled_pass_s": round(profiled_s, 6),
              "ratio": round(ratio, 4), "noise": round(noise, 4), "floor": round(floor, 4), "inflated": inflated}
    message = ("profiler overhead: a workload pass took %.3f s under the profiler, %.3f s without (x%.3f; two plain "
               "passes differ by %.1f %%)")
    args = (profiled_s, plain, ratio, 100 * noise)
    if not inflated:
        log.info(message, *args)
    elif backend == "cpu":
        log.warning(message + ": the profiled op times are inflated beyond the noise floor (x%.2f)", *args, 1 + floor)
    else:
        log.warning(message + ": beyond the noise floor (x%.2f) the host side is stretched; kernel durations are not, "
                    "but the device idles between them more than in serving", *args, 1 + floor)
    return record


def write_manifest(directory: Path, model: dict, plan: WorkloadPlan, backend: str, dtype: str) -> None:
    """workload.json beside the trace: what ran (`source` reference or transformers, the model's dims or config;
    with decode steps, `decode_cache`: what they ran over). The parse stage reads `dtype` for TensorList members
    (cat's inputs), whose dtype torch.profiler does not record."""
    manifest = {"dtype": dtype, "backend": backend, **model, "plan": asdict(plan)}
    (directory / WORKLOAD_MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")



def _profile_torch(model, plan, token_ids, device, decode_caches, trace_path: Path) -> tuple[list[str], float]:
    """torch.profiler over the workload (op times, kernels; on cuda the GPU's power state sampled beside it,
    opperf.workload.power), then the execution trace of every op's tensors (the parse's input reuse distances and
    string arguments) from a second, untimed pass, joined to the first by order (opperf.workload.execution_trace):
    the observer serialises each op's inputs inside the op's own event, which in the timed pass made the cpu back
    end's op times 3.5x what they are."""
    from opperf.workload.execution_trace import join_to_trace, record_execution_trace
    from opperf.workload.power import POWER_SAMPLES, SYNC_RANGE, NvmlSampler

    activities = [torch.profiler.ProfilerActivity.CPU]
    sampler = None
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        sampler = NvmlSampler.start_if_available(torch.cuda.current_device())
    try:
        # torch's C++ side marks each session on stderr (USDT profiler_start/stop): kept out of the log.
        with stderr_without(PROFILER_NOISE), torch.profiler.profile(activities=activities,
                                                                    record_shapes=True) as profiler:
            if sampler is not None:
                with torch.profiler.record_function(SYNC_RANGE):
                    sampler.mark_sync()
            start = time.perf_counter()
            labels = profiled_iterations(model, plan, token_ids, device, decode_caches)
            profiled_s = time.perf_counter() - start
    finally:
        if sampler is not None:
            sampler.stop()
    profiler.export_chrome_trace(str(trace_path))
    if sampler is not None:
        sampler.write(trace_path.parent / POWER_SAMPLES)
    execution_trace = trace_path.parent / EXECUTION_TRACE
    with span("workload.execution_trace", log) as result:
        with stderr_without(PROFILER_NOISE):
            record_execution_trace(lambda: profiled_iterations(model, plan, token_ids, device, decode_caches),
                                   execution_trace)
        joined = join_to_trace(trace_path, execution_trace)
        result.update(events=joined.events, joined=joined.joined)
    return labels, profiled_s


def _profile_npu(model, plan, token_ids, device, decode_caches, out_dir: Path) -> tuple[list[str], float]:
    import torch_npu

    experimental = torch_npu.profiler._ExperimentalConfig(
        profiler_level=torch_npu.profiler.ProfilerLevel.Level1,
        aic_metrics=torch_npu.profiler.AiCMetrics.PipeUtilization)
    with torch_npu.profiler.profile(
            activities=[torch_npu.profiler.ProfilerActivity.CPU, torch_npu.profiler.ProfilerActivity.NPU],
            record_shapes=True, experimental_config=experimental,
            on_trace_ready=torch_npu.profiler.tensorboard_trace_handler(str(out_dir))):
        start = time.perf_counter()
        labels = profiled_iterations(model, plan, token_ids, device, decode_caches)
        profiled_s = time.perf_counter() - start
    if not any(out_dir.rglob("kernel_details*.csv")):
        raise OpperfError("torch_npu.profiler wrote no kernel_details.csv", path=out_dir)
    return labels, profiled_s
