rule database_kernel:
    """The final {KernelType}.csv of a database (one row per runtime key) and layouts/{KernelType}.csv (every row)."""
    input:
        rows=database_rows_input,
        definition=kernel_definition,
        phase=database_phase_input,
        code=database_code("replay/phase"),
    output:
        csv="data/{device}/{stack}/{version_dir}/{kernel}.csv",
        layouts="data/{device}/{stack}/{version_dir}/layouts/{kernel}.csv",
    log:
        "logs/database/{device}/{stack}/{version_dir}/{kernel}.log",
    benchmark:
        "benchmarks/runs/database/{device}/{stack}/{version_dir}/{kernel}.tsv"
    conda:
        "../envs/cpu.yaml"
    params:
        rows=database_rows_file,
        backend=lambda wildcards: database_backend(wildcards.device),
        definition=kernel_definition_option,
        phase=database_phase_option,
        log_level=config["log_level"],
    shell:
        "python scripts/build_database.py kernel --rows {params.rows} --kernel {wildcards.kernel:q} "
        "--backend {params.backend} --definition {params.definition} {params.phase} "
        "--output {output.csv} --layouts {output.layouts} --log-level {params.log_level} > {log} 2>&1"


rule database_op_mapping:
    """op_mapping.yaml of a database, generated from the kernel definitions of its kernel types."""
    input:
        kernels=database_kernel_csvs,
        definitions=database_kernel_definitions,
        not_replayed="config/not_replayed.yaml",
        devices=config["devices"],
        grid=database_consumer_queries_grid,
        code=database_code(),
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
        consumer_queries=database_consumer_queries_option,
        log_level=config["log_level"],
    shell:
        "python scripts/build_database.py op-mapping --kernels {input.kernels:q} "
        "--device {wildcards.device} --devices {input.devices} --definitions {params.definitions_dir} "
        "{params.consumer_queries} --output {output.mapping} --log-level {params.log_level} > {log} 2>&1"


rule database_msmodeling_device:
    """msmodeling_device.py of a cpu/cuda database: the DeviceProfile msmodeling's CLI loads for its device
    (config/devices.yaml) through opperf's launcher (docs/msmodeling.md)."""
    input:
        devices=config["devices"],
        code=stage_code("consumer/msmodeling_device"),
    output:
        profile="data/{device}/{stack}/{version_dir}/msmodeling_device.py",
    log:
        "logs/database/{device}/{stack}/{version_dir}/msmodeling_device.log",
    benchmark:
        "benchmarks/runs/database/{device}/{stack}/{version_dir}/msmodeling_device.tsv"
    conda:
        "../envs/cpu.yaml"
    params:
        log_level=config["log_level"],
    shell:
        "python scripts/build_database.py msmodeling-device --device {wildcards.device} --devices {input.devices} "
        "--output {output.profile} --log-level {params.log_level} > {log} 2>&1"


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


rule database_check:
    """The database as its consumer will use it (scripts/check_database.py): findable rows, unique runtime keys,
    density of the grid's axes, holdout error, and with grid.consumer_queries the consumer's queries end to end."""
    input:
        files=database_files,
        code=database_code(),
    output:
        json="reports/{device}/{stack}/{version_dir}/database_check.json",
        markdown="reports/{device}/{stack}/{version_dir}/database_check.md",
    log:
        "logs/database/{device}/{stack}/{version_dir}/check.log",
    benchmark:
        "benchmarks/runs/database/{device}/{stack}/{version_dir}/check.tsv"
    conda:
        "../envs/cpu.yaml"
    params:
        database=lambda wildcards: f"data/{wildcards.device}/{wildcards.stack}/{wildcards.version_dir}",
        gates=database_check_options,
        log_level=config["log_level"],
    shell:
        "python scripts/check_database.py {params.database} --json {output.json} "
        "--markdown {output.markdown} {params.gates} --log-level {params.log_level} > {log} 2>&1"
