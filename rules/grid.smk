checkpoint generate_shape_grid:
    """Parsed rows + model-derived theory rows of one database, one CSV per kernel type (stage 3); a checkpoint
    because the consumer's queries (grid.consumer_queries) can add kernel types the profile did not have."""
    input:
        parsed="results/{device}/{stack}/{version_dir}/parsed",
        patterns=config["grid"]["patterns"],
        standard=grid_density_standard,
        models=config["models"],
        model_configs=grid_model_configs,
        code=stage_code("grid", "density"),
        recorder_code=grid_recorder_code,
    output:
        grid=directory("results/{device}/{stack}/{version_dir}/grid"),
    log:
        "logs/grid/{device}/{stack}/{version_dir}.log",
    benchmark:
        "benchmarks/runs/grid/{device}/{stack}/{version_dir}.tsv"
    conda:
        "../envs/cpu.yaml"
    resources:
        mem_mb=2000,
    params:
        target_models=grid_target_models,
        rows=config["grid"]["rows"],
        seed=config["grid"]["seed"],
        backend=grid_device_backend,
        max_hbm_gb=grid_max_hbm_gb,
        max_tokens_option=grid_max_tokens_option,
        consumer_option=grid_consumer_option,
        msmodeling_commit=grid_msmodeling_commit,
        trace_dir="traces/{device}/{stack}/{version_dir}",
        log_level=config["log_level"],
    shell:
        "python scripts/generate_shape_grid.py --input-dir {input.parsed} --output-dir {output.grid} "
        "--device {wildcards.device} --backend {params.backend} --grid-config {input.patterns} "
        "--models {input.models} --target-models {params.target_models:q} --rows {params.rows} "
        "--seed {params.seed} --max-hbm-gb {params.max_hbm_gb} {params.max_tokens_option} {params.consumer_option} "
        "--trace-dir {params.trace_dir} --log-level {params.log_level} > {log} 2>&1"
