"""``perseus simulate``: replaying frontiers and plans, bad plan files, other profiles."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from perseus.cli import main

from .plans import frontier_of, number_after


def _simulated(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[float, float]:
    assert main(["simulate", *args]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^stage\s+busy \(s\)\s+idle \(s\)\s+busy$", out, re.M)
    return number_after(out, "iteration time"), number_after(out, "energy")


def test_simulate_round_trips_a_frontier(
    example: Path, planned: tuple[Path, Path, Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    frontier_path = planned[0]
    frontier = frontier_of(frontier_path)
    for index in sorted({0, len(frontier) // 2, len(frontier) - 1}):
        point = frontier.point(index)
        time_s, energy_j = _simulated(
            capsys, [str(example), str(frontier_path), "--point", str(index)]
        )
        assert time_s == pytest.approx(point.time_s, abs=1e-6)
        assert energy_j == pytest.approx(point.energy_j, abs=1e-3)
    last = frontier.point(len(frontier) - 1)
    time_s, energy_j = _simulated(
        capsys, [str(example), str(frontier_path), "--policy", "min-energy"]
    )
    assert time_s == pytest.approx(last.time_s, abs=1e-6)
    assert energy_j == pytest.approx(last.energy_j, abs=1e-3)


def test_simulate_round_trips_a_plan(
    example: Path, planned: tuple[Path, Path, Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    frontier_path, plan_path, _, _ = planned
    frontier = frontier_of(frontier_path)
    plan = json.loads(plan_path.read_text())
    assert plan["schedule"] == "1f1b" and plan["stages"] == 4 and plan["p_block_w"] == 100
    chosen = next(
        frontier.point(i)
        for i in range(len(frontier))
        if [list(c) for c in frontier.point(i).frequencies_mhz] == plan["frequencies_mhz"]
    )
    time_s, energy_j = _simulated(capsys, [str(example), str(plan_path)])
    assert time_s == pytest.approx(chosen.time_s, abs=1e-6)
    assert energy_j == pytest.approx(chosen.energy_j, abs=1e-3)


@pytest.mark.parametrize(
    ("content", "extra", "expected"),
    [
        ("{not json", [], ["not JSON", "perseus.frontier/1", "perseus.plan/1"]),
        ("stage,instruction,frequency,time,energy\n", [], ["CSV profile", "perseus.plan/1"]),
        ('{"format": "perseus.plan/9"}', [], ["format", "perseus.plan/1"]),
        ('{"rows": []}', [], ["no format field", "perseus.frontier/1"]),
        ("plan-with-string-clock", [], ["frequencies_mhz[2][3]", "'1980'"]),
        ("plan-with-short-row", [], ["frequencies_mhz[1]"]),
        ("plan-with-unknown-clock", [], ["1234"]),
        ("plan", ["--point", "3"], ["--point"]),
        ("frontier", ["--point", "100000"], ["--point", "out of range"]),
        ("frontier-broken", [], []),
    ],
)
def test_simulate_bad_plan_files(
    example: Path,
    planned: tuple[Path, Path, Path, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: str,
    extra: list[str],
    expected: list[str],
) -> None:
    frontier_path, plan_path, _, _ = planned
    plan = json.loads(plan_path.read_text())
    if content == "plan-with-short-row":
        plan["frequencies_mhz"][1].pop()
        content = json.dumps(plan)
    elif content == "plan-with-string-clock":
        plan["frequencies_mhz"][2][3] = "1980"
        content = json.dumps(plan)
    elif content == "plan-with-unknown-clock":
        plan["frequencies_mhz"][0][0] = 1234
        content = json.dumps(plan)
    elif content == "plan":
        content = json.dumps(plan)
    elif content == "frontier":
        content = frontier_path.read_text()
    elif content == "frontier-broken":
        data = json.loads(frontier_path.read_text())
        data.pop("points", None)
        data.pop("schedule", None)
        content = json.dumps(data)
    bad = tmp_path / "bad-plan.json"
    bad.write_text(content)
    assert main(["simulate", str(example), str(bad), *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    line = captured.err.strip()
    assert "\n" not in line and line.startswith("perseus: error: ")
    assert "bad-plan.json" in line or any(e.startswith("--") for e in expected)
    for word in expected:
        assert word in line


def test_simulate_warns_when_the_profile_differs_and_fails_when_it_does_not_fit(
    example: Path,
    planned: tuple[Path, Path, Path, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, plan_path, _, _ = planned
    lines = example.read_text().splitlines()
    header = lines[0].split(",")
    cells = lines[1].split(",")
    cells[header.index("energy")] = str(float(cells[header.index("energy")]) * 1.5)
    other = tmp_path / "other.csv"
    other.write_text("\n".join([lines[0], ",".join(cells), *lines[2:]]) + "\n")
    assert main(["simulate", str(other), str(plan_path)]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("perseus: warning: ") and captured.err.count("\n") == 1
    assert "example_profile.csv" in captured.err and "other.csv" in captured.err
    assert "states" not in captured.out

    assert main(["simulate", str(example), str(plan_path)]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "(the plan states" in captured.out

    two = tmp_path / "two-stages.csv"
    two.write_text("\n".join(line for line in lines if line.split(",")[0] in ("stage", "0", "1")))
    assert main(["simulate", str(two), str(plan_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stages" in err and "another profile" in err


def test_older_plan_files_without_a_fingerprint_still_replay(
    example: Path,
    planned: tuple[Path, Path, Path, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, plan_path, _, _ = planned
    plan = json.loads(plan_path.read_text())
    for key in ("profile", "time_s", "energy_j"):
        del plan[key]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(plan))
    assert main(["simulate", str(example), str(old)]) == 0
    assert capsys.readouterr().err == ""


def test_simulate_replays_with_the_files_clock_change_margin(
    example: Path,
    planned: tuple[Path, Path, Path, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``perseus plan`` records its margin (the default, 5 ms); simulate replays with it and
    gets back what the plan states; a plan without one (an older file) replays without
    transitions."""
    _, plan_path, _, _ = planned
    plan = json.loads(plan_path.read_text())
    assert plan["clock_change_margin_s"] == 0.005
    assert main(["simulate", str(example), str(plan_path)]) == 0
    out = capsys.readouterr().out
    assert "P_block 100 W, clock-change margin 5 ms" in out
    assert f"(the plan states {plan['time_s']:.6f} s and {plan['energy_j']:.3f} J)" in out
    assert number_after(out, "iteration time") == pytest.approx(plan["time_s"], abs=1e-6)
    del plan["clock_change_margin_s"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(plan))
    assert main(["simulate", str(example), str(old)]) == 0
    out = capsys.readouterr().out
    assert "clock changes" not in out
    assert number_after(out, "energy") != pytest.approx(plan["energy_j"], abs=1e-3)
