"""The schedule DAG of :mod:`perseus.solver.dag`."""

from __future__ import annotations

import numpy as np
import pytest

from perseus.solver import make_schedule

ALL_SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b")


@pytest.mark.parametrize("name", ALL_SCHEDULES)
def test_levels_order_the_dag(name: str) -> None:
    """Every node sits in a later level than its predecessors and an earlier back level than
    its successors' (sinks first), and the levels hold every node once."""
    from perseus.solver import build_dag

    dag = build_dag(make_schedule(name, 4, 8, 2 if name == "interleaved-1f1b" else 1))
    n = dag.size
    for levels, links in ((dag.levels, dag.pred), (dag.back_levels, dag.succ)):
        assert sorted(np.concatenate(levels).tolist()) == list(range(n))
        rank = np.full(n + 1, -1)
        for k, level in enumerate(levels):
            rank[level] = k
        for j in range(n):
            for other in links[j]:
                if other != n:
                    assert rank[other] < rank[j], (j, other)
