"""The one exception tree: the tree drawn in ``perseus.core.errors``' docstring is the classes' own,
every exception class of perseus is in it, the errors that carry more than a message keep it,
and the one status table names classes of the tree."""

from __future__ import annotations

import ast
import builtins
import pickle
import re
from pathlib import Path

import pytest

import perseus.core.errors as errors
from perseus.core.errors import (
    HTTP_STATUS,
    AuthError,
    PerseusError,
    PlanningTooLarge,
    PlanNotReady,
    PlanTooLarge,
    RequestFieldError,
    RequestRejected,
    error_named,
    http_status,
)

PERSEUS = Path(errors.__file__).parents[1]
ERRORS = [name for name in errors.__all__ if isinstance(getattr(errors, name), type)]
"""The exception classes of ``perseus.core.errors`` (its ``__all__`` also names the table)."""


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
    assert set(drawn) | {"PerseusError"} == set(ERRORS)
    for name, parent in drawn.items():
        cls = getattr(errors, name)
        assert cls.__bases__ == (getattr(errors, parent),), name


def test_every_error_is_a_perseus_error_and_an_exception() -> None:
    for name in ERRORS:
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
    "PlanTooLarge": PlanTooLarge("too long", 7, 4096),
    "RequestFieldError": RequestFieldError(("body", "rows", 3), "no common clock"),
}


def every_error() -> list[PerseusError]:
    """One instance of every class in ``perseus.core.errors``."""
    return [
        CARRYING.get(name) or getattr(errors, name)(f"{name}: what went wrong") for name in ERRORS
    ]


def test_errors_that_carry_more_are_built_with_it() -> None:
    """A class whose constructor takes more than a message is listed in CARRYING, so the
    round trip below checks what it carries (not only its defaults)."""
    for name in ERRORS:
        init = getattr(errors, name).__init__
        if init is not Exception.__init__:
            assert name in CARRYING, name


@pytest.mark.parametrize("error", every_error(), ids=lambda error: type(error).__name__)
def test_errors_survive_a_trip_between_processes(error: PerseusError) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error)
    assert back.args == error.args
    assert vars(back) == vars(error)


def exception_classes(tree: ast.Module) -> list[str]:
    """Classes a module defines on an exception base: a built-in exception (``Exception``,
    ``ValueError``, ...) or any class of the tree, by name (``errors.X`` as well as ``X``)."""
    builtin = [name for name, v in vars(builtins).items() if isinstance(v, type)]
    bases = {name for name in builtin if issubclass(getattr(builtins, name), BaseException)}
    bases.update(ERRORS)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
                if name in bases:
                    found.append(node.name)
    return found


def test_every_exception_of_perseus_is_in_the_tree() -> None:
    """No exception class is defined outside ``perseus.core.errors``: each is drawn there."""
    outside = {
        f"{path.relative_to(PERSEUS.parent)}: {name}"
        for path in PERSEUS.rglob("*.py")
        if path != Path(errors.__file__)
        for name in exception_classes(ast.parse(path.read_text(), str(path)))
    }
    assert not outside, sorted(outside)
    assert set(exception_classes(ast.parse(Path(errors.__file__).read_text()))) == set(ERRORS)


def test_the_status_table_names_classes_of_the_tree() -> None:
    drawn = set(drawn_tree()) | {"PerseusError"}
    for cls, status in HTTP_STATUS.items():
        assert cls.__name__ in drawn and getattr(errors, cls.__name__) is cls
        assert error_named(cls.__name__) is cls
        assert 400 <= status < 600
    assert error_named("GpuControlError") is None  # the server never answers with it
    assert error_named("__class__") is None


def test_a_subclass_comes_before_its_base_in_the_status_table() -> None:
    """Else the base's status would shadow the subclass's (the first match wins)."""
    order = list(HTTP_STATUS)
    for i, cls in enumerate(order):
        assert not any(issubclass(cls, earlier) for earlier in order[:i]), cls.__name__


def test_each_error_answers_its_own_status() -> None:
    for cls, status in HTTP_STATUS.items():
        error = CARRYING.get(cls.__name__) or cls("what went wrong")
        assert http_status(error) == status, cls.__name__
    assert http_status(AuthError("wrong", 403)) == 403
    assert http_status(errors.GpuControlError("not on a planner")) == 400
