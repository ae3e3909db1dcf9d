"""The database check's end-to-end gate in msmodeling's own account, for a database whose rows came from msmodeling's
recorder: every distinct call its runner issues over the scenario space, asked of msmodeling's own data sources
(opperf.consumer.msmodeling_queries.ask_msmodeling: `ProfilingDataSource` in its `InterpolatingDataSource`, as its
runner reads a database). A call they do not answer (msmodeling prices it at its roofline) or that raises fails it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from opperf.consumer.msmodeling_env import Msmodeling
from opperf.consumer.status import MSMODELING_STATUSES, AnswerStatus

SHOWN = 20


def _status(answer: dict) -> tuple[AnswerStatus, str]:
    if answer["raised"]:
        return AnswerStatus.RAISES, answer["raised"]
    if answer["source"] is None:
        return AnswerStatus.MISS, f"msmodeling's data source: {answer['miss_reason'] or 'no answer'}"
    if answer["rule"] in ("zero_cost", "accepted_miss"):
        return AnswerStatus.ZERO_COST, answer["rule"]
    if answer["exact"] is not None:
        return AnswerStatus.EXACT, answer["rule"] or "exact"
    return AnswerStatus.INTERPOLATED, answer["method"] or answer["rule"] or "interpolated"


def _tensor(value) -> bool:
    return isinstance(value, dict) and "shape" in value


def call_inputs(call: dict) -> list:
    """The call's tensor arguments as [shape, dtype], a tensor list as the list of its shapes (the first 4)."""
    shown = []
    for value in call["args"]:
        if _tensor(value):
            shown.append([value["shape"], value["dtype"]])
        elif isinstance(value, list) and value and all(_tensor(item) for item in value):
            shapes = [item["shape"] for item in value]
            shown.append(shapes[:4] + ([f"… {len(shapes)} tensors"] if len(shapes) > 4 else []))
    return shown


def writes_nothing(call: dict) -> bool:
    """Whether every output of the call has no element (a cat of empty per-expert blocks): no kernel runs, its
    replayed row measures no device work, and msmodeling reads only positive latencies, so no row can answer it."""
    outputs = [o for o in (call.get("out") if isinstance(call.get("out"), list) else [call.get("out")]) if _tensor(o)]
    return bool(outputs) and all(0 in o["shape"] for o in outputs)


PATHS = ("exact", "padded", "interpolated", "merged", "zero_cost", "accepted_miss")


def msmodeling_gate(install: Msmodeling, database: str | Path, scenarios: Sequence) -> dict:
    """The gate over recorded scenarios (opperf.consumer.recorder.record_msmodeling_calls): {"ok", "queries",
    "by_status": {status: {"queries", "calls"}}, "by_path": {path: {"queries", "calls"}} (which of the runtime's
    rules answered: msmodeling_answer's `path`), "between_points": [scenario names between the space's points],
    "failing": [{"op", "status", "calls", "inputs", "scenarios", "reason"}], "writes_nothing": [the same, for the
    misses of calls with empty outputs: no row can answer them (`writes_nothing`); they do not fail the gate],
    "msmodeling_commit"}. Calls are counted per step at the model's own depth where known."""
    from opperf.consumer.msmodeling_queries import ask_msmodeling

    distinct: dict[str, dict] = {}
    for scenario in scenarios:
        for call in scenario.calls:
            key = json.dumps([call["op"], call["args"], call["kwargs"]], sort_keys=True)
            entry = distinct.setdefault(key, {"call": call, "calls": 0, "scenarios": []})
            entry["calls"] += call["count"] if call.get("full_depth_count") is None else call["full_depth_count"]
            entry["scenarios"].append(scenario.name)
    entries = list(distinct.values())
    answers = ask_msmodeling(install, database, [entry["call"] for entry in entries]) if entries else []
    by_status = {status: {"queries": 0, "calls": 0} for status in MSMODELING_STATUSES}
    by_path = {path: {"queries": 0, "calls": 0} for path in PATHS}
    failing, empty = [], []
    for entry, answer in zip(entries, answers):
        status, reason = _status(answer)
        by_status[status]["queries"] += 1
        by_status[status]["calls"] += entry["calls"]
        if answer.get("path") in by_path:
            by_path[answer["path"]]["queries"] += 1
            by_path[answer["path"]]["calls"] += entry["calls"]
        if status.fails_gate:
            item = {"op": entry["call"]["op"], "status": status, "calls": entry["calls"],
                    "inputs": call_inputs(entry["call"]), "scenarios": entry["scenarios"][:3], "reason": reason}
            (empty if status is AnswerStatus.MISS and writes_nothing(entry["call"]) else failing).append(item)
    failing.sort(key=lambda item: -item["calls"])
    empty.sort(key=lambda item: -item["calls"])
    between = [scenario.name for scenario in scenarios if scenario.between_points]
    return {"ok": not failing, "queries": len(entries), "by_status": by_status, "by_path": by_path,
            "between_points": between, "failing": failing, "writes_nothing": empty,
            "msmodeling_commit": install.commit}


def database_gate(install: Msmodeling, database: str | Path, models: Sequence[str], models_path: str | Path, *,
                  scenarios: str | Path | None, space: str, devices: str | Path | None = None) -> dict:
    """msmodeling_gate for `models` (config.json models) over scenario space `space`, recorded by msmodeling's runner
    on the database's device (op_mapping.yaml's `opperf.device`, in the catalog `devices`)."""
    from opperf.consumer.recorder import record_msmodeling_calls
    from opperf.consumer.runtime import load_op_mapping
    from opperf.devices import DEFAULT_CATALOG, load_catalog, resolve_device

    key = (load_op_mapping(database).get("opperf") or {}).get("device", "CPU")
    device = resolve_device(key, load_catalog(devices or DEFAULT_CATALOG))
    recorded = record_msmodeling_calls(install, models, models_path, scenarios=scenarios, space=space, device=device,
                                       between_points=True)
    return msmodeling_gate(install, database, recorded)


def gate_lines(gate: dict) -> list[str]:
    counts = ", ".join(f"{status} {v['queries']} ({v['calls']} calls)"
                       for status, v in gate["by_status"].items() if v["queries"])
    paths = ", ".join(f"{path} {v['queries']}" for path, v in gate.get("by_path", {}).items() if v["queries"])
    between = gate.get("between_points", [])
    where = (f" at the space's points and {len(between)} scenarios between them "
             f"({', '.join(name.split(' between ')[-1] for name in between[:4])}{', …' if len(between) > 4 else ''})"
             if between else "")
    lines = [f"msmodeling's queries ({gate['queries']} distinct){where}, as msmodeling's own data sources answer "
             f"them: {counts}; " + ("none falls back to roofline" if gate["ok"] else
                                    f"{len(gate['failing'])} fall back to roofline or raise")]
    if paths:
        lines.append(f"answered by the runtime's rule: {paths}")
    for item in gate["failing"][:SHOWN]:
        lines.append(f"- {item['op']} {item['inputs']}: {item['status']} ({item['calls']} calls; "
                     f"{item['scenarios'][0]}): {item['reason']}")
    if len(gate["failing"]) > SHOWN:
        lines.append(f"- … and {len(gate['failing']) - SHOWN} more (see the JSON)")
    empty = gate.get("writes_nothing", [])
    if empty:
        lines.append(f"{len(empty)} distinct calls write nothing (every output has 0 elements: no kernel runs) and "
                     "fall to msmodeling's roofline: it reads only positive latencies, so no row can answer them; "
                     "they do not fail the check")
        lines += [f"- {item['op']} {item['inputs']} ({item['calls']} calls; {item['scenarios'][0]})"
                  for item in empty[:SHOWN]]
    return lines


def add_gate(result: dict, gate: dict) -> dict:
    """The check's result (opperf.database.report.check_database) with the gate: `consumer_msmodeling`, `passed`
    only if the gate is ok, and its lines after the table."""
    result["consumer_msmodeling"] = gate
    result["passed"] = result["passed"] and gate["ok"]
    result["table"] = "\n".join([result["table"], "", *gate_lines(gate)])
    return result
