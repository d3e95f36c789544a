"""The linear programs of :mod:`perseus.solver.programs` (the MILPs: test_milp.py)."""

from __future__ import annotations

import numpy as np
import pytest

from perseus.solver import make_schedule, profile_from_rows


def test_weighted_relaxation_scales_the_slopes_only_inside_the_block() -> None:
    """Inside ``weighted`` the relaxation optimises the scaled energy slopes (doubling every
    slope doubles what slowing saves, so the value moves); outside it, the real ones."""
    from perseus.solver import build_costs, build_dag
    from perseus.solver.programs import Relaxation

    rows = [(g, kind, f, t * (1 + 0.2 * g) * (2 if kind == "backward" else 1), e)
            for g in range(2) for kind in ("forward", "backward")
            for f, t, e in ((1980, 0.05, 12.0), (1500, 0.07, 10.0), (1200, 0.09, 9.5))]  # fmt: skip
    profile, schedule = profile_from_rows(rows), make_schedule("1f1b", 2, 3)
    dag = build_dag(schedule)
    relaxation = Relaxation(dag, build_costs(profile, schedule, 20.0))
    plain = relaxation.solve(None)
    with relaxation.weighted(np.full(dag.size, 2.0)):
        doubled = relaxation.solve(None)
    again = relaxation.solve(None)
    assert doubled.value_j < plain.value_j - 1e-6
    assert again.value_j == pytest.approx(plain.value_j, rel=1e-12)
