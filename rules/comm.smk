# Stage 6: collective benchmarks (docs/comm.md). One job per collective CSV, each a torchrun launch.


# Collective files and per-kernel database files share the data/{device}/{x}/{y}/{file}.csv shape;
# under a gloo/nccl/hccl directory the file is a collective's.
ruleorder: comm_collective > database_kernel


rule comm_collective:
    """One collective over the configured sizes, device counts and tiers: checked, timed, written atomically."""
    input:
        devices=config["devices"],
        code=stage_code("comm"),
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
