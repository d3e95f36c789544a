"""The solver's modules import each other without a cycle, even counting imports inside
functions (lazy loads: the compiled kernels, numba's import): a cycle closed through a
function works only as long as nobody calls that function while the modules load."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import perseus.solver

SOLVER = Path(perseus.solver.__file__).parent
PACKAGE = SOLVER.parent

# Left for the move of the schedules' shared names into perseus.core, after which
# zero_bubble no longer imports schedules: schedules' make_schedule imports zero_bubble's
# builders inside functions, zero_bubble imports the instruction kinds from schedules.
KNOWN = {frozenset({"perseus.solver.schedules", "perseus.solver.zero_bubble"})}


def _name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (functions included, not ``TYPE_CHECKING``)."""
    module = _name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
        for statement in node.body
        for inner in ast.walk(statement)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_the_solver_has_no_import_cycle_counting_imports_in_functions() -> None:
    modules = {_name(p): p for p in SOLVER.rglob("*.py")}
    graph = {name: {m for m in _imports(path) if m in modules and m != name}
             for name, path in modules.items()}  # fmt: skip
    for pair in KNOWN:
        first, second = sorted(pair)
        graph[first].discard(second)
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as err:
        raise AssertionError(f"import cycle: {' -> '.join(err.args[1])}") from None
