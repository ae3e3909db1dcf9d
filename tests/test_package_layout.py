"""The stages' layout: the grid stage and the consumer package (queries, scenarios, the runtime model, predictions)
never import the database stage (opperf.database: laying, checking, reporting a database), not even through another
module or inside a function; one scenario space; one answer-status type, whose values are what outputs write."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
from test_imports import PACKAGE, import_statements, module_name

from opperf.consumer.queries import reference_queries, scenarios
from opperf.consumer.scenarios import DEFAULT_SCENARIO_SPACE, Scenario, load_scenario_space
from opperf.consumer.status import AnswerStatus

REPO = PACKAGE.parent
DATABASE_STAGE = "opperf.database"


def imported_names(path) -> set[str]:
    """Every opperf name one file imports, module level and inside functions, whether or not it is a module:
    `from opperf.x import y` gives opperf.x and opperf.x.y (relative imports resolved)."""
    found = set()
    for base, names in import_statements(path):
        found.add(base)
        found.update(f"{base}.{n}" for n in names)
    return {m for m in found if m == "opperf" or m.startswith("opperf.")}


def import_graph() -> dict[str, set[str]]:
    """Every opperf module -> the opperf names it imports (imported_names, modules or not), with the packages an
    import runs (`opperf.a.b` runs opperf/__init__.py and opperf/a/__init__.py first)."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        names = imported_names(path)
        graph[module_name(path)] = names | {".".join(m.split(".")[:i]) for m in names
                                            for i in range(1, m.count(".") + 1)}
    return graph


def chains_to(graph: dict[str, set[str]], starts: list[str], forbidden: str) -> list[list[str]]:
    """For each name under `forbidden` imported from `starts` or any opperf module they reach, the import chain
    that reaches it (a name that is no module, a function or a module since moved, counts as well)."""
    seen = {start: [start] for start in starts}
    queue = list(starts)
    while queue:
        module = queue.pop(0)
        for other in sorted(graph.get(module, ())):
            if other not in seen:
                seen[other] = [*seen[module], other]
                queue.append(other)
    return [chain for module, chain in sorted(seen.items())
            if module == forbidden or module.startswith(forbidden + ".")]


def package_modules(graph: dict[str, set[str]], package: str) -> list[str]:
    return sorted(m for m in graph if m == package or m.startswith(package + "."))


def test_the_grid_stage_never_reaches_the_database_stage():
    graph = import_graph()
    grid = package_modules(graph, "opperf.grid")
    assert chains_to(graph, grid, DATABASE_STAGE) == []
    assert "opperf.grid.queries" in grid and "opperf.consumer.queries" in graph["opperf.grid.queries"]
    assert "opperf.consumer.queries.merge_scenario_queries" in graph["opperf.grid.queries"]     # inside a function


def test_the_consumer_package_never_imports_the_database_stage():
    graph = import_graph()
    consumer = package_modules(graph, "opperf.consumer")
    assert chains_to(graph, consumer, DATABASE_STAGE) == []
    assert {"opperf.consumer.predict", "opperf.consumer.runtime", "opperf.consumer.scenarios"} <= set(consumer)


def test_every_opperf_import_names_a_module_or_a_name_in_one():
    """So that no import escapes the walk: a name is a module, or one of its package's."""
    graph = import_graph()
    dangling = sorted(f"{module} imports {name}" for module, names in graph.items() for name in names
                      if name not in graph and name.rpartition(".")[0] not in graph)
    assert dangling == []


def test_a_chain_through_another_module_is_found():
    graph = {"opperf.grid.a": {"opperf.report.b"}, "opperf.report.b": {"opperf.database.c"}, "opperf.database.c": set()}
    assert chains_to(graph, ["opperf.grid.a"], DATABASE_STAGE) == [["opperf.grid.a", "opperf.report.b",
                                                                     "opperf.database.c"]]


def test_the_grid_stage_imports_no_database_module_at_run_time():
    """What the ast walk says, checked by importing: the grid's modules load without opperf.database."""
    grid = [module_name(p) for p in sorted((PACKAGE / "grid").rglob("*.py"))]
    code = (f"import importlib, sys\nfor name in {grid!r}:\n    importlib.import_module(name)\n"
            "print(sorted(m for m in sys.modules if m.startswith('opperf.database')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_consumer_queries_default_space_is_config_scenarios_yaml():
    space = load_scenario_space(DEFAULT_SCENARIO_SPACE, "default")
    default = scenarios(["Qwen3-32B"])
    assert default == space.scenarios("Qwen3-32B")
    assert {s.tp for s in default} == set(space.tp_sizes)
    assert sorted({s.tokens for s in default if s.phase == "prefill"}) == list(space.prefill_tokens)
    assert sorted({s.batch for s in default if s.phase == "decode"}) == list(space.decode_batches)
    assert sorted({s.context for s in default if s.phase == "decode"}) == list(space.decode_contexts)


def test_one_status_type_and_the_check_report_writes_its_values(tmp_path):
    """The database check's consumer gate on the demo database, written as scripts/check_database.py writes it:
    every status is the enum's value, in the enum's order, with the answers the gate failed on by name."""
    from opperf.database.report import check_database, write_reports

    assert [s.value for s in AnswerStatus] == ["EXACT", "ZERO_COST", "INTERPOLATED", "ILLEGAL", "MISS",
                                               "DTYPE_UNMAPPED", "RAISES", "UNMODELLED"]
    recorded = reference_queries(REPO / "config" / "models.yaml",
                                 [Scenario("opperf-tiny", 1, "prefill", 1, t) for t in (16, 40)], dtype=torch.float32)
    out = tmp_path / "check.json"
    write_reports(check_database(REPO / "tests" / "data" / "runtime_db" / "cpu", consumer_queries=recorded), out)
    text = out.read_text()
    assert "AnswerStatus" not in text
    consumer = json.loads(text)["consumer"]
    assert list(consumer["by_status"]) == [s.value for s in AnswerStatus]
    assert consumer["by_status"]["EXACT"]["queries"] > 0 and consumer["by_status"]["INTERPOLATED"]["queries"] > 0
    assert consumer["by_op"]["aten.mm.default"] == {"EXACT": 4, "INTERPOLATED": 4}
    assert {item["status"] for item in consumer["failing"]} == {"MISS"}
    assert not consumer["ok"]
