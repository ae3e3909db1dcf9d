rule replay_kernel:
    """Re-measure one kernel type's rows of one database on its device; rows written back by signature (stage 4)."""
    input:
        rows=replay_rows_input,
        definition=kernel_definition,
        power_rows=replay_power_rows,
        devices=config["devices"],
        code=stage_code("replay"),
    output:
        replayed="results/{device}/{stack}/{version_dir}/replayed/{kernel}.csv",
    log:
        "logs/replay/{device}/{stack}/{version_dir}/{kernel}.log",
    benchmark:
        "benchmarks/runs/replay/{device}/{stack}/{version_dir}/{kernel}.tsv"
    conda:
        device_conda_env
    threads: config["replay"]["cpu_threads"]
    resources:
        gpu=replay_device_slots("gpu"),
        npu=replay_device_slots("npu"),
        mem_mb=4000,
    params:
        rows=replay_rows_file,
        definition=kernel_definition_option,
        trace_dir="traces/{device}/{stack}/{version_dir}",
        repeat_count=config["replay"]["repeat_count"],
        warmup_count=config["replay"]["warmup_count"],
        update_mode=config["replay"]["update_mode"],
        timeout_s=config["replay"]["timeout_s"],
        max_restarts=config["replay"]["max_restarts"],
        memory_fraction=config["replay"]["memory_fraction"],
        prune_options=replay_prune_options,
        budget_options=replay_budget_options,
        power_options=replay_power_options,
        device_ids_option=replay_device_ids_option,
        log_level=config["log_level"],
    shell:
        "python scripts/replay.py --rows {params.rows} --kernel {wildcards.kernel:q} "
        "--definition {params.definition} --device {wildcards.device} --devices-catalog {input.devices} "
        "--version-dir {wildcards.version_dir} --output {output.replayed} --trace-dir {params.trace_dir} "
        "--repeat-count {params.repeat_count} {params.budget_options} --warmup-count {params.warmup_count} "
        "--update-mode {params.update_mode} --timeout-s {params.timeout_s} --max-restarts {params.max_restarts} "
        "--cpu-threads {threads} --memory-fraction {params.memory_fraction} {params.prune_options} "
        "{params.power_options} "
        "{params.device_ids_option} --log-level {params.log_level} > {log} 2>&1"


rule phase_replay:
    """The workload's calls replayed in its own order (replay.phase.iterations passes), after every kernel type's
    replay; a table of in-order means that the database stage folds into the rows (stage 4b, docs/replay.md
    "Phase replay")."""
    input:
        profiles=raw_profile_files,
        replayed=replayed_csvs,
        code=stage_code("replay"),
    output:
        table="results/{device}/{stack}/{version_dir}/phase_replay.csv",
    log:
        "logs/replay/{device}/{stack}/{version_dir}/phase_replay.log",
    benchmark:
        "benchmarks/runs/replay/{device}/{stack}/{version_dir}/phase_replay.tsv"
    conda:
        phase_conda_env
    resources:
        gpu=replay_device_slots("gpu"),
        mem_mb=4000,
    params:
        profiles=raw_profile_paths,
        device=phase_replay_device,
        options=phase_replay_options,
        log_level=config["log_level"],
    shell:
        "python scripts/phase_replay.py --profiling-path {params.profiles:q} --rows {input.replayed:q} "
        "--output {output.table} --device {params.device} {params.options} "
        "--log-level {params.log_level} > {log} 2>&1"
