"""The command line sits on top: no module outside ``perseus/cli`` imports it.

``__main__`` modules are programs, not modules anything imports (``python -m perseus.server``
is ``perseus serve``); they may name the command line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import perseus

PACKAGE = Path(perseus.__file__).parent


def _imported(tree: ast.Module, module: str) -> set[str]:
    """The modules ``tree`` (the source of ``module``) imports, relative imports resolved."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".")[: -node.level]
                base = ".".join([*parent, base] if base else parent)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_nothing_outside_the_cli_imports_it() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent)
        if relative.parts[1] == "cli" or path.name == "__main__.py":
            continue
        module = ".".join(relative.with_suffix("").parts)
        for name in _imported(ast.parse(path.read_text(), str(path)), module):
            if name == "perseus.cli" or name.startswith("perseus.cli."):
                offenders.append(f"{relative} imports {name}")
    assert not offenders, offenders


def test_the_walk_sees_the_packages_modules() -> None:
    """The check above would pass vacuously if it walked nothing."""
    walked = {p.relative_to(PACKAGE).parts[0] for p in PACKAGE.rglob("*.py")}
    assert {"client", "server", "solver", "cli"} <= walked
