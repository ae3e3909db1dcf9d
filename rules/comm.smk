# Stage 6: collective benchmarks (docs/comm.md). One job per collective CSV, each a torchrun launch.


# Collective files and per-kernel database files share the data/{device}/{x}/{y}/{file}.csv shape;
# under a gloo/nccl/hccl directory the file is a collective's.
ruleorder: comm_collective > database_kernel


rule comm_collective:
    """One collective over the configured sizes, device counts and tiers: checked, timed, written atomically."""
    input:
        devices=config["devices"],
        # what the benchmark imports, not comm/plot.py or comm/alignment.py (a plot change re-collects nothing)
        code=stage_code(
            "comm/bench",
            "comm/collectives",
            "comm/results",
            "comm/sizes",
            "comm/timing",
            "comm/topology",
        ),
    output:
        csv="data/{device}/{comm}/{comm_version}/{collective}.csv",
    log:
        "logs/comm/{device}/{comm}/{comm_version}/{collective}.log",
    benchmark:
        "benchmarks/runs/comm/{device}/{comm}/{comm_version}/{collective}.tsv"
    wildcard_constraints:
        comm="gloo|nccl|hccl",
        comm_version=r"[A-Za-z0-9_.+]+",
        collective=r"[A-Za-z0-9_]+",
    conda:
        comm_conda_env()
    threads: config["comm"]["nproc"]
    resources:
        gpu=comm_device_slots("nccl"),
        npu=comm_device_slots("hccl"),
    params:
        op=comm_op,
        nproc=config["comm"]["nproc"],
        num_devices=" ".join(str(n) for n in config["comm"]["num_devices"]),
        tiers=comm_tier_option(),
        dtype=config["comm"]["dtype"],
        bytes_grid=" ".join(config["comm"]["bytes_grid"]),
        bench_mode=config["comm"]["bench_mode"],
        warmup_iters=config["comm"]["warmup_iters"],
        min_iters=config["comm"]["min_iters"],
        max_iters=config["comm"]["max_iters"],
        target_seconds=config["comm"]["target_seconds"],
        log_level=config["log_level"],
    shell:
        "python -m torch.distributed.run --standalone --nproc-per-node {params.nproc} "
        "scripts/generate_comm_microbench.py --do-run --backend {wildcards.comm} --device {wildcards.device} "
        "--devices {input.devices} --version-dir {wildcards.comm_version} --ops {params.op} "
        "--num-devices {params.num_devices} {params.tiers} --dtype {params.dtype} --bytes-grid {params.bytes_grid} "
        "--bench-mode {params.bench_mode} --warmup-iters {params.warmup_iters} --min-iters {params.min_iters} "
        "--max-iters {params.max_iters} --target-seconds {params.target_seconds} --output-csv {output.csv} "
        "--log-level {params.log_level} > {log} 2>&1"


rule comm_bandwidth_plot:
    """Bus bandwidth against message size of one collection's collectives, the device's link limit drawn."""
    input:
        csvs=comm_collection_csvs,
        code=stage_code("comm/plot", "comm/collectives", "comm/results", "comm/sizes"),
    output:
        plot=report(
            "reports/{device}/{comm}/{comm_version}/busbw.png",
            caption="../report/comm_bandwidth.rst",
            category="Collectives",
            subcategory="{device}/{comm}/{comm_version}",
            labels={"file": "bus bandwidth"},
        ),
        largest="reports/{device}/{comm}/{comm_version}/busbw_largest_messages.md",
    log:
        "logs/comm_report/{device}/{comm}/{comm_version}/busbw.log",
    benchmark:
        "benchmarks/runs/comm_report/{device}/{comm}/{comm_version}/busbw.tsv"
    wildcard_constraints:
        comm="gloo|nccl|hccl",
    conda:
        "../envs/cpu.yaml"
    params:
        runs=comm_plot_runs,
        limit_gbps=comm_link_limit_gbps,
        limit_label=comm_link_label,
        log_level=config["log_level"],
    shell:
        "python scripts/plot_comm_bandwidth.py {params.runs} --limit-gbps {params.limit_gbps} "
        "--limit-label {params.limit_label:q} --title '{wildcards.device} {wildcards.comm} {wildcards.comm_version}' "
        "--output {output.plot} --summary {output.largest} --log-level {params.log_level} > {log} 2>&1"


rule comm_alignment:
    """Every point of one collection against config comm.reference (another run, machine, or the peer's files)."""
    input:
        csvs=comm_collection_csvs,
        reference=comm_reference_files,
        code=stage_code("comm/alignment", "comm/collectives", "comm/results", "comm/sizes"),
    output:
        comparison=report(
            "reports/{device}/{comm}/{comm_version}/alignment.csv",
            caption="../report/comm_alignment.rst",
            category="Collectives",
            subcategory="{device}/{comm}/{comm_version}",
            labels={"file": "alignment with the reference"},
        ),
        summary="reports/{device}/{comm}/{comm_version}/alignment.txt",
    log:
        "logs/comm_report/{device}/{comm}/{comm_version}/alignment.log",
    benchmark:
        "benchmarks/runs/comm_report/{device}/{comm}/{comm_version}/alignment.tsv"
    wildcard_constraints:
        comm="gloo|nccl|hccl",
    conda:
        "../envs/cpu.yaml"
    params:
        measured="data/{device}/{comm}/{comm_version}",
        reference=config["comm"]["reference"] or "",
        tolerance=config["comm"]["alignment_tolerance"],
        log_level=config["log_level"],
    shell:
        "python scripts/validate_comm_alignment.py --measured {params.measured} --reference {params.reference:q} "
        "--tolerance {params.tolerance} --report {output.comparison} --summary {output.summary} --exit-zero "
        "--log-level {params.log_level} > {log} 2>&1"
