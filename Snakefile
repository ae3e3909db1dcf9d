"""opperf: build a versioned operator-performance database (see README.md and docs/design.md)."""

from snakemake.utils import min_version

from opperf.errors import OpperfError
from opperf.workflow_config import check_config_file

min_version("9.0")

# Snakemake's own loader would say only "not valid JSON or YAML": name the line.
try:
    check_config_file("config/config.yaml")
except OpperfError as error:
    raise WorkflowError(str(error)) from None


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


rule unknown_device:
    """Never runs: a data/, results/ or reports/ target whose device is not in the catalog lands here and stops
    with one line naming the valid devices (instead of Snakemake's bare MissingRuleException)."""
    input:
        unknown_device_error,
    output:
        "{folder}/{device}/{stack}/{rest}",
    wildcard_constraints:
        folder="data|results|reports",
        device=not_a_device_pattern(),
        rest=".+",
