"""The package's shape, drawn from its imports: no cycles, and each floor's allowed arrows.

Data flows profile -> solver -> server -> client -> GPU; the ground floor (``perseus.core``)
holds the vocabulary every side shares, the wire models and the file formats sit on it, and the
command line sits on top. Every import counts as an arrow, those inside functions (lazy loads)
included; ``if TYPE_CHECKING:`` blocks are for the type checker alone and do not.

The floors, and what each may import (besides the standard library and itself):

- ``perseus.core``: nothing else;
- ``perseus.wire``: core and pydantic;
- ``perseus.formats``: core, pydantic and numpy; ``perseus.formats.profiles`` (what a rank
  reads a saved profile with) the standard library and core only, and
  ``perseus.formats.plan_files`` also the solver, whose frontiers and schedules its files hold;
- ``perseus.solver``: core, the profile files, numpy and highspy; numba only in its kernels;
- the rank side (``perseus.client`` outside ``integrations``): no solver, server, command line,
  numba, highspy or matplotlib, however deep the imports go;
- nothing outside ``perseus.cli`` imports the command line (``tests/cli/test_layering.py``).
"""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from functools import cache
from pathlib import Path

import perseus

PACKAGE = Path(perseus.__file__).parent
_STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


@cache
def _imports(path: Path, *, lazy: bool = True) -> frozenset[str]:
    """Modules ``path`` imports (and ``module.name`` for each name it takes from one).

    Args:
        lazy: Count imports inside functions and classes too; False: module level only.
            ``if TYPE_CHECKING:`` blocks never count.
    """
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            taken = {f"{base}.{alias.name}" for alias in node.names}
            names.update(taken)
            if not taken <= _modules().keys():  # names, not only submodules, from base
                names.add(base)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
        elif not lazy and isinstance(
            node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda
        ):
            return
        else:
            for child in ast.iter_child_nodes(node):
                visit(child)

    visit(tree)
    return frozenset(names)


def _within(name: str, *packages: str) -> bool:
    """``name`` is one of ``packages`` or inside one (``perseus.client`` is not ``perseus.cli``)."""
    return any(name == p or name.startswith(p + ".") for p in packages)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py") if p.name != "__main__.py"}


def _graph(*, lazy: bool = True) -> dict[str, set[str]]:
    modules = _modules()
    return {
        name: {m for m in _imports(path, lazy=lazy) if m in modules and m != name}
        for name, path in modules.items()
    }


def _loaded_by(start: str) -> set[str]:
    """Every name importing ``start`` can load, lazy imports included: the modules it imports,
    their parent packages (importing ``a.b`` runs ``a``), and so on (third-party names as
    imported, not followed)."""
    modules = _modules()
    seen: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        if name in modules:
            todo += _imports(modules[name])
    return seen


def _rank_side() -> list[str]:
    return sorted(
        name
        for name in _modules()
        if _within(name, "perseus.client") and not _within(name, "perseus.client.integrations")
    )


def _offenders(
    package: str, allowed_perseus: tuple[str, ...], allowed_roots: tuple[str, ...]
) -> list[str]:
    """``package``'s imports that are neither the standard library, ``allowed_roots`` (top-level
    third-party names) nor inside ``allowed_perseus`` (lazy imports included)."""
    found = []
    for name, path in sorted(_modules().items()):
        if not _within(name, package):
            continue
        for imported in sorted(_imports(path)):
            root = imported.split(".")[0]
            if root == "perseus":
                if not _within(imported, package, *allowed_perseus):
                    found.append(f"{name} imports {imported}")
            elif root not in _STDLIB and root not in allowed_roots:
                found.append(f"{name} imports {imported}")
    return found


def test_the_package_has_no_import_cycle() -> None:
    """Not at module level, and not through imports inside functions either."""
    for lazy in (False, True):
        graph = _graph(lazy=lazy)
        try:
            tuple(graphlib.TopologicalSorter(graph).static_order())
        except graphlib.CycleError as err:
            kind = "through imports in functions" if lazy else "at module level"
            raise AssertionError(f"import cycle {kind}: {' -> '.join(err.args[1])}") from None


def test_the_walk_sees_every_folder() -> None:
    """The checks here would pass vacuously if the walk saw nothing."""
    folders = {name.split(".")[1] for name in _graph() if name.count(".") >= 1}
    assert {"core", "wire", "formats", "client", "server", "solver", "cli"} <= folders
    assert "perseus.client.rank" in _rank_side()
    # lazy imports are seen: the command line loads its commands' modules in functions
    assert "perseus.solver" in _imports(PACKAGE / "cli" / "plan.py")
    assert "perseus.solver" not in _imports(PACKAGE / "cli" / "plan.py", lazy=False)


def test_the_ground_floor_imports_only_the_standard_library() -> None:
    assert not _offenders("perseus.core", (), ())


def test_the_wire_imports_only_the_ground_floor_and_pydantic() -> None:
    assert not _offenders("perseus.wire", ("perseus.core",), ("pydantic",))


def test_the_file_formats_sit_on_the_ground_floor() -> None:
    """Profile files: standard library and core only (a rank reads a saved profile with them);
    frontier and plan files: also pydantic, numpy and the solver (their models hold its
    frontiers and schedules)."""
    assert not _offenders("perseus.formats.profiles", ("perseus.core",), ())
    allowed = ("perseus.core", "perseus.formats", "perseus.solver")
    assert not _offenders("perseus.formats", allowed, ("pydantic", "numpy"))


def test_the_solver_is_a_pure_core() -> None:
    """The solver imports the standard library, numpy, highspy, the ground floor and the
    profile files (the shipped example profile; the old names of the profile functions): no
    plan files, wire, HTTP, plotting or GPU; numba only in its compiled kernels, which nothing
    imports at module level (numba takes half a second to import, and every process that reads
    a profile used to import perseus.solver)."""
    offenders = _offenders(
        "perseus.solver",
        ("perseus.core", "perseus.formats.profiles"),
        ("numpy", "highspy", "numba"),
    )
    for name, path in _modules().items():
        if _within(name, "perseus.solver") and name != "perseus.solver.kernels":
            offenders += [f"{name} imports {m}" for m in _imports(path) if _within(m, "numba")]
    importers = [
        name for name, imports in _graph(lazy=False).items() if "perseus.solver.kernels" in imports
    ]
    assert not offenders, offenders
    assert not importers, importers


def test_the_solver_knows_no_floor_above_it() -> None:
    offenders = [
        f"{name} loads {loaded}"
        for name in _modules()
        if _within(name, "perseus.solver")
        for loaded in _loaded_by(name)
        if _within(loaded, "perseus.server", "perseus.client", "perseus.cli", "perseus.wire")
    ]
    assert not offenders, offenders


#: What a training node does not install (``perseus-planner[client]``), nor may a rank load.
_PLANNER_ONLY = ("perseus.solver", "perseus.server", "perseus.cli", "numba", "llvmlite", "highspy")
_PLANNER_ONLY += ("matplotlib", "perseus.formats.plan_files", "perseus.plots")


def test_the_rank_side_loads_nothing_of_the_planner() -> None:
    """However deep the imports go, lazy ones included: every module of ``perseus/client``
    outside ``integrations``, and the integrations too (they run on training nodes)."""
    offenders = []
    for name in _modules():
        if not _within(name, "perseus.client"):
            continue
        loaded = _loaded_by(name)
        offenders += [f"{name} loads {m}" for m in sorted(loaded) if _within(m, *_PLANNER_ONLY)]
    assert not offenders, offenders


def test_the_rank_side_needs_no_numpy() -> None:
    """A training node installs pydantic, httpx and nvidia-ml-py for the rank side (numpy only
    with the torch integrations, whose profiling reruns restore numpy's random state)."""
    allowed = ("perseus", "pydantic", "httpx", "pynvml", "torch")
    offenders = [
        f"{name} loads {m}"
        for name in _rank_side()
        for m in sorted(_loaded_by(name))
        if m.split(".")[0] not in _STDLIB and m.split(".")[0] not in allowed
    ]
    assert not offenders, offenders


def test_importing_the_rank_loads_none_of_the_planner() -> None:
    """What ``import perseus.client.rank`` really loads, in a fresh interpreter."""
    forbidden = ("numba", "llvmlite", "highspy", "matplotlib", "numpy", "perseus.solver")
    code = (
        "import sys, perseus.client.rank, perseus.client.lifecycle\n"
        f"print('\\n'.join(m for m in sys.modules if m.split('.')[0] in {forbidden!r}"
        f" or m.startswith('perseus.solver')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == []


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
        for name in _imports(path, lazy=False):
            if _within(name, "perseus.server", "perseus.cli", *_FAKE_MODULES):
                offenders.append(f"{module} imports {name}")
    assert not offenders, offenders
