rule database_kernel:
    """The final {KernelType}.csv of a database: contract columns in contract order, written atomically."""
    input:
        rows=database_rows_input,
        code=stage_code("database"),
    output:
        csv="data/{device}/{stack}/{version_dir}/{kernel}.csv",
    log:
        "logs/database/{device}/{stack}/{version_dir}/{kernel}.log",
    benchmark:
        "benchmarks/runs/database/{device}/{stack}/{version_dir}/{kernel}.tsv"
    conda:
        "../envs/cpu.yaml"
    params:
        rows=database_rows_file,
        log_level=config["log_level"],
    shell:
        "python scripts/build_database.py kernel --rows {params.rows} --kernel {wildcards.kernel:q} "
        "--output {output.csv} --log-level {params.log_level} > {log} 2>&1"


rule database_op_mapping:
    """op_mapping.yaml of a database, generated from the kernel definitions of its kernel types."""
    input:
        kernels=database_kernel_csvs,
        definitions=database_kernel_definitions,
        not_replayed="config/not_replayed.yaml",
        devices=config["devices"],
        code=stage_code("database"),
    output:
        mapping="data/{device}/{stack}/{version_dir}/op_mapping.yaml",
    log:
        "logs/database/{device}/{stack}/{version_dir}/op_mapping.log",
    benchmark:
        "benchmarks/runs/database/{device}/{stack}/{version_dir}/op_mapping.tsv"
    conda:
        "../envs/cpu.yaml"
    params:
        definitions_dir=kernel_definitions_dir,
        log_level=config["log_level"],
    shell:
        "python scripts/build_database.py op-mapping --kernels {input.kernels:q} "
        "--device {wildcards.device} --devices {input.devices} --definitions {params.definitions_dir} "
        "--output {output.mapping} --log-level {params.log_level} > {log} 2>&1"


rule database_complete:
    """Marks a database as built: lists every file of it with its row count (results/, not data/)."""
    input:
        files=database_files,
    output:
        manifest="results/{device}/{stack}/{version_dir}/database_manifest.tsv",
    log:
        "logs/database/{device}/{stack}/{version_dir}/manifest.log",
    benchmark:
        "benchmarks/runs/database/{device}/{stack}/{version_dir}/manifest.tsv"
    conda:
        "../envs/cpu.yaml"
    params:
        log_level=config["log_level"],
    shell:
        "python scripts/build_database.py manifest --files {input.files:q} --output {output.manifest} "
        "--log-level {params.log_level} > {log} 2>&1"
