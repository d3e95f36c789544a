"""Where the compiled kernels are cached, and the solver without numba."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import perseus
from perseus.solver import kernel_cache

PACKAGE = Path(perseus.__file__).parent
ROOT = PACKAGE.parent

# A child process's preamble: this checkout's perseus first; with BLOCK, numba cannot be
# imported (a finder that refuses it, as if it were not installed).
_PREAMBLE = """
import sys
sys.path.insert(0, {root!r})
if {block!r}:
    class _NoNumba:
        def find_spec(self, name, path=None, target=None):
            if name == "numba" or name.startswith("numba."):
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None
    sys.meta_path.insert(0, _NoNumba())
"""

_FRONTIERS = """
import json
import numpy as np
from perseus.solver import compute_frontier, make_schedule
from perseus.solver import planner
from perseus.solver.synthetic import example_profile

out = {"warm": planner.warm_kernels() if WARM else None}
for name, microbatches, chunks in (("1f1b", 8, 1), ("interleaved-1f1b", 8, 2), ("zbv", 8, 2)):
    frontier = compute_frontier(example_profile(), make_schedule(name, 4, microbatches, chunks),
                                p_block_w=100.0, clock_change_margin_s=5e-3)
    out[name] = [np.asarray(getattr(frontier, f)).tolist()
                 for f in ("times_s", "energies_j", "gaps", "frequencies_mhz")]
print(json.dumps(out))
"""

_NO_NUMBA_CHECKS = """
import numpy as np
import pytest
from perseus.solver import build_costs, build_dag, kernel_cache, make_schedule, planner
from perseus.solver.synthetic import example_profile

assert "numba" not in sys.modules
assert not kernel_cache.numba_installed() and not kernel_cache.ready()
assert not kernel_cache.compile_later()
assert planner.warm_kernels() is False
schedule = make_schedule("1f1b", 4, 128)
dag = build_dag(schedule)
assert dag.size >= planner.COMPILED_FROM
costs = build_costs(example_profile(), schedule, 100.0)
assert not planner.Planner(dag, costs).compiled
with pytest.raises(ImportError):
    planner.Planner(dag, costs, compiled=True)
assert "numba" not in sys.modules
print("ok")
"""


def _run(code: str, env: dict[str, str] | None = None, block: bool = False) -> str:
    preamble = _PREAMBLE.format(root=str(ROOT), block=block)
    return subprocess.run(
        [sys.executable, "-c", preamble + code], check=True, capture_output=True, text=True,
        timeout=600, env={**os.environ, **(env or {})},
    ).stdout  # fmt: skip


def test_cache_root_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PERSEUS_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert kernel_cache.cache_root() == tmp_path / "home" / ".cache" / "perseus"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/is/ignored")
    assert kernel_cache.cache_root() == tmp_path / "home" / ".cache" / "perseus"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert kernel_cache.cache_root() == tmp_path / "xdg" / "perseus"
    monkeypatch.setenv("PERSEUS_CACHE_DIR", str(tmp_path / "mine"))
    assert kernel_cache.cache_root() == tmp_path / "mine"
    assert kernel_cache.numba_cache_dir() == tmp_path / "mine" / "numba"
    assert (tmp_path / "mine" / "numba").is_dir()


def test_an_unwritable_cache_is_no_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Where the folder cannot be made (a file in its way), nothing is cached, nothing is
    marked ready and nothing compiles for later (the kernels would compile in memory)."""
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("PERSEUS_CACHE_DIR", str(blocked))
    assert kernel_cache.numba_cache_dir() is None
    assert not kernel_cache.ready()
    kernel_cache.mark_ready()
    assert not kernel_cache.ready()
    monkeypatch.setattr(kernel_cache, "_started", [])
    assert not kernel_cache.compile_later()


def test_without_numba_the_solver_plans_the_same_frontier() -> None:
    """With numba not importable the solver plans with numpy's passes, every DAG (large ones
    too), warm_kernels says so and compiles nothing, and the frontiers (clock-change
    transitions included) equal those planned with the kernels loaded, bit for bit."""
    assert _run(_NO_NUMBA_CHECKS, block=True).split() == ["ok"]
    without = json.loads(_run(_FRONTIERS.replace("WARM", "True"), block=True))
    assert without.pop("warm") is False
    if not kernel_cache.numba_installed():
        pytest.skip("numba is not installed: nothing to compare against")
    with_kernels = json.loads(_run(_FRONTIERS.replace("WARM", "True")))
    assert with_kernels.pop("warm") is True
    assert without == with_kernels


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file() and p.suffix != ".pyc"
    }


_ONE_OFF = """
from perseus.solver import build_costs, build_dag, kernel_cache, make_schedule
from perseus.solver.planner import Planner
from perseus.solver.synthetic import example_profile

schedule = make_schedule("1f1b", 4, 128)
planner = Planner(build_dag(schedule), build_costs(example_profile(), schedule, 100.0))
print(planner.compiled, kernel_cache.ready(), bool(kernel_cache._started))
"""


def test_a_fresh_cache_plans_with_numpy_compiles_for_later_and_leaves_the_package_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an empty cache (a fresh installation) a large DAG plans with numpy's passes and
    starts a compile for the next process, which runs once the first has exited and fills the
    per-user cache; the next process loads the kernels from there. No file of the installed
    package changes, and numba writes nothing into it."""
    pytest.importorskip("numba")
    env = {"PERSEUS_CACHE_DIR": str(tmp_path / "cache"), "PYTHONDONTWRITEBYTECODE": "1"}
    monkeypatch.delenv("PERSEUS_COMPILE_KERNELS", raising=False)
    before = _snapshot(PACKAGE)
    assert _run(_ONE_OFF, env).split() == ["False", "False", "True"]
    numba_dir = tmp_path / "cache" / "numba"
    deadline = time.monotonic() + 600
    while not any(numba_dir.glob("ready-*")) or (numba_dir / "compiling").exists():
        assert time.monotonic() < deadline, "the compile for later did not finish"
        time.sleep(0.5)
    assert list(numba_dir.rglob("*.nbi")) and list(numba_dir.rglob("*.nbc"))
    assert _run(_ONE_OFF, env).split() == ["True", "True", "False"]
    after = _snapshot(PACKAGE)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, changed
    assert not [p for p in PACKAGE.rglob("*") if p.suffix in (".nbi", ".nbc")]
