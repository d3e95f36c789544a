"""The one exception tree: the tree drawn in ``perseus.core.errors``' docstring is the classes' own,
and the errors that carry more than a message keep it."""

from __future__ import annotations

import pickle
import re

import pytest

import perseus.core.errors as errors
from perseus.core.errors import (
    AuthError,
    PerseusError,
    PlanningTooLarge,
    PlanNotReady,
    RequestRejected,
)


def drawn_tree() -> dict[str, str]:
    """Each class the docstring's tree draws, with the class it is drawn under."""
    doc = errors.__doc__ or ""
    block = doc.split("::\n\n", 1)[1].split("\n\n", 1)[0]  # the literal block: the tree
    parents: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in block.splitlines():
        found = re.search(r"[A-Za-z]\w*", line)
        assert found, line
        depth, name = found.start(), found.group()
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if stack:
            parents[name] = stack[-1][1]
        stack.append((depth, name))
    return parents


def test_the_drawn_tree_is_the_class_tree() -> None:
    drawn = drawn_tree()
    assert set(drawn) | {"PerseusError"} == set(errors.__all__)
    for name, parent in drawn.items():
        cls = getattr(errors, name)
        assert cls.__bases__ == (getattr(errors, parent),), name


def test_every_error_is_a_perseus_error_and_an_exception() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, PerseusError) and issubclass(cls, Exception)
        assert cls.__doc__, f"{name} has no docstring"


def test_errors_keep_what_they_carry() -> None:
    too_large = PlanningTooLarge("too much", cells=10, max_cells=5)
    assert str(too_large) == "too much" and (too_large.cells, too_large.max_cells) == (10, 5)
    not_ready = PlanNotReady("wait", "profiling", retry_after_s=2.5)
    assert isinstance(not_ready, errors.JobStateError)
    assert (not_ready.state, not_ready.retry_after_s) == ("profiling", 2.5)
    assert PlanNotReady("wait", "planning").retry_after_s is None
    assert AuthError("no token").status_code == 401
    assert AuthError("wrong", 403).status_code == 403
    assert RequestRejected("bad").status_code == 422


# Errors that carry more than a message, built with everything they carry; every other class
# is built from a message alone.
CARRYING: dict[str, PerseusError] = {
    "PlanningTooLarge": PlanningTooLarge("too much", cells=10, max_cells=5),
    "AuthError": AuthError("wrong", 403),
    "RequestRejected": RequestRejected("bad", 413),
    "PlanNotReady": PlanNotReady("wait", "profiling", retry_after_s=2.5),
    "ZeusdRefused": errors.ZeusdRefused("no", 403),
}


def every_error() -> list[PerseusError]:
    """One instance of every class in ``perseus.core.errors``."""
    return [
        CARRYING.get(name) or getattr(errors, name)(f"{name}: what went wrong")
        for name in errors.__all__
    ]


def test_errors_that_carry_more_are_built_with_it() -> None:
    """A class whose constructor takes more than a message is listed in CARRYING, so the
    round trip below checks what it carries (not only its defaults)."""
    for name in errors.__all__:
        init = getattr(errors, name).__init__
        if init is not Exception.__init__:
            assert name in CARRYING, name


@pytest.mark.parametrize("error", every_error(), ids=lambda error: type(error).__name__)
def test_errors_survive_a_trip_between_processes(error: PerseusError) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error)
    assert back.args == error.args
    assert vars(back) == vars(error)
