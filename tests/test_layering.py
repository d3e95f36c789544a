"""The package's shape, drawn from its imports: no cycles, and each folder's allowed arrows.

Data flows profile -> solver -> server -> client -> GPU; the command line sits on top. Only
module-level imports count as arrows (imports inside functions are deliberate lazy loads, and
``if TYPE_CHECKING:`` blocks are for the type checker alone).
"""

from __future__ import annotations

import ast
import graphlib
import sys
from pathlib import Path

import perseus

PACKAGE = Path(perseus.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports(path: Path) -> set[str]:
    """Modules imported at module level (not in functions, not under TYPE_CHECKING)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parent, base] if base else parent)
                names.add(base)
                names.update(f"{base}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If):
                test = node.test
                if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
                    visit(node.orelse)
                    continue
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(tree.body)
    return names


def _within(name: str, *packages: str) -> bool:
    """``name`` is one of ``packages`` or inside one (``perseus.client`` is not ``perseus.cli``)."""
    return any(name == p or name.startswith(p + ".") for p in packages)


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py") if p.name != "__main__.py"}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = {m for m in _top_level_imports(path) if m in modules and m != name}
    return graph


def test_the_package_has_no_import_cycle() -> None:
    graph = _graph()
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as err:
        raise AssertionError(f"import cycle: {' -> '.join(err.args[1])}") from None


def test_the_walk_sees_every_folder() -> None:
    """The checks here would pass vacuously if the walk saw nothing."""
    folders = {name.split(".")[1] for name in _graph() if name.count(".") >= 1}
    assert {"client", "server", "solver", "cli"} <= folders


def test_the_solver_is_a_pure_core() -> None:
    """The solver imports the standard library, numpy, highspy and perseus's own plain
    modules (errors, defaults, baselines): no files' formats, HTTP, plotting or GPU; numba only
    in its compiled kernels, which nothing imports at module level (numba takes half a second
    to import, and every process that reads a profile imports perseus.solver)."""
    allowed_perseus = (
        "perseus.solver",
        "perseus.core.errors",
        "perseus.core.defaults",
        "perseus.core.baselines",
    )
    offenders = []
    for path in sorted((PACKAGE / "solver").rglob("*.py")):
        for name in _top_level_imports(path):
            root = name.split(".")[0]
            if root == "perseus":
                if not _within(name, *allowed_perseus):
                    offenders.append(f"{_module_name(path)} imports {name}")
            elif root == "numba":
                if _module_name(path) != "perseus.solver.kernels":
                    offenders.append(f"{_module_name(path)} imports {name}")
            elif root not in sys.stdlib_module_names and root not in ("numpy", "highspy"):
                offenders.append(f"{_module_name(path)} imports {name}")
    importers = [name for name, imports in _graph().items() if "perseus.solver.kernels" in imports]
    assert not offenders, offenders
    assert not importers, importers


#: The fake GPU: the GpuControl (fake), its model (fake_model) and its profiling probe (fake_probe).
_FAKE_MODULES = (
    "perseus.client.gpu.fake",
    "perseus.client.gpu.fake_model",
    "perseus.client.gpu.fake_probe",
)


def test_rank_side_code_knows_neither_the_server_nor_the_fake() -> None:
    """The rank talks to the planner over HTTP (schemas only) and sees the GPU through its
    protocol: no client module imports the server, the command line or the fake GPU at module
    level (the fake is chosen by ``open_gpu`` from settings, lazily)."""
    offenders = []
    for path in sorted((PACKAGE / "client").rglob("*.py")):
        module = _module_name(path)
        if module in (*_FAKE_MODULES, "perseus.client.profiling.standalone"):
            continue
        for name in _top_level_imports(path):
            if _within(name, "perseus.server", "perseus.cli", *_FAKE_MODULES):
                offenders.append(f"{module} imports {name}")
    assert not offenders, offenders
