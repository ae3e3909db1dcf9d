#!/usr/bin/env python
"""Check a `snakemake --profile profiles/slurm` run against a local run of the same workflow.

Two questions, both answered from records the real components keep, not from our own bookkeeping:
1. Did every job go through SLURM? The main Snakemake log names each job (`rule X:` with its `output:`)
   and each SLURM submission (`Job N has been submitted with SLURM jobid S (log: FILE)`); each kept SLURM
   job log FILE is the output of the Snakemake that ran inside SLURM job S and names the jobs it ran
   (same rule, same outputs; its job ids are its own); slurmctld's job-completion log (`JobCompLoc`)
   must list every S as COMPLETED with exit code 0.
2. Are the databases the same? Every CSV under data/ of the local run exists in the SLURM run with the
   same columns and the same rows (identity columns: shapes, dtypes, formats, source, ...; measured times
   differ run to run), and every row that has a duration in one run has one in the other.

    check_slurm_run.py --local DIR --slurm DIR --snakemake-log FILE --jobcomp /var/log/slurm/jobcomp.log
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from opperf import contract  # noqa: E402
from opperf.comm import results as comm  # noqa: E402
from opperf.io import read_database_csv  # noqa: E402

LOCAL_RULES = {"all"}
COMPUTE_IDENTITY = (*contract.BASE_COLUMNS, contract.SOURCE, "Input Strides", contract.INPUT_SCALARS,
                    contract.PROFILING_SAMPLE_COUNT, contract.REPLAY_STATUS)
COMM_IDENTITY = (comm.MESSAGE_BYTES, comm.NUM_DEVICES, comm.DTYPE, comm.TOPOLOGY_TIER)
# A job block: `rule X:` (or `localrule`, `checkpoint`) and its indented fields; inside a group job's
# listing the whole block is indented once more.
RULE_BLOCK = re.compile(r"^( *)(local)?(?:rule|checkpoint) (\w+):\n((?:\1    .*\n)+)", re.MULTILINE)
SUBMITTED = re.compile(r"^Job (\S+) has been submitted with SLURM jobid (\d+) \(log: (.+)\)\.$", re.MULTILINE)


def jobs_in(text: str) -> dict[tuple[str, str], bool]:
    """(rule, outputs) -> local? for every job block a Snakemake log prints."""
    jobs = {}
    for _, local, rule, body in RULE_BLOCK.findall(text):
        outputs = re.search(r"^ +output: (.*)$", body, re.MULTILINE)
        jobs[(rule, outputs.group(1) if outputs else "")] = bool(local)
    return jobs


def check_slurm_jobs(log_text: str, jobcomp: Path) -> list[str]:
    problems = []
    planned = jobs_in(log_text)
    remote = sorted(job for job, local in planned.items() if not local and job[0] not in LOCAL_RULES)
    submissions = {slurm_id: Path(log) for _, slurm_id, log in SUBMITTED.findall(log_text)}
    if not remote:
        return ["the Snakemake log names no job (was it run with --quiet?)"]
    ran_in_slurm: dict[tuple[str, str], str] = {}
    for slurm_id, log in submissions.items():
        if not log.is_file():
            problems.append(f"SLURM job {slurm_id}: its log {log} is gone (run with --slurm-keep-successful-logs)")
            continue
        for job in jobs_in(log.read_text(errors="replace")):
            ran_in_slurm[job] = slurm_id
    missing = [f"{rule} -> {outputs}" for rule, outputs in remote if (rule, outputs) not in ran_in_slurm]
    if missing:
        problems.append(f"{len(missing)} job(s) did not run inside a SLURM job: {'; '.join(missing[:10])}")
    completed = {}
    for line in jobcomp.read_text().splitlines() if jobcomp.is_file() else []:
        fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
        if "JobId" in fields:
            completed[fields["JobId"]] = (fields.get("JobState", ""), fields.get("ExitCode", ""))
    for slurm_id in submissions:
        state = completed.get(slurm_id)
        if state is None or state[0] != "COMPLETED" or not state[1].startswith("0"):
            problems.append(f"SLURM job {slurm_id}: slurmctld's completion log says {state or 'nothing'}")
    total = re.findall(r"^(\d+) of (\d+) steps \(100%\) done", log_text, re.MULTILINE)
    if not total or int(total[-1][0]) != len(planned):
        problems.append(f"the log names {len(planned)} jobs but Snakemake counted {total[-1] if total else 'none'}")
    print(f"SLURM: {len(remote)} Snakemake jobs ran in {len(submissions)} SLURM jobs "
          f"({len(remote) - len(submissions)} fewer thanks to grouping); "
          f"{len(planned) - len(remote)} local job(s) ({', '.join(sorted(LOCAL_RULES))})")
    return problems


def rows_of(path: Path, identity: tuple[str, ...], durations: tuple[str, ...]) -> tuple[list[str], Counter]:
    frame = read_database_csv(path)
    columns = [c for c in identity if c in frame.columns]
    present = [c for c in durations if c in frame.columns]
    rows = Counter(tuple(row[c] for c in columns) + tuple(bool(row[c]) for c in present)
                   for row in frame.to_dict(orient="records"))
    return list(frame.columns), rows


def check_databases(local: Path, slurm: Path) -> list[str]:
    problems = []
    local_files = sorted(p.relative_to(local) for p in (local / "data").rglob("*") if p.is_file())
    slurm_files = sorted(p.relative_to(slurm) for p in (slurm / "data").rglob("*") if p.is_file())
    if local_files != slurm_files:
        problems.append(f"different files under data/: only local {sorted(set(local_files) - set(slurm_files))}, "
                        f"only SLURM {sorted(set(slurm_files) - set(local_files))}")
    csvs = [p for p in local_files if p.suffix == ".csv" and (slurm / p).is_file()]
    rows_total = 0
    for relative in csvs:
        comm_file = (local / relative).parent.parent.name in ("gloo", "nccl", "hccl")
        identity = COMM_IDENTITY if comm_file else COMPUTE_IDENTITY
        durations = (comm.DURATION,) if comm_file else (contract.REPLAY_AVERAGE, contract.PROFILING_AVERAGE)
        local_columns, local_rows = rows_of(local / relative, identity, durations)
        slurm_columns, slurm_rows = rows_of(slurm / relative, identity, durations)
        if local_columns != slurm_columns:
            problems.append(f"{relative}: columns differ: local {local_columns} SLURM {slurm_columns}")
        if local_rows != slurm_rows:
            problems.append(f"{relative}: rows differ: {sum((local_rows - slurm_rows).values())} only local, "
                            f"{sum((slurm_rows - local_rows).values())} only SLURM")
        rows_total += sum(local_rows.values())
    replayed = [p for p in csvs if p.parts[1] == "CPU" and p.parts[2] == "torch"]
    if not replayed:
        problems.append("no replayed CPU database CSV to compare")
    for relative in replayed:
        frame = read_database_csv(slurm / relative)
        if (frame[contract.REPLAY_AVERAGE] == "").any():
            problems.append(f"{relative}: rows without {contract.REPLAY_AVERAGE!r} in the SLURM run")
    print(f"databases: {len(csvs)} CSVs, {rows_total} rows compared ({len(replayed)} replayed CPU kernel types)")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local", type=Path, required=True, help="workflow copy run with snakemake --cores 2")
    parser.add_argument("--slurm", type=Path, required=True, help="workflow copy run with --profile profiles/slurm")
    parser.add_argument("--snakemake-log", type=Path, required=True, help="stdout+stderr of the SLURM run")
    parser.add_argument("--jobcomp", type=Path, required=True, help="slurmctld's JobCompLoc file")
    args = parser.parse_args()
    problems = check_slurm_jobs(args.snakemake_log.read_text(errors="replace"), args.jobcomp)
    problems += check_databases(args.local, args.slurm)
    for problem in problems:
        print(f"FAIL: {problem}")
    print("OK: every job ran through SLURM and the databases equal the local run's" if not problems else
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
