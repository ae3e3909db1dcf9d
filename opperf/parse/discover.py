"""Which raw profiler files a set of `--profiling-path` arguments stands for.

A file is taken as given (a CSV is a profiler table, a `.json` a torch.profiler trace). A directory is
scanned recursively for `kernel_details*.csv` (torch_npu), `op_summary_*.csv` (msprof) and torch.profiler
traces: `*.pt.trace.json` / `trace.json` (the workload stage writes `trace.json`) and any other `*.json` that
starts like one, each optionally `.gz` (`_is_torch_trace`); `operator_details.csv` and `trace_view.json`
beside a kernel_details file are kept as that bundle's FusedInferAttentionScore metadata. A torch_npu bundle
holds both its `ASCEND_PROFILER_OUTPUT/kernel_details.csv` and the msprof `PROF_*/…/op_summary_*.csv` it was
made from: the same launches twice, so an op_summary is used only where its bundle has no kernel_details.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from pathlib import Path

from opperf.errors import OpperfError
from opperf.log import get_logger

log = get_logger("parse.discover")

SNIFF_BYTES = 1 << 18
OPERATOR_DETAILS = "operator_details.csv"
TRACE_VIEW = "trace_view.json"


@dataclass
class Bundle:
    """The files of one torch_npu profiling bundle that carry FIA runtime metadata."""

    root: Path
    operator_details: list[Path] = field(default_factory=list)
    trace_views: list[Path] = field(default_factory=list)


@dataclass
class ProfileInputs:
    tables: list[Path] = field(default_factory=list)         # kernel_details / op_summary CSVs
    torch_traces: list[Path] = field(default_factory=list)   # torch.profiler Chrome traces
    bundles: dict[Path, Bundle] = field(default_factory=dict)  # kernel_details file → its bundle
    ignored: list[tuple[Path, str]] = field(default_factory=list)


def _is_kernel_details(path: Path) -> bool:
    return path.suffix.lower() == ".csv" and "kernel_details" in path.stem.lower()


def _is_op_summary(path: Path) -> bool:
    return path.suffix.lower() == ".csv" and path.stem.lower().startswith("op_summary")


def _is_torch_trace(path: Path) -> bool:
    """A torch.profiler Chrome trace: by its usual names, or any other `*.json[.gz]` (HTA's `rank-0.json.gz`, a
    `*_kineto.json.gz`) whose start holds a `traceEvents` key. JSON files of an Ascend bundle (its timeline, msprof's
    exports) are never traces of ours; the files beside a trace (execution_trace.json, workload.json, ...) hold no
    `traceEvents`."""
    name = path.name.lower().removesuffix(".gz")
    if name.endswith(".pt.trace.json") or name == "trace.json":
        return True
    if not name.endswith(".json") or name == TRACE_VIEW or any(
            p.name == "ASCEND_PROFILER_OUTPUT" or p.name.startswith("PROF_") for p in path.parents):
        return False
    return _starts_like_a_trace(path)


def _starts_like_a_trace(path: Path) -> bool:
    """The first SNIFF_BYTES of the (decompressed) file are a JSON object with a `traceEvents` key: torch.profiler
    writes its few top-level fields (schemaVersion, deviceProperties, distributedInfo) before the events."""
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rb") as handle:
            start = handle.read(SNIFF_BYTES)
    except (OSError, EOFError):
        return False          # not readable as such: not taken (a trace given as a file is read, and refused, loudly)
    return start.lstrip().startswith(b"{") and b'"traceEvents"' in start


def _bundle_root(path: Path) -> Path:
    """The profiling bundle a file belongs to: the directory holding ASCEND_PROFILER_OUTPUT / PROF_*."""
    for parent in path.parents:
        if parent.name == "ASCEND_PROFILER_OUTPUT" or parent.name.startswith("PROF_"):
            return parent.parent
    return path.parent


def _prof_dir(path: Path) -> Path | None:
    return next((p for p in path.parents if p.name.startswith("PROF_")), None)


def _op_summaries_to_use(candidates: list[Path], kernel_detail_roots: set[Path],
                         inputs: ProfileInputs) -> list[Path]:
    chosen = []
    by_prof: dict[Path | None, list[Path]] = {}
    for path in candidates:
        if _bundle_root(path) in kernel_detail_roots:
            inputs.ignored.append((path, "same launches as the bundle's kernel_details.csv"))
            continue
        by_prof.setdefault(_prof_dir(path), []).append(path)
    for prof, paths in by_prof.items():
        # msprof writes mindstudio_profiler_output/ (new) and device_*/summary/ (old) in one PROF_*: use one.
        newer = [p for p in paths if p.parent.name == "mindstudio_profiler_output"]
        if prof is not None and newer and len(newer) < len(paths):
            for p in paths:
                if p not in newer:
                    inputs.ignored.append((p, "older export of the same PROF_* (mindstudio_profiler_output used)"))
            paths = newer
        chosen += paths
    return chosen


def _claim(reached: dict[Path, Path], path: Path, given: Path) -> None:
    """A profile reached through two arguments (repeated, spelled differently, or inside a given directory)
    would have its launches counted twice: refused, naming both."""
    resolved = path.resolve()
    if resolved in reached:
        first = reached[resolved]
        how = "given twice" if first == given else f"reached through both {str(first)!r} and {str(given)!r}"
        raise OpperfError(f"the same profile is {how}: its launches would be counted twice", path=path,
                          field="--profiling-path")
    reached[resolved] = given


def discover_inputs(paths: list[str | Path]) -> ProfileInputs:
    """Expand `--profiling-path` arguments into the profiler files to parse (see module docstring)."""
    inputs = ProfileInputs()
    if not paths:
        raise OpperfError("no --profiling-path given")
    reached: dict[Path, Path] = {}          # resolved profile file -> the argument that reached it
    for given in map(Path, paths):
        if not given.exists():
            raise OpperfError("profiling path does not exist", path=given)
        if given.is_file():
            if given.name == TRACE_VIEW:
                raise OpperfError("trace_view.json is a torch_npu bundle's timeline, not a kernel table: give "
                                  "the bundle directory or its kernel_details.csv", path=given)
            if given.name.lower().removesuffix(".gz").endswith(".json"):
                inputs.torch_traces.append(given)
            elif given.suffix.lower() == ".csv":
                inputs.tables.append(given)
            else:
                raise OpperfError("not a profiler file (expected a .csv kernel table or a .json torch.profiler "
                                  "trace)", path=given)
            _claim(reached, given, given)
            continue
        files = sorted(p for p in given.rglob("*") if p.is_file())
        kernel_details = [p for p in files if _is_kernel_details(p)]
        roots = {_bundle_root(p) for p in kernel_details}
        op_summaries = _op_summaries_to_use([p for p in files if _is_op_summary(p)], roots, inputs)
        traces = [p for p in files if _is_torch_trace(p)]
        if not (kernel_details or op_summaries or traces):
            raise OpperfError("no kernel_details*.csv, op_summary_*.csv or torch.profiler trace (*.json[.gz] with "
                              "traceEvents) found under this directory", path=given)
        metadata = [(p, _bundle_root(p)) for p in files if p.name in (OPERATOR_DETAILS, TRACE_VIEW)]
        for path in kernel_details:
            root = _bundle_root(path)
            inputs.bundles[path] = Bundle(
                root=root, operator_details=[p for p, r in metadata if r == root and p.name == OPERATOR_DETAILS],
                trace_views=[p for p, r in metadata if r == root and p.name == TRACE_VIEW])
        for path in kernel_details + op_summaries + traces:
            _claim(reached, path, given)
        inputs.tables += kernel_details + op_summaries
        inputs.torch_traces += traces
    for path, why in inputs.ignored:
        log.info("not parsing %s: %s", path, why)
    return inputs
