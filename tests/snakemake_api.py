"""Drive the opperf workflow through Snakemake's own Python API (no subprocess, no output scraping)."""

from __future__ import annotations

import shutil
from pathlib import Path

from snakemake.api import SnakemakeApi
from snakemake.settings.types import (ConfigSettings, DAGSettings, OutputSettings, Quietness,
                                      ResourceSettings)

from opperf.workflow_config import copy_workflow  # noqa: F401  (the tests' fresh copies of the workflow)

REPO = Path(__file__).resolve().parent.parent


def run_workflow(workdir: Path, targets=(), *, dry_run: bool = False, config: dict | None = None,
                 cores: int = 2) -> list[tuple[str, dict]] | list[str]:
    """Run or dry-run the workflow in `workdir`.

    A dry run returns the (rule, wildcards) of every job Snakemake plans, sorted; a real run returns
    the files it updated, sorted.
    """
    with SnakemakeApi(OutputSettings(quiet={Quietness.ALL}, printshellcmds=False)) as api:
        workflow_api = api.workflow(
            resource_settings=ResourceSettings(cores=cores),
            config_settings=ConfigSettings(config=config or {}),
            snakefile=workdir / "Snakefile",
            workdir=workdir,
        )
        dag_api = workflow_api.dag(dag_settings=DAGSettings(targets=frozenset(targets)))
        if dry_run:
            dag_api.execute_workflow(executor="local", pseudo_executor="dryrun")
            jobs = workflow_api._workflow.dag.needrun_jobs(exclude_finished=False)
            return sorted(((job.rule.name, dict(job.wildcards_dict)) for job in jobs),
                          key=lambda planned: (planned[0], sorted(planned[1].items())))
        updated: list[str] = []
        dag_api.execute_workflow(executor="local", updated_files=updated)
        return sorted(updated)


TINY_CPU_TRACE = REPO / "tests" / "data" / "replay" / "tiny_cpu" / "trace.json"


def tiny_cpu_replay_workflow(destination: Path) -> tuple[Path, dict, str]:
    """A workflow copy whose one database is the tiny CPU trace, replayed on cpu (no workload, comm or grid):
    (workdir, config, the database's device/stack/version_dir)."""
    from opperf.versions import cpu_version_dir

    workdir = copy_workflow(destination)
    version_dir = cpu_version_dir()
    (workdir / "resources" / "tiny_cpu").mkdir(parents=True)
    shutil.copy(TINY_CPU_TRACE, workdir / "resources" / "tiny_cpu" / "trace.json")
    (workdir / "config" / "replay_sources.tsv").write_text(
        f"device\tstack\tversion_dir\tpath\nCPU\ttorch\t{version_dir}\tresources/tiny_cpu/trace.json\n")
    config = {"sources": "config/replay_sources.tsv", "workload": {"enabled": False}, "comm": {"enabled": False},
              "grid": {"enabled": False}, "replay": {"backends": ["cpu"], "repeat_count": 2, "warmup_count": 1,
                                                       "phase": {"backends": ["cpu"]}}}
    return workdir, config, f"CPU/torch/{version_dir}"


def planned_rules(plan) -> list[str]:
    """The rule names of a dry-run plan, sorted, with repeats."""
    return sorted(rule for rule, _ in plan)
