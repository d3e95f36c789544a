"""Argument types and one-line usage errors shared by the commands."""

from __future__ import annotations

import argparse

import pytest

from perseus.cli.arguments import (
    Parser,
    UsageError,
    asks_help,
    finite_number,
    install_hint,
    integer_at_least,
    needs,
    policy,
)


@pytest.mark.parametrize("text", ["0", "-3", "1.5", "two", ""])
def test_integer_at_least_refuses_what_is_not_a_whole_number_above_the_minimum(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=f"expected an integer >= 1, got {text!r}"):
        integer_at_least(1)(text)
    assert integer_at_least(1)("7") == 7


@pytest.mark.parametrize("text", ["0", "-1", "nan", "inf", "0.0011", "x"])
def test_finite_number_keeps_its_bounds(text: str) -> None:
    parse = finite_number(0, inclusive=False, maximum=0.001)
    with pytest.raises(argparse.ArgumentTypeError, match=r"> 0 and <= 0\.001"):
        parse(text)
    assert parse("0.001") == 0.001
    assert finite_number(0, inclusive=True)("0") == 0.0


def test_policy_errors_are_argument_errors() -> None:
    assert str(policy("max-slowdown:1.05")) == "max-slowdown:1.05"
    with pytest.raises(argparse.ArgumentTypeError, match="unknown policy"):
        policy("fastest")


def test_the_parser_errs_in_one_line_naming_the_command() -> None:
    parser = Parser(prog="perseus plan")
    parser.add_argument("--microbatches", type=integer_at_least(1), required=True)
    with pytest.raises(UsageError, match=r"^plan: argument --microbatches: expected an integer"):
        parser.parse_args(["--microbatches", "0"])


def test_asks_help_stops_at_a_double_dash() -> None:
    assert asks_help(["plan", "-h"]) and asks_help(["--help"])
    assert not asks_help(["plan", "--", "--help"])


def test_a_missing_extra_names_what_to_install_and_a_missing_perseus_module_is_a_bug() -> None:
    with pytest.raises(UsageError) as caught, needs("serve", "server", "the planner server"):
        raise ModuleNotFoundError("No module named 'uvicorn'", name="uvicorn")
    assert str(caught.value).startswith("serve: the planner server is not installed (")
    assert str(caught.value).endswith(install_hint("server"))
    assert "pip install 'perseus-planner[server]'" in install_hint("server")
    with pytest.raises(ModuleNotFoundError), needs("serve", "server", "the planner server"):
        raise ModuleNotFoundError("No module named 'perseus.nowhere'", name="perseus.nowhere")
