"""A job's lifecycle (perseus.core.jobs): the one transition table by its properties, the
function that applies it, and no module outside it writing a state as a string."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path
from typing import get_args

import pytest

import perseus
from perseus.core import jobs
from perseus.core.errors import JobStateError
from perseus.core.jobs import CREATED, TRANSITIONS, JobState, transition
from perseus.wire.common import JobState as WireJobState

PERSEUS = Path(perseus.__file__).parent
VALUES = {state.value for state in JobState}


def reachable(start: JobState) -> set[JobState]:
    seen = {start}
    frontier = [start]
    while frontier:
        for to in TRANSITIONS[frontier.pop()]:
            if to not in seen:
                seen.add(to)
                frontier.append(to)
    return seen


def test_the_docstring_draws_the_table() -> None:
    block = (jobs.__doc__ or "").split("::\n\n", 1)[1].split("\n\n", 1)[0]
    drawn = {}
    for line in block.splitlines():
        current, exits = line.split("->")
        drawn[JobState(current.strip())] = frozenset(JobState(s.strip()) for s in exits.split(","))
    assert drawn == dict(TRANSITIONS)


def test_the_table_has_a_row_for_every_state() -> None:
    assert set(TRANSITIONS) == set(JobState)
    assert all(to in JobState for exits in TRANSITIONS.values() for to in exits)


def test_every_state_is_reachable_from_creation() -> None:
    assert reachable(CREATED) == set(JobState)


def test_nothing_leads_back_to_creation() -> None:
    assert not any(CREATED in exits for exits in TRANSITIONS.values())


def test_terminal_states_have_no_exits_and_every_other_state_can_end_ready() -> None:
    """A state with no exits is terminal; this lifecycle has none (a ready job replans on
    re-reported profiles, a failed one on a corrected profile or policy): every state can
    still reach ``ready``, so no job is stuck where no plan can come."""
    terminal = {state for state, exits in TRANSITIONS.items() if not exits}
    assert terminal == set()
    for state in JobState:
        assert JobState.READY in reachable(state), state


@pytest.mark.parametrize(
    ("current", "to"), list(itertools.product(JobState, JobState)), ids=lambda s: str(s)
)
def test_transition_follows_the_table_and_names_both_states(
    current: JobState, to: JobState
) -> None:
    if to in TRANSITIONS[current]:
        assert transition(current, to) is to
        assert transition(current.value, to) is to  # as stored: the plain text
        return
    with pytest.raises(JobStateError) as refused:
        transition(current, to)
    assert f"from {current.value} to {to.value}" in str(refused.value)


def test_a_state_that_is_none_is_refused() -> None:
    with pytest.raises(JobStateError, match="'done', not a job state"):
        transition("done", JobState.READY)


def test_the_wire_carries_exactly_these_states_in_order() -> None:
    assert get_args(WireJobState) == tuple(JobState)
    assert [state.value for state in JobState] == [
        "registering",
        "profiling",
        "planning",
        "ready",
        "failed",
    ]


def _is_state(node: ast.expr) -> bool:
    """``x.state``, ``state``, or a column ``JOBS.c.state``."""
    return (isinstance(node, ast.Attribute) and node.attr == "state") or (
        isinstance(node, ast.Name) and node.id == "state"
    )


def _state_strings(node: ast.expr) -> list[str]:
    """State values written as strings in ``node`` (a constant, or a tuple/list/set of them)."""
    if isinstance(node, ast.Constant) and node.value in VALUES:
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [v for element in node.elts for v in _state_strings(element)]
    if isinstance(node, ast.IfExp):
        return _state_strings(node.body) + _state_strings(node.orelse)
    return []


def state_strings(tree: ast.Module) -> list[tuple[int, str]]:
    """Where a module sets or compares a job's state with a string: ``state="ready"``,
    ``job.state = "ready"``, ``job.state == "ready"``, ``job.state in ("ready", ...)``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "state":
            found += [(node.value.lineno, v) for v in _state_strings(node.value)]
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.value is not None and any(_is_state(t) for t in targets):
                found += [(node.lineno, v) for v in _state_strings(node.value)]
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_is_state(o) for o in operands):
                found += [(node.lineno, v) for o in operands for v in _state_strings(o)]
    return sorted(found)


def test_no_module_outside_the_table_writes_a_state_as_a_string() -> None:
    """Every state is a :class:`JobState` member, so each move is one the type checker and
    :func:`transition` see (the wire spells the members, never their text)."""
    table = Path(jobs.__file__)
    found = [
        f"{path.relative_to(PERSEUS.parent)}:{line}: {value!r}"
        for path in sorted(PERSEUS.rglob("*.py"))
        if path != table
        for line, value in state_strings(ast.parse(path.read_text(), str(path)))
    ]
    assert not found, found


def test_the_finder_finds_what_it_looks_for() -> None:
    source = (
        'replace(job, state="ready")\n'
        'job.state = "failed"\n'
        'if job.state in ("planning", "x"): pass\n'
        'query.where(JOBS.c.state == "planning")\n'
        'replace(job, state="profiling" if done else job.state)\n'
        'phase = "profiling"\n'  # not a state: a phase
    )
    assert state_strings(ast.parse(source)) == [
        (1, "ready"),
        (2, "failed"),
        (3, "planning"),
        (4, "planning"),
        (5, "profiling"),
    ]
