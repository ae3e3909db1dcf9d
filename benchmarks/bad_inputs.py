"""Every bad input and fault of issue 16, met as a user meets it; the outcomes tabulated.

Each case of tests/bad_input_corpus.py runs in a fresh copy of the workflow: a workflow case as
`snakemake -n --cores 1` (the config, catalog, models, grid patterns, definitions and sources sheet are
checked when the workflow loads), a script case as `python scripts/...`, an OS-fault case under a real
fault (tests/faults.py: a full tmpfs, a read-only bind mount, an unprivileged user). The outcome is one of

    ok              refused with exactly the expected line (file, line, field); nothing left behind
                    (kill cases: the rerun succeeded, no temporary left, rows as one clean parse)
    traceback       a Python traceback or stack frames of ours reached the user
    unclear         refused, but not with exactly one line, or not the expected one
    accepted-wrong  the command succeeded although the input is wrong
    left-behind     a file the failed run began is still there (temporaries included)
    counted-twice   a profile's launches were counted twice
    rows-lost       rows a rerun should have kept are missing

Snakemake frames its load-time errors: `WorkflowError in file ".../rules/common.smk", line N:` before our
line and one `  File ".../rules/common.smk", line N, in <module>` after it. Those two lines are Snakemake's
own (it prints the frame of the Snakefile line that raised); they are counted and reported, not held
against the case. A case whose output has any other frame is a traceback.

    python benchmarks/bad_inputs.py                  # all cases; writes benchmarks/results/bad_inputs/
    python benchmarks/bad_inputs.py -k sources       # the cases whose name contains "sources" (not written)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import bad_input_corpus as corpus  # noqa: E402
import faults  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "bad_inputs"


def machine() -> str:
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{os.cpu_count()} CPU cores ({cpu or platform.processor()}), Python {platform.python_version()}"


def markdown(report: dict) -> str:
    counts = report["counts"]
    lines = [f"# Bad inputs and faults: {report['cases']} cases", "",
             f"Measured {report['measured_at']} on {report['machine']}; commit {report['commit']}; "
             f"faults by {report['fault_methods']}. Command: `python benchmarks/bad_inputs.py` "
             f"({report['wall_s']:.0f} s).", "",
             "| outcome | cases |", "|---|---|"]
    lines += [f"| {outcome} | {counts.get(outcome, 0)} |" for outcome in corpus.OUTCOMES]
    lines += ["", f"What Snakemake prints around our line for a load-time error: {report['snakemake_framing']}.",
              "", "| group | case | exit | outcome | what the user saw (without `error: `) |", "|---|---|---|---|---|"]
    for row in report["results"]:
        said = "<br>".join(s.replace("|", "\\|") for s in row["said"]) or "(nothing: " + ", ".join(row["why"]) + ")"
        if not row["said"] and row["outcome"] == "ok":
            said = "(rerun succeeded; no temporary of a gone writer left, rows as one clean parse where checked)"
        lines.append(f"| {row['group']} | {row['case']} | {row['exit']} | {row['outcome']} | {said} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default="", help="run only the cases whose name contains this")
    parser.add_argument("--write", action="store_true", help="write the results even with -k")
    args = parser.parse_args()
    cases = [c for c in corpus.CASES if args.k in c.name]
    results = []
    started = time.perf_counter()
    for case in cases:
        with tempfile.TemporaryDirectory(prefix="opperf-bad-input-") as scratch:
            result = corpus.run_case(case, Path(scratch))
        results.append(result)
        print(f"{result['outcome']:<14} {result['wall_s']:6.1f}s  {case.group:<12} {case.name}", flush=True)
        if result["outcome"] != "ok":
            print(f"    expected: {result['expected']}\n    why: {result['why']}", flush=True)
    counts = Counter(r["outcome"] for r in results)
    framing = Counter(r["framing_lines"] for r in results if not r["command"].startswith("scripts/"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    report = {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine(),
              "load_average": os.getloadavg(), "commit": commit.stdout.strip(), "cases": len(results),
              "wall_s": round(time.perf_counter() - started, 1), "counts": dict(counts),
              "fault_methods": "user namespaces (real ENOSPC, EROFS, EACCES)" if faults.namespaces_work() else
              "RLIMIT_FSIZE (EFBIG) and chmod",
              "snakemake_framing": ", ".join(f"{n} lines (header + frame) in {k} cases"
                                             for n, k in sorted(framing.items())),
              "results": results}
    print()
    for outcome in corpus.OUTCOMES:
        print(f"{outcome:<15} {counts.get(outcome, 0)}")
    if not args.k or args.write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "bad_inputs.json").write_text(json.dumps(report, indent=1) + "\n")
        (RESULTS / "README.md").write_text(markdown(report))
        print(f"wrote {RESULTS / 'bad_inputs.json'} and {RESULTS / 'README.md'}")
    return 0 if counts.get("ok", 0) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
