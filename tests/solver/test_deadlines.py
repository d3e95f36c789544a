"""The deadline grid and the planning work it implies (:mod:`perseus.solver.deadlines`)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from perseus.solver import MAX_CELLS, compute_frontier, deadline_count
from perseus.solver.deadlines import (
    GRID_CELLS,
    MIN_DEADLINES,
    MIN_RESOLUTION_S,
    TAIL_DEADLINES,
    deadline_grid,
    default_resolution,
    served_deadline,
)
from perseus.solver.fast import ANCHOR_SLOWDOWNS

from .cases import Case, cases, examples


@given(
    st.floats(0.01, 10.0),
    st.floats(0.0, 1.0),
    st.floats(0.0, 1.0),
    st.sampled_from([1e-3, 5e-4, 1e-4]),
)
def test_the_grid_runs_from_fastest_to_slowest_within_the_count(
    t_fast: float, relaxed: float, tail: float, resolution_s: float
) -> None:
    """Ascending from the all-fastest time to the slowest plan's, every step at most the
    resolution up to the relaxed optimum, at most TAIL_DEADLINES after it; with every anchor
    added, never more deadlines than deadline_count promises the server."""
    t_end = t_fast + relaxed
    t_slowest = t_end + tail
    grid = deadline_grid(t_fast, t_end, t_slowest, resolution_s)
    assert grid[0] == t_fast
    assert abs(grid[-1] - t_slowest) <= resolution_s * (1 + 1e-6)
    assert (np.diff(grid) > 0).all()
    before = grid[grid <= t_end + 1e-12]
    assert (np.diff(before) <= resolution_s * (1 + 1e-9)).all()
    assert len(grid) - len(before) <= TAIL_DEADLINES + 1
    assert len(grid) + len(ANCHOR_SLOWDOWNS) <= deadline_count(t_slowest - t_fast, resolution_s)


def test_the_count_is_the_servers_old_formula() -> None:
    """The server sized work as ceil(span / resolution) + 1 + 513 before it imported this."""
    for span_s, resolution_s in ((0.0, 1e-3), (0.1234, 1e-3), (2.5, 1e-4)):
        assert deadline_count(span_s, resolution_s) == int(np.ceil(span_s / resolution_s)) + 514
    assert MAX_CELLS == 400_000_000


@examples(15)
@given(cases())
def test_a_frontier_never_has_more_points_than_the_count(case: Case) -> None:
    frontier = compute_frontier(case.profile(), case.schedule(), p_block_w=case.p_block_w)
    span_s = float(frontier.times_s[-1] - frontier.times_s[0])
    assert len(frontier) <= deadline_count(span_s, 1e-3)


def test_each_point_serves_up_to_the_next_points_time() -> None:
    grid = np.arange(10) * 1e-3 + 1.0
    served = served_deadline(np.asarray([1.0, 1.0035, 1.008]), grid)
    assert served[0] == grid[3] and served[1] == grid[7] and served[2] == np.inf


def test_the_default_spacing_keeps_1_ms_where_that_grid_is_small() -> None:
    """1 ms while the grid stays within GRID_CELLS (every job up to 8 x 96 of the shared
    profiles: 1,536 instructions and spans up to 13.4 s), else a bounded count of deadlines."""
    assert default_resolution(13.4, 1536) == MIN_RESOLUTION_S
    assert default_resolution(0.0, 1) == MIN_RESOLUTION_S
    big = default_resolution(26.4, 16_384)  # 32 x 256 1F1B on the synthetic H200 profile
    assert big == 26.4 / MIN_DEADLINES
    cells = max(GRID_CELLS, 16_384 * MIN_DEADLINES)
    assert 16_384 * deadline_count(26.4, big) <= cells + 16_384 * (TAIL_DEADLINES + 3)


@given(st.floats(0.0, 1e6), st.integers(1, 1 << 20))
def test_the_default_grid_is_bounded_and_follows_the_span(span_s: float, n: int) -> None:
    resolution = default_resolution(span_s, n)
    assert resolution >= MIN_RESOLUTION_S
    assert deadline_count(span_s, resolution) <= max(MIN_DEADLINES, GRID_CELLS // n) + 515
    assert default_resolution(2 * span_s, n) >= resolution


def test_a_frontier_records_its_spacing_and_may_be_coarser_than_1_ms() -> None:
    from perseus.solver import make_schedule, profile_from_rows
    from perseus.solver.synthetic import synthetic_profile

    profile = profile_from_rows(synthetic_profile(4))
    schedule = make_schedule("1f1b", 4, 8)
    assert compute_frontier(profile, schedule, p_block_w=100.0).resolution_s == 1e-3
    coarse = compute_frontier(profile, schedule, p_block_w=100.0, resolution_s=0.02)
    assert coarse.resolution_s == 0.02
    assert (np.diff(coarse.times_s) > 0).all()
