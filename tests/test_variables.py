"""The one catalogue of ``PERSEUS_*`` variables (perseus.core.settings): each kind reads and
checks as documented, every variable perseus names is in it, and the server's settings are
built from it field for field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args

import pytest

import perseus
from perseus.client.settings import GPU_MODES
from perseus.core import settings as variables
from perseus.core.errors import SettingsError
from perseus.core.settings import (
    VARIABLES,
    Choice,
    Flag,
    Number,
    Text,
    Url,
    Variable,
    Whole,
)
from perseus.server.settings import Settings

PERSEUS = Path(perseus.__file__).parent
NAMES = {variable.name for variable in VARIABLES}


def test_the_catalogue_lists_every_variable_once() -> None:
    defined = [v for v in vars(variables).values() if isinstance(v, Variable)]
    assert list(VARIABLES) == defined
    assert len(NAMES) == len(VARIABLES)
    # PERSEUS_* mostly; a daemon's own variables (ZEUSD_SOCK_PATH) keep their names
    assert all(re.fullmatch(r"[A-Z][A-Z0-9_]*[A-Z0-9]", name) for name in NAMES)


def test_every_variable_perseus_names_is_in_the_catalogue() -> None:
    """A name spelled anywhere in perseus (code, messages, docstrings) is a variable defined
    once in perseus.core.settings: a typo or a variable read behind its back fails here."""
    catalogue = Path(variables.__file__)
    named = {
        f"{path.relative_to(PERSEUS.parent)}: {name}"
        for path in PERSEUS.rglob("*.py")
        if path != catalogue
        for name in re.findall(r"PERSEUS_[A-Z_]*[A-Z]", path.read_text())
        if name not in NAMES
    }
    assert not named, sorted(named)


def test_the_server_settings_are_the_server_variables() -> None:
    kinds: dict[type, Any] = {int: Whole, float: Number, bool: Flag, str: Text}
    for field, info in Settings.model_fields.items():
        variable = getattr(variables, field.upper())
        assert variable.name == f"PERSEUS_{field.upper()}" and variable.field == field
        assert info.default == variable.default, field
        assert info.description == (variable.help or None), field
        if field == "admin_token":  # a SecretStr, read as text
            assert isinstance(variable.kind, Text)
            continue
        annotation = next(a for a in (*get_args(info.annotation), info.annotation) if a in kinds)
        assert isinstance(variable.kind, kinds[annotation]), field


def test_the_server_reads_the_variables_with_their_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(variables.PORT.name, "8000")
    monkeypatch.setenv(variables.WARM_PLANNER.name, "0")
    settings = Settings()
    assert (settings.port, settings.warm_planner) == (8000, False)
    monkeypatch.setenv(variables.PORT.name, "70000")  # Whole(0, 65535)
    with pytest.raises(ValueError, match="port"):
        Settings()


def test_the_gpu_modes_are_the_clients() -> None:
    assert isinstance(variables.GPU.kind, Choice)
    assert variables.GPU.kind.options == GPU_MODES


@pytest.mark.parametrize(
    ("variable", "text", "message"),
    [
        (
            Variable("PERSEUS_A", Whole(1), None),
            "0",
            r"PERSEUS_A: expected a whole number >= 1, got '0'",
        ),
        (Variable("PERSEUS_A", Whole(0, 9), None), "10", r">= 0 and <= 9, got '10'"),
        (Variable("PERSEUS_A", Whole(0), None), "²", r"got '²'"),
        (Variable("PERSEUS_A", Number(minimum=0.5), None), "x", r"PERSEUS_A: not a number: 'x'"),
        (Variable("PERSEUS_A", Number(minimum=0.5), None), "nan", r"finite number >= 0.5, got nan"),
        (Variable("PERSEUS_A", Number(above=0, maximum=60), None), "0", r"> 0 and <= 60, got 0"),
        (Variable("PERSEUS_A", Flag(), False), "maybe", r"PERSEUS_A: expected 1 or 0, got 'maybe'"),
        (Variable("PERSEUS_A", Choice(("a", "b")), "a"), "c", r"expected one of a, b, got 'c'"),
        (Variable("PERSEUS_A", Url(), None), "host:1", r"expected http://host:port, got 'host:1'"),
        (Variable("PERSEUS_A", Url(), None), "http://:80", r"got 'http://:80'"),
    ],
)
def test_a_malformed_value_is_refused_naming_the_variable_and_why(
    variable: Variable[Any], text: str, message: str
) -> None:
    with pytest.raises(SettingsError, match=message):
        variable.read({variable.name: text})


def test_values_blanks_defaults_and_fallbacks() -> None:
    rank = Variable("PERSEUS_A", Whole(0), 7, fallbacks=("B",))
    assert rank.read({}) == 7
    assert rank.read({"PERSEUS_A": "  "}) == 7  # blank is unset
    assert rank.read({"PERSEUS_A": " 3 ", "B": "4"}) == 3
    assert rank.read({"B": "4"}) == 4
    with pytest.raises(SettingsError, match=r"^B: "):  # names the variable it read
        rank.read({"B": "-1"})
    assert Variable("PERSEUS_A", Flag(), False).read({"PERSEUS_A": "Yes"}) is True
    assert Variable("PERSEUS_A", Number(above=0), 1.0).read({"PERSEUS_A": "2.5"}) == 2.5
    assert Variable("PERSEUS_A", Text(), None).text({"PERSEUS_A": " t "}) == "t"


def test_arguments_are_checked_naming_the_argument() -> None:
    with pytest.raises(SettingsError, match=r"rank: must be a whole number >= 0, got -1"):
        Whole(0).check(-1, "rank")
    with pytest.raises(SettingsError, match=r"rank: must be a whole number >= 0, got True"):
        Whole(0).check(True, "rank")
    with pytest.raises(SettingsError, match=r"wait_s: must be a number, got '1'"):
        Number(minimum=0.1).check("1", "wait_s")
    with pytest.raises(SettingsError, match=r"wait_s: must be a finite number >= 0.1, got inf"):
        Number(minimum=0.1).check(float("inf"), "wait_s")
    with pytest.raises(SettingsError, match=r"strict: must be True or False, got 1"):
        Flag().check(1, "strict")
    assert Number(minimum=0.1).check(2, "wait_s") == 2.0
