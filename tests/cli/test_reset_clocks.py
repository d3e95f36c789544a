"""``perseus reset-clocks`` through ``perseus.cli.main``, NVML replaced by a recorder."""

from __future__ import annotations

import sys
import types
from collections.abc import Sequence
from typing import Any

import pytest

from perseus.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize(
    ("argv", "indices"),
    [((), None), (("--gpu", "all"), None), (("--gpu", "3"), [3]), (("--gpu", "0,2"), [0, 2])],
)
def test_reset_clocks_prints_each_gpu(
    argv: Sequence[str],
    indices: list[int] | None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[Any] = []

    def reset_clocks(given: Sequence[int] | None) -> list[str]:
        calls.append(given)
        return [f"GPU {i}: SM clock lock removed" for i in given or [0, 1]]

    fake = types.ModuleType("perseus.client.gpu.control")
    fake.reset_clocks = reset_clocks  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "perseus.client.gpu.control", fake)
    status, out, _ = run(capsys, "reset-clocks", *argv)
    assert status == 0
    assert calls == [indices]
    assert out.splitlines() == [f"GPU {i}: SM clock lock removed" for i in indices or [0, 1]]


def test_reset_clocks_rejects_a_bad_index(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "reset-clocks", "--gpu", "x")
    assert status == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("perseus: error: ")
    assert "expected 'all' or GPU indices" in lines[0]
