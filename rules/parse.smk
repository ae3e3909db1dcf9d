checkpoint parse_profiles:
    """Raw profiles of one database → one CSV per kernel type + kernel_types.txt (the manifest)."""
    input:
        profiles=raw_profile_files,
        code=stage_code("parse"),
    output:
        parsed=directory("results/{device}/{stack}/{version_dir}/parsed"),
    log:
        "logs/parse/{device}/{stack}/{version_dir}.log",
    benchmark:
        "benchmarks/runs/parse/{device}/{stack}/{version_dir}.tsv"
    conda:
        "../envs/cpu.yaml"
    resources:
        mem_mb=2000,
    params:
        profiles=raw_profile_paths,
        trace_dir="traces/{device}/{stack}/{version_dir}",
        log_level=config["log_level"],
    shell:
        "python scripts/parse_kernel_details.py --profiling-path {params.profiles:q} "
        "--database-path {output.parsed} --trace-dir {params.trace_dir} "
        "--log-level {params.log_level} > {log} 2>&1"
