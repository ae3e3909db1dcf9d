rule npu_definition_check:
    """NPU definitions bound to torch_npu's own schemas and run on its meta kernels: no NPU, no CANN needed.

    Downloads the torch_npu wheel of the version directory's torch release once (pip, into .cache/);
    not part of `all`. Target: reports/npu_check/vllm0.18.0_torch2.9.0_cann8.5.md
    """
    input:
        definitions="config/kernels/npu",
        profiles="resources/profiles",
        examples="tests/data/replay_npu/example_rows.csv",
        code=stage_code(
            "replay/npu",
            "replay/hooks",
            "replay/definitions",
            "replay/inputs",
            "replay/verify",
        ),
    output:
        report="reports/npu_check/{version_dir}.md",
    log:
        "logs/npu_check/{version_dir}.log",
    benchmark:
        "benchmarks/runs/npu_check/{version_dir}.tsv"
    conda:
        "../envs/cpu.yaml"
    params:
        wheel_cache=".cache/torch_npu",
        log_level=config["log_level"],
    shell:
        "python scripts/check_npu_definitions.py --version-dir {wildcards.version_dir} "
        "--wheel-cache {params.wheel_cache} --profiles {input.profiles} --example-rows {input.examples} "
        "--definitions {input.definitions} --output {output.report} --log-level {params.log_level} > {log} 2>&1"
