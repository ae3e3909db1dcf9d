rule profile_workload:
    """Profile the workload on this host's back end: the reference decoder, or a transformers config.json's model
    (a raw profile for the parse stage)."""
    input:
        code=stage_code("workload"),
    output:
        profile=directory("results/workload/{device}/{stack}/{version_dir}/profile"),
    log:
        "logs/workload/{device}/{stack}/{version_dir}.log",
    benchmark:
        "benchmarks/runs/workload/{device}/{stack}/{version_dir}.tsv"
    conda:
        workload_conda_env()
    resources:
        mem_mb=4000,
    params:
        backend=config["workload"]["backend"],
        model_option=workload_model_option,
        model_dims=workload_model_dims,
        dtype=config["workload"]["dtype"],
        batch_size=config["workload"]["batch_size"],
        prefill_lengths=config["workload"]["prefill_lengths"],
        decode_steps=config["workload"]["decode_steps"],
        decode_context=config["workload"]["decode_context"],
        profile_iterations=config["workload"]["profile_iterations"],
        log_level=config["log_level"],
    shell:
        "python scripts/profile_workload.py --backend {params.backend} {params.model_option} "
        "--dtype {params.dtype} --batch-size {params.batch_size} "
        "--prefill-lengths {params.prefill_lengths} --decode-steps {params.decode_steps} "
        "--decode-context {params.decode_context} --profile-iterations {params.profile_iterations} "
        "--version-dir {wildcards.version_dir} --output {output.profile} "
        "--log-level {params.log_level} > {log} 2>&1"
