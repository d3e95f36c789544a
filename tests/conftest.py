"""Set-up of the whole test session."""

from __future__ import annotations

import subprocess
import sys

import pytest


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the solver's kernels into their cache (the per-user folder of
    ``perseus.solver.kernel_cache``) once, before any test: every planner
    server the tests start loads them in each planning process ahead of its jobs
    (``perseus.server.planning.worker.warm_up``), which takes 6-15 s where the cache is empty (a
    fresh
    clone) and would count against the first job's time limit. In a process of its own, so
    that this one keeps numpy's passes for small DAGs."""
    subprocess.run(
        [sys.executable, "-c", "from perseus.solver.planner import warm_kernels; warm_kernels()"],
        check=True,
        timeout=300,
    )
