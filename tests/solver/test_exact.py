"""What an exact sweep's time limit cut short: :class:`~perseus.solver.exact.ExactSweep`.

The limit is a wall clock; a fake one (one second per reading) makes the cut deterministic.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest

import perseus
from perseus.solver import compute_frontier, load_profile, make_schedule, profile_from_rows
from perseus.solver import exact as exact_module
from perseus.solver.exact import ExactSweep, recorded_sweeps
from perseus.solver.programs import ExactSolution

EXAMPLE = Path(perseus.__file__).parent / "data" / "example_profile.csv"
# A small pipeline whose whole exact sweep takes well under a second: 2 stages, 3 clocks.
SMALL = [
    (stage, kind, mhz, base * 1980 / mhz, base * (40 + mhz / 10))
    for stage in (0, 1)
    for kind, base in (("forward", 0.02 + 0.01 * stage), ("backward", 0.04))
    for mhz in (1980, 1500, 1005)
]


def _small_frontier():  # type: ignore[no-untyped-def]
    return compute_frontier(
        profile_from_rows(SMALL), make_schedule("1f1b", 2, 3), p_block_w=60.0, exact=True,
        exact_time_limit_s=600.0,
    )  # fmt: skip


def _fake_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every reading of the sweep's clock is one second later; the estimate lets it start."""
    readings = iter(range(10**6))
    monkeypatch.setattr(
        exact_module, "time", types.SimpleNamespace(monotonic=lambda: float(next(readings)))
    )
    monkeypatch.setattr(exact_module, "exact_estimate_s", lambda *args: 0.0)


def test_a_sweep_the_limit_ends_says_how_many_deadlines_it_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_clock(monkeypatch)
    profile = load_profile(EXAMPLE)
    with recorded_sweeps() as sweeps:
        frontier = compute_frontier(
            profile, make_schedule("1f1b", 4, 1), p_block_w=100.0, exact=True,
            exact_time_limit_s=3.5,
        )  # fmt: skip
    assert len(sweeps) == 1, sweeps
    sweep = sweeps[0]
    # readings at 1, 2 and 3 s leave time for a solve each; at 4 s the limit has passed
    assert sweep.solves == 3 and sweep.time_limit_s == 3.5
    assert 0 < sweep.unsolved < sweep.deadlines
    assert sweep.partial
    assert len(frontier) > sweep.solves  # the fast frontier's points stand for the rest


def test_a_sweep_within_its_limit_is_complete() -> None:
    with recorded_sweeps() as sweeps:
        _small_frontier()
    assert [s.partial for s in sweeps] == [False], sweeps
    assert sweeps[0].unsolved == 0 and sweeps[0].stopped == 0 and sweeps[0].solves >= 1


def test_solves_the_limit_stopped_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A solve that the limit stops before it proves optimality keeps its plan and is counted."""
    original = exact_module.ExactProgram.solve
    calls = []

    def stopped_first(self, deadline_s, *args, **kwargs):  # type: ignore[no-untyped-def]
        solution = original(self, deadline_s, *args, **kwargs)
        if kwargs.get("node_limit") == 1:  # the estimate's timed root
            return solution
        calls.append(deadline_s)
        if len(calls) == 1:
            return ExactSolution(
                solution.choice, solution.bound_j * 0.99, solution.nodes, optimal=False
            )
        return solution

    monkeypatch.setattr(exact_module.ExactProgram, "solve", stopped_first)
    with recorded_sweeps() as sweeps:
        frontier = _small_frontier()
    assert [(s.stopped, s.unsolved, s.partial) for s in sweeps] == [(1, 0, True)]
    assert float(frontier.gaps.max()) > 0  # the stopped solve's proven gap stands


def test_nothing_is_recorded_outside_the_block() -> None:
    with recorded_sweeps() as sweeps:
        pass
    _small_frontier()
    assert sweeps == []
    assert ExactSweep(None, 3, 2, 0, 0).partial is False
