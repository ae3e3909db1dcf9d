"""`scripts/check_database.py`: run the database gates (opperf.database.check) and write what they found."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opperf.consumer.interpolation import holdout_errors, holdout_summary
from opperf.consumer.runtime import load_database, load_op_mapping
from opperf.consumer.status import AnswerStatus
from opperf.database.check import add_layout_rows, check_findable
from opperf.io import write_text_atomic

# Holdout errors above this are listed by name in the table (the worst few per kernel type).
WORST_SHOWN = 3


def check_database(database: str | Path, density_standard: str | Path | None = None, *,
                   density_settings=None, consumer_queries=None, require_density: bool = False) -> dict[str, Any]:
    """Every gate on one database directory; `passed` is the contract gates (findable, unique), the density
    standard when `require_density`, and with `consumer_queries` (RecordedQuery list) no query that would
    fall back to the runtime's roofline model (MISS), interpolate across buckets (ILLEGAL) or raise.

    `density_settings` (grid.GridSettings of the grid that built the database) turns on the density gate:
    each axis point set of that grid checked against the standard on the rows that have a duration."""
    database = Path(database)
    operator_mappings, tables = load_database(database)
    checks = check_findable(operator_mappings, tables)
    add_layout_rows(database, checks)
    kernels = {kernel_type: check.as_dict() for kernel_type, check in checks.items()}
    document = load_op_mapping(database)
    all_errors, all_crossing = [], []
    for kernel_type, table in tables.items():
        predicted = holdout_errors(table, kernel_type, document)
        points = [p for p in predicted if p.legal]
        crossing = [p for p in predicted if p.crosses_branch]
        all_errors += points
        all_crossing += crossing
        worst = sorted(points, key=lambda p: -p.relative_error)[:WORST_SHOWN]
        kernels[kernel_type]["holdout"] = {
            **holdout_summary(points),
            "worst": [{"lines": list(p.lines), "axis": p.axis, "value": p.value, "actual_us": p.actual_us,
                       "predicted_us": round(p.predicted_us, 4), "relative_error": round(p.relative_error, 4),
                       "bucket": p.bucket} for p in worst],
            # Left out as ILLEGAL: a neighbour ran another execution branch (interpolation.execution_branch).
            "cross_branch": holdout_summary(crossing)}
    totals = {
        "rows": sum(c.rows for c in checks.values()),
        "rows_with_duration": sum(c.rows_with_duration for c in checks.values()),
        "findable": sum(c.findable for c in checks.values()),
        "answered_scaled": sum(c.scaled for c in checks.values()),
        "not_modelled": sum(c.not_modelled for c in checks.values()),
        "unmapped": sum(c.unmapped for c in checks.values()),
        "dtype_unmapped": sum(len(c.dtype_unmapped) for c in checks.values()),
        "duplicate_runtime_keys": sum(len(c.duplicate_key_lines) for c in checks.values()),
    }
    # Rows of kernel types no op the runtime receives maps to (a training kernel, an engine-internal one) are
    # listed, not failed: no query of the performance model can reach them, whatever the database says.
    # Rows of a dtype the runtime cannot spell (complex64) are listed, not failed: it never asks for them.
    passed = (totals["findable"] + totals["answered_scaled"] + totals["not_modelled"] + totals["unmapped"]
              + totals["dtype_unmapped"] == totals["rows_with_duration"]
              and totals["duplicate_runtime_keys"] == 0)
    totals["holdout"] = holdout_summary(all_errors)
    totals["holdout"]["cross_branch"] = holdout_summary(all_crossing)
    result = {"database": str(database), "passed": passed, "totals": totals, "kernel_types": kernels}
    if density_settings is not None:
        result["density"] = _density(database, density_settings, density_standard, kernels)
        result["passed"] = result["passed"] and (result["density"]["ok"] or not require_density)
    if consumer_queries is not None:
        result["consumer"] = _consumer(database, consumer_queries)
        result["passed"] = result["passed"] and result["consumer"]["ok"]
    result["table"] = format_table(result)
    return result


def _density(database: Path, settings, standard_path, kernels: dict) -> dict:
    """The density gate: per kernel type, each axis's buckets meeting the standard (rows with a duration)."""
    from opperf.density import load_standard
    from opperf.grid.density import check_density

    standard = load_standard(standard_path) if standard_path else None
    report = check_density(database, settings=settings, standard=standard, require_duration=True)
    for summary in report.axes:
        if summary.kernel_type in kernels:
            kernels[summary.kernel_type].setdefault("density", {})[summary.axis] = {
                "buckets": len(summary.checks), "meeting_standard": len(summary.checks) - len(summary.failures),
                "absent": summary.absent}
    return report.to_dict()


def _consumer(database: Path, recorded) -> dict:
    """The end-to-end gate: each recorded query answered as the runtime would (opperf.consumer.queries.answer)."""
    from opperf.consumer.queries import answer, answer_summary, modelled_exact_lookup

    answers = answer(recorded, database, modelled_exact_lookup)
    summary = answer_summary(answers)
    # Failing (AnswerStatus.fails_gate): roofline fallback, cross-bucket interpolation, an exception (a model run
    # stops), a path opperf's model of the runtime does not follow.
    failing = sorted((a for a in answers if a.status.fails_gate), key=lambda a: -a.recorded.calls)
    # A dtype the runtime cannot spell: priced at its roofline whatever the database holds; named, not failed.
    unspellable = sorted((a for a in answers if a.status == AnswerStatus.DTYPE_UNMAPPED),
                         key=lambda a: -a.recorded.calls)

    def listed(answered) -> dict:
        return {"op": answered.recorded.query.op_name, "status": answered.status, "calls": answered.recorded.calls,
                "inputs": [[list(t.shape), str(t.dtype).removeprefix("torch.")]
                           for t in answered.recorded.query.inputs],
                "scenarios": answered.recorded.scenarios[:3], "reason": answered.reason}
    return {"ok": not failing, "queries": len(answers), **summary,
            "failing": [listed(a) for a in failing], "dtype_unmapped": [listed(a) for a in unspellable]}


def _crossing_cell(summary: dict | None) -> str:
    return f"{summary['count']} ({_percent(summary['p90'])})" if summary and summary["count"] else "0"


def _crossing_sentence(summary: dict | None) -> str:
    if not summary or not summary["count"]:
        return ""
    return (f"; {summary['count']} more predictions used a neighbour that ran another execution branch (another "
            f"memory layout, the vectorised kernel's tail against whole blocks, or a copy's device memcpy on "
            f"another path by its size) and are ILLEGAL under the "
            f"standard (their median {_percent(summary['median'])}, p90 {_percent(summary['p90'])})")


def format_table(result: dict[str, Any]) -> str:
    """The per-kernel-type table, plain text (markdown-compatible)."""
    lines = [f"# Database check: {result['database']}", "",
             "| kernel type | rows | layout rows | with duration | findable | duplicate keys | holdout points "
             "| holdout median | holdout p90 | cross-branch points (p90) | density (buckets meeting the standard) "
             "| mapped ops |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for kernel_type, k in result["kernel_types"].items():
        findable = f"{k['findable']}" + (f" (+{k['not_modelled']} not modelled)" if k["not_modelled"] else "")
        findable += " (unmapped)" if k["unmapped"] else ""
        findable += f" (+{len(k['dtype_unmapped'])} dtype unmapped)" if k.get("dtype_unmapped") else ""
        holdout = k["holdout"]
        lines.append(f"| {kernel_type} | {k['rows']} | {k['layout_rows'] if k['layout_rows'] is not None else '-'} "
                     f"| {k['rows_with_duration']} | {findable} | {k['duplicate_runtime_keys']} "
                     f"| {holdout['count']} | {_percent(holdout['median'])} | {_percent(holdout['p90'])} "
                     f"| {_crossing_cell(holdout.get('cross_branch'))} "
                     f"| {_density_cell(k.get('density'), 'density' in result)} "
                     f"| {', '.join(k['mapped_ops']) or '(none)'} |")
    t = result["totals"]
    lines += ["", f"Rows with a duration the runtime finds: {t['findable']} of {t['rows_with_duration']}"
              + (f" (+{t['answered_scaled']} elementwise rows whose calls their output shape's first row answers, "
                 "scaled by the dtypes' bytes where they differ: interpolation points of their dtype or input regime)"
                 if t.get("answered_scaled") else "")
              + (f" (+{t['not_modelled']} under query modes this check does not model)" if t["not_modelled"] else "")
              + (f" ({t['unmapped']} of kernel types no op the runtime receives maps to)" if t["unmapped"] else "")
              + (f" ({t['dtype_unmapped']} of a dtype the runtime's DTYPE_MAP cannot spell, "
                 f"{', '.join(_unspelled_dtypes(result))}: it never asks for them)" if t.get("dtype_unmapped") else "")
              + f"; duplicate runtime keys: {t['duplicate_runtime_keys']}; "
              + ("PASSED" if result["passed"] else "FAILED"),
              "", f"Holdout interpolation error (each interior replayed row predicted from its neighbours by the "
              f"runtime's rule, legal interpolations only): {t['holdout']['count']} points, median "
              f"{_percent(t['holdout']['median'])}, p90 {_percent(t['holdout']['p90'])}"
              + _crossing_sentence(t["holdout"].get("cross_branch"))]
    if "density" in result:
        density = result["density"]
        failing = [a for a in density["axes"] if a["failures"]]
        checked = sum(a["buckets"] for a in density["axes"])
        absent = sum(a["absent"] for a in density["axes"])
        lines += ["", f"Density against the standard ({density['standard'].get('version', 'V1')}), replayed rows: "
                  + (f"nothing to check: none of the grid's {absent} axis point sets has a measured row"
                     if not checked else
                     f"every axis meets it ({checked} point sets; {absent} absent)" if density["ok"] else
                     f"{len(failing)} kernel type/axis pairs below it: "
                     + "; ".join(f"{a['kernel_type']} {a['axis']}: {a['failures'][0]}" for a in failing[:10]))]
    if "consumer" in result:
        lines += ["", *_consumer_lines(result["consumer"])]
    misses = [(kt, m) for kt, k in result["kernel_types"].items() for m in k["misses"]]
    if misses:
        lines += ["", "Rows the runtime does not find:"]
        lines += [f"- {kt}.csv line {m['line']}: {m['why']}" for kt, m in misses[:50]]
        if len(misses) > 50:
            lines.append(f"- … and {len(misses) - 50} more (see the JSON)")
    return "\n".join(lines)


def _unspelled_dtypes(result: dict[str, Any]) -> list[str]:
    return sorted({d for k in result["kernel_types"].values() for row in k.get("dtype_unmapped", [])
                   for d in row["dtypes"]})


def _density_cell(density: dict | None, checked: bool) -> str:
    if not checked:
        return "not checked"
    if not density:
        return "no axis"
    return ", ".join(f"{axis} {d['meeting_standard']}/{d['buckets']}" + (f" (+{d['absent']} absent)"
                                                                          if d["absent"] else "")
                     for axis, d in sorted(density.items()))


def _consumer_lines(consumer: dict) -> list[str]:
    counts = ", ".join(f"{status} {v['queries']} ({v['calls']} calls)"
                       for status, v in consumer["by_status"].items() if v["queries"])
    lines = [f"The consumer's queries ({consumer['queries']} distinct), as the runtime answers them: {counts}; "
             + (("none falls back to roofline" + (" for want of a row" if consumer.get("dtype_unmapped") else ""))
                if consumer["ok"] else
                f"{len(consumer['failing'])} would fall back to roofline, interpolate across buckets or raise")]
    for item in consumer["failing"][:20]:
        lines.append(f"- {item['op']} {item['inputs']}: {item['status']} ({item['calls']} calls; "
                     f"{item['scenarios'][0]}): {item['reason']}")
    if len(consumer["failing"]) > 20:
        lines.append(f"- … and {len(consumer['failing']) - 20} more (see the JSON)")
    unspellable = consumer.get("dtype_unmapped") or []
    if unspellable:
        lines += ["", f"{len(unspellable)} queries ({sum(i['calls'] for i in unspellable)} calls) carry a dtype the "
                  "runtime's DTYPE_MAP cannot spell: no row can answer them, so the runtime prices them at its "
                  "roofline, and so does scripts/predict.py (as MISS); not a failure of the database:"]
        lines += [f"- {item['op']} {item['inputs']} ({item['calls']} calls; {item['scenarios'][0]}): "
                  f"{item['reason'].split(':', 1)[0]}" for item in unspellable[:20]]
        if len(unspellable) > 20:
            lines.append(f"- … and {len(unspellable) - 20} more (see the JSON)")
    return lines


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:.2f} %"


def write_reports(result: dict[str, Any], json_path: str | Path | None = None,
                  markdown_path: str | Path | None = None) -> None:
    if json_path:
        document = {k: v for k, v in result.items() if k != "table"}
        write_text_atomic(json_path, json.dumps(document, indent=1, default=str) + "\n")
    if markdown_path:
        write_text_atomic(markdown_path, result["table"] + "\n")
