"""No import cycles among opperf's modules: stages depend one way. An import inside a function counts too, since
that is how a cycle hides."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "opperf"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_statements(path: Path) -> list[tuple[str, list[str]]]:
    """Each import of one file, module level and inside functions: (the module it names, relative imports resolved;
    the names `from ... import` takes from it, [] for a plain `import`)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.append((base, [alias.name for alias in node.names]))
    return found


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """opperf modules one file imports (`from opperf.x import y` is opperf.x.y if that is a module, else opperf.x)."""
    found = set()
    for base, names in import_statements(path):
        if not names:
            found.add(base)
        found.update(f"{base}.{n}" if f"{base}.{n}" in modules else base for n in names)
    return {m for m in found if m in modules and m != module_name(path)}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:
        index[module] = lowest[module] = len(index)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                lowest[module] = min(lowest[module], lowest[other])
            elif other in stack:
                lowest[module] = min(lowest[module], index[other])
        if lowest[module] == index[module]:
            component = []
            while component[-1:] != [module]:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycles_in_opperf():
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: imported_modules(path, set(paths)) for name, path in paths.items()}
    assert graph["opperf.grid.patterns"] >= {"opperf.grid.generators", "opperf.grid.candidate"}
    assert cycles(graph) == []


def test_a_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
