"""opperf: build a versioned operator-performance database (see README.md and docs/design.md)."""

from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/workload.smk"
include: "rules/parse.smk"
include: "rules/database.smk"
include: "rules/grid.smk"
include: "rules/replay.smk"
include: "rules/report.smk"
include: "rules/comm.smk"
include: "rules/npu_check.smk"


rule all:
    default_target: True
    input:
        all_targets,
