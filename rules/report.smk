rule replay_report:
    """The replay report of one database: markdown, duration gaps, JSON summary, plots (stage 7)."""
    input:
        replayed=replayed_csvs,
        phase=database_phase_input,
        # the finished database: every database job's benchmark file exists before the stage timings are read
        database="results/{device}/{stack}/{version_dir}/database_manifest.tsv",
        code=stage_code("report", "replay/phase"),
        templates=["templates/replay_report.md.j2", "templates/replay_report.html.j2"],
    output:
        report="reports/{device}/{stack}/{version_dir}/replay_report.md",
        table=report(
            "reports/{device}/{stack}/{version_dir}/replay_report.html",
            caption="../report/accuracy_table.rst",
            category="Replay",
            subcategory="{device}/{stack}/{version_dir}",
            labels={"file": "accuracy by kernel type"},
        ),
        gaps=report(
            "reports/{device}/{stack}/{version_dir}/duration_gap.csv",
            caption="../report/duration_gap.rst",
            category="Replay",
            subcategory="{device}/{stack}/{version_dir}",
            labels={"file": "duration gaps"},
        ),
        summary="reports/{device}/{stack}/{version_dir}/summary.json",
        scatter=report(
            "reports/{device}/{stack}/{version_dir}/replay_vs_profile.png",
            caption="../report/replay_plot.rst",
            category="Replay",
            subcategory="{device}/{stack}/{version_dir}",
            labels={"file": "replay vs profile"},
        ),
        histogram=report(
            "reports/{device}/{stack}/{version_dir}/duration_gap_histogram.png",
            caption="../report/gap_histogram.rst",
            category="Replay",
            subcategory="{device}/{stack}/{version_dir}",
            labels={"file": "gap histogram"},
        ),
        statuses=report(
            "reports/{device}/{stack}/{version_dir}/status_by_kernel.png",
            caption="../report/status_plot.rst",
            category="Replay",
            subcategory="{device}/{stack}/{version_dir}",
            labels={"file": "status by kernel"},
        ),
    log:
        "logs/report/{device}/{stack}/{version_dir}.log",
    benchmark:
        "benchmarks/runs/report/{device}/{stack}/{version_dir}.tsv"
    conda:
        "../envs/cpu.yaml"
    params:
        output_dir=subpath(output.report, parent=True),
        backend=report_backend,
        band=config["report"]["duration_gap_band"],
        trace_dir="traces/{device}/{stack}/{version_dir}",
        parsed_dir="results/{device}/{stack}/{version_dir}/parsed",
        database_dir="data/{device}/{stack}/{version_dir}",
        phase=database_phase_option,
        log_level=config["log_level"],
    shell:
        "python scripts/report.py --csv {input.replayed:q} --output-dir {params.output_dir} "
        "--database {wildcards.device}/{wildcards.stack}/{wildcards.version_dir} --database-dir {params.database_dir} "
        "--backend {params.backend} "
        "--band {params.band} --benchmarks-root benchmarks/runs --trace-dir {params.trace_dir} "
        "--parsed-dir {params.parsed_dir} {params.phase} "
        "--log-level {params.log_level} > {log} 2>&1"


rule predict_steps:
    """Predicted steps of the grid's target models at config predict.scenarios, from the finished database (7b)."""
    input:
        database="results/{device}/{stack}/{version_dir}/database_manifest.tsv",
        models=config["models"],
        code=database_code(),
    output:
        json="reports/{device}/{stack}/{version_dir}/predictions.json",
        page=report(
            "reports/{device}/{stack}/{version_dir}/predictions.md",
            caption="../report/predictions.rst",
            category="Prediction",
            subcategory="{device}/{stack}/{version_dir}",
            labels={"file": "predicted steps"},
        ),
    log:
        "logs/predict/{device}/{stack}/{version_dir}.log",
    benchmark:
        "benchmarks/runs/predict/{device}/{stack}/{version_dir}.tsv"
    conda:
        "../envs/cpu.yaml"
    params:
        database_dir="data/{device}/{stack}/{version_dir}",
        options=predict_options,
        log_level=config["log_level"],
    shell:
        "python scripts/predict.py --database {params.database_dir} --models {input.models} {params.options} "
        "--json {output.json} --markdown {output.page} --log-level {params.log_level} > {log} 2>&1"
