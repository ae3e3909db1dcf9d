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

    python benchmarks/bad_inputs.py                  # all cases; writes benchmarks/results/bad_inputs.{json,md}
    python benchmarks/bad_inputs.py -k sources       # the cases whose name contains "sources" (not written)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
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
from snakemake_api import copy_workflow  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
OUTCOMES = ("ok", "traceback", "unclear", "accepted-wrong", "left-behind", "counted-twice", "rows-lost")
SNAKEMAKE_HEADER = re.compile(r'^WorkflowError in file "[^"]+", line \d+:$')
SNAKEMAKE_FRAME = re.compile(r'^  File "[^"]+/(Snakefile|rules/[\w.]+\.smk)", line \d+, in <module>$')


def snapshot(root: Path) -> dict[str, int]:
    """Every file under the copy (size), but Snakemake's bookkeeping, logs and byte code."""
    files = {}
    for path in root.rglob("*"):
        parts = path.relative_to(root).parts
        if path.is_file() and not ({".snakemake", "__pycache__", "logs"} & set(parts)):
            files[str(path.relative_to(root))] = path.stat().st_mtime_ns
    return files


def python_env() -> dict:
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def run_case(case: corpus.Case, scratch: Path) -> dict:
    root = copy_workflow(scratch / "wf")
    case.prepare(root)
    (root / case.fault_dir).mkdir(parents=True, exist_ok=True) if case.fault else None
    before = snapshot(root)
    started = time.perf_counter()
    if case.command:
        command = [sys.executable, *case.command]
    else:
        command = [sys.executable, "-m", "snakemake", "-n", "--cores", "1"]
        if case.configfiles:
            command += ["--configfile", *case.configfiles]
    reason = ""
    if case.fault:
        run = faults.run_with_fault(case.fault, command, root / case.fault_dir, cwd=root, env=python_env())
        returncode, output, inside = run.returncode, run.stdout + run.stderr, run.left
        reason = faults.expected_reason(case.fault)
    else:
        done = subprocess.run(command, cwd=root, capture_output=True, text=True, env=python_env(), timeout=600)
        returncode, output, inside = done.returncode, done.stdout + done.stderr, []
    wall_s = time.perf_counter() - started
    after = snapshot(root)
    new_files = sorted(set(after) - set(before))
    result = {"case": case.name, "group": case.group, "command": " ".join(command[1:]) if case.command else
              "snakemake -n" + "".join(f" --configfile {f}" for f in case.configfiles),
              "fault": case.fault or "", "fault_method": _fault_method(case.fault), "exit": returncode,
              "wall_s": round(wall_s, 2), "expected": corpus.expected_line(case, root, reason)}
    result.update(classify(case, root, returncode, output, new_files, inside, reason))
    return result


def _fault_method(fault: str | None) -> str:
    if not fault:
        return ""
    if faults.namespaces_work():
        return {"disk_full": "full 64 KiB tmpfs (ENOSPC)", "read_only": "read-only bind mount (EROFS)",
                "no_permission": "unprivileged user, directory 0555 (EACCES)"}[fault]
    return "RLIMIT_FSIZE 0 (EFBIG)" if fault == "disk_full" else "chmod 0555 (EACCES)"


def classify(case: corpus.Case, root: Path, returncode: int, output: str, new_files: list[str], inside: list[str],
             reason: str) -> dict:
    lines = output.splitlines()
    framing = [i for i, line in enumerate(lines) if SNAKEMAKE_HEADER.match(line) or SNAKEMAKE_FRAME.match(line)]
    tracebacky = [line for i, line in enumerate(lines) if i not in framing and
                  (line.startswith("Traceback (most recent call last)") or re.match(r'^\s+File "', line))]
    if case.command:
        error_lines = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
    else:
        error_lines = [lines[i + 1] for i in framing if SNAKEMAKE_HEADER.match(lines[i]) and i + 1 < len(lines)]
    left = [f for f in new_files if not case.fault or not f.startswith(case.fault_dir + "/")] + \
           [f"{case.fault_dir}/{f}" for f in inside]
    got = error_lines[0] if len(error_lines) == 1 else None
    detail = {"said": error_lines, "framing_lines": len(framing), "left": left}
    if tracebacky:
        return {**detail, "outcome": "traceback", "why": tracebacky[:3]}
    if case.expect is None:                       # a kill-and-rerun case: the rerun must succeed and clean up
        if returncode != 0:
            return {**detail, "outcome": "unclear", "why": ["the rerun failed", *lines[-3:]]}
        problems = case.check(root) if case.check else []
        if any(p.startswith("rows lost") for p in problems):
            return {**detail, "outcome": "rows-lost", "why": problems}
        if any("samples, one parse gives" in p for p in problems):
            return {**detail, "outcome": "counted-twice", "why": problems}
        if problems:
            return {**detail, "outcome": "left-behind", "why": problems}
        return {**detail, "outcome": "ok", "why": []}
    if returncode == 0:
        outcome = "counted-twice" if "counted-twice" in case.tags else "accepted-wrong"
        return {**detail, "outcome": outcome, "why": ["exit 0"]}
    if case.command and returncode != 2:
        return {**detail, "outcome": "unclear", "why": [f"exit {returncode}, not 2"]}
    if not corpus.matches(case, root, got, reason):
        return {**detail, "outcome": "unclear", "why": [f"said {error_lines!r}"]}
    if left:
        return {**detail, "outcome": "left-behind", "why": left}
    return {**detail, "outcome": "ok", "why": []}


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
             f"faults by {report['fault_methods']}. Command: `python benchmarks/bad_inputs.py`.", "",
             "| outcome | cases |", "|---|---|"]
    lines += [f"| {outcome} | {counts.get(outcome, 0)} |" for outcome in OUTCOMES]
    lines += ["", f"Snakemake's own framing around a load-time error: {report['snakemake_framing']}.", "",
              "| group | case | exit | outcome | what the user saw (without `error: `) |", "|---|---|---|---|---|"]
    for row in report["results"]:
        said = "<br>".join(s.replace("|", "\\|") for s in row["said"]) or "(nothing: " + ", ".join(row["why"]) + ")"
        lines.append(f"| {row['group']} | {row['case']} | {row['exit']} | {row['outcome']} | {said} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default="", help="run only the cases whose name contains this")
    parser.add_argument("--write", action="store_true", help="write the results even with -k")
    args = parser.parse_args()
    cases = [c for c in corpus.CASES if args.k in c.name]
    results = []
    for case in cases:
        with tempfile.TemporaryDirectory(prefix="opperf-bad-input-") as scratch:
            result = run_case(case, Path(scratch))
        results.append(result)
        print(f"{result['outcome']:<14} {result['wall_s']:6.1f}s  {case.group:<12} {case.name}", flush=True)
        if result["outcome"] != "ok":
            print(f"    expected: {result['expected']}\n    why: {result['why']}", flush=True)
    counts = Counter(r["outcome"] for r in results)
    framing = Counter(r["framing_lines"] for r in results if not any(c.name == r["case"] and c.command for c in cases))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    report = {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine(),
              "commit": commit.stdout.strip(), "cases": len(results), "counts": dict(counts),
              "fault_methods": "user namespaces (real ENOSPC, EROFS, EACCES)" if faults.namespaces_work() else
              "RLIMIT_FSIZE (EFBIG) and chmod", "snakemake_framing": ", ".join(
                  f"{n} lines in {k} cases" for n, k in sorted(framing.items())), "results": results}
    print()
    for outcome in OUTCOMES:
        print(f"{outcome:<15} {counts.get(outcome, 0)}")
    if not args.k or args.write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "bad_inputs.json").write_text(json.dumps(report, indent=1) + "\n")
        (RESULTS / "bad_inputs.md").write_text(markdown(report))
        print(f"wrote {RESULTS / 'bad_inputs.json'} and {RESULTS / 'bad_inputs.md'}")
    return 0 if counts.get("ok", 0) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
