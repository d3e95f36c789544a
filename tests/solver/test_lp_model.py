"""What the linear programs share (:mod:`perseus.solver.lp_model`): the lower convex hull
against a brute-force one, the precedence rows on a DAG small enough to write out, the
compressed rows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from perseus.solver import build_costs, build_dag, make_schedule
from perseus.solver.lp_model import SparseRows, hull_mask, hull_options, lower_hull, precedence_rows

from .cases import Case, cases, examples

Point = tuple[int, int]


def brute_force_hull(points: list[Point]) -> list[Point]:
    """Vertices of the lower convex hull of points with distinct times, time ascending: the
    first and last point, and every point strictly below each chord over it (in integers,
    so collinear points are decided exactly). O(n^3)."""
    vertices = []
    for k, (tk, ek) in enumerate(points):
        if 0 < k < len(points) - 1 and not all(
            (ek - ei) * (tj - ti) < (ej - ei) * (tk - ti)
            for ti, ei in points[:k]
            for tj, ej in points[k + 1 :]
        ):
            continue
        vertices.append((tk, ek))
    return vertices


def hull_of(points: list[Point]) -> list[int]:
    times = np.asarray([t for t, _ in points], dtype=np.float64)
    effective = np.asarray([e for _, e in points], dtype=np.float64)
    return lower_hull(times, effective)


# Small integers: exact in floats, and many points fall on one line.
distinct_points = st.lists(
    st.tuples(st.integers(0, 12), st.integers(-6, 6)),
    min_size=1,
    max_size=9,
    unique_by=lambda p: p[0],
).map(sorted)


@examples(200)
@given(distinct_points)
@example([(0, 0), (1, -1), (2, -2), (3, -3)])  # all on one line: only the ends
@example([(0, 3), (1, 1), (2, 0), (3, 0), (4, 0)])  # a flat tail
@example([(0, 0)])
def test_lower_hull_is_the_brute_force_hull(points: list[Point]) -> None:
    hull = hull_of(points)
    assert hull == sorted(set(hull)), "indices ascending, each once"
    assert [points[i] for i in hull] == brute_force_hull(points)


@examples(100)
@given(distinct_points.filter(lambda p: len(p) >= 2), st.data())
def test_lower_hull_of_repeated_points_is_the_hull_of_the_distinct_ones(
    points: list[Point], data: st.DataObject
) -> None:
    """A point given twice (time and energy equal) is one vertex at most."""
    repeats = data.draw(st.lists(st.integers(1, 3), min_size=len(points), max_size=len(points)))
    repeated = [p for p, r in zip(points, repeats, strict=True) for _ in range(r)]
    hull = hull_of(repeated)
    assert hull == sorted(hull)
    assert [repeated[i] for i in hull] == brute_force_hull(points)


@examples(25)
@given(cases(schedules=("1f1b", "interleaved-1f1b"), ragged=True))
def test_hull_options_and_mask_are_each_class_lower_hull(case: Case) -> None:
    costs = build_costs(case.profile(), case.schedule(), case.p_block_w)
    options = hull_options(costs)
    mask = hull_mask(costs)
    assert len(options) == len(costs.start) - 1
    for c, hull in enumerate(options):
        lo, hi = int(costs.start[c]), int(costs.start[c + 1])
        assert hull.tolist() == lower_hull(costs.time_s[lo:hi], costs.effective_j[lo:hi])
        assert hull[0] == 0 and hull[-1] == hi - lo - 1  # fastest and slowest are vertices
        assert np.flatnonzero(mask[lo:hi]).tolist() == hull.tolist()


def test_precedence_rows_of_a_two_stage_pipeline() -> None:
    """1F1B on 2 GPUs, one microbatch: F0 (node 0) -> F1 (2) -> B1 (3) -> B0 (1), and F0 ->
    B0 on GPU 0. Columns: finish times C0..C3, then T (4), then one duration column per node."""
    dag = build_dag(make_schedule("1f1b", 2, 1))
    n = dag.size
    assert n == 4
    duration_cols = [[(n + 1 + j, 1.0)] for j in range(n)]
    matrix, row_node = precedence_rows(dag, duration_cols, 2 * n + 1)
    dense = np.zeros(matrix.shape)
    for r in range(matrix.shape[0]):
        lo, hi = matrix.indptr[r], matrix.indptr[r + 1]
        dense[r, matrix.indices[lo:hi]] = matrix.data[lo:hi]
    # C_p - C_j + d_j <= -const_j per edge p -> j (a source: -C_j + d_j), C_j - T <= 0 per sink
    #         C0  C1  C2  C3   T  d0  d1  d2  d3
    expected = {
        (0, "-"): [-1, 0, 0, 0, 0, 1, 0, 0, 0],
        (1, 0): [1, -1, 0, 0, 0, 0, 1, 0, 0],
        (1, 3): [0, -1, 0, 1, 0, 0, 1, 0, 0],
        (2, 0): [1, 0, -1, 0, 0, 0, 0, 1, 0],
        (3, 2): [0, 0, 1, -1, 0, 0, 0, 0, 1],
        ("sink", 1): [0, 1, 0, 0, -1, 0, 0, 0, 0],
    }
    assert matrix.shape == (len(expected), 2 * n + 1)
    assert sorted(row_node.tolist()) == [-1, 0, 1, 1, 2, 3]
    assert sorted(map(tuple, dense.tolist())) == sorted(
        tuple(map(float, r)) for r in expected.values()
    )
    for r, j in enumerate(row_node.tolist()):
        if j >= 0:
            assert dense[r, j] == -1.0 and dense[r, n + 1 + j] == 1.0
        else:
            assert dense[r, n] == -1.0
    for r in range(matrix.shape[0]):  # column indices sorted within each row
        row = matrix.indices[matrix.indptr[r] : matrix.indptr[r + 1]]
        assert (np.diff(row) > 0).all()


def test_sparse_rows_from_entries_and_stacked() -> None:
    top = SparseRows.from_entries([1, 0, 1], [2, 1, 0], [3.0, 1.0, 2.0], (3, 3))
    assert top.indptr.tolist() == [0, 1, 3, 3]  # the last row empty
    assert top.indices.tolist() == [1, 0, 2]
    assert top.data.tolist() == [1.0, 2.0, 3.0]
    both = top.stacked(SparseRows.from_entries([0], [2], [4.0], (1, 3)))
    assert both.shape == (4, 3)
    assert both.indptr.tolist() == [0, 1, 3, 3, 4]
    assert both.indices.tolist() == [1, 0, 2, 2]
    assert both.data.tolist() == [1.0, 2.0, 3.0, 4.0]
    with pytest.raises(ValueError, match="given twice"):
        SparseRows.from_entries([0, 0], [1, 1], [1.0, 2.0], (1, 2))
