"""``perseus plan`` with zero-bubble schedules: named, from torch's CSV, and side by side."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from perseus.cli import main
from perseus.core.errors import ScheduleError
from perseus.formats.plan_files import read_torch_schedule
from perseus.solver import make_schedule, profile_from_rows
from perseus.solver.profiles import profile_to_csv

CLOCKS = (1400, 1200, 1000)
LETTER = {"forward": "F", "backward": "B", "backward_input": "I", "backward_weight": "W"}


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    rows = []
    for s in range(2):
        for kind, t in (("forward", 1.0), ("backward", 2.0)):
            rows += [(s, kind, f, t * (1 + 0.1 * s) * 1400 / f, 60 * t * f / 1400) for f in CLOCKS]
        for kind, share in (("backward_input", 0.55), ("backward_weight", 0.45)):
            rows += [(s, kind, f, 2 * share * 1400 / f, 120 * share * f / 1400) for f in CLOCKS]
    path = tmp_path / "split.csv"
    path.write_text(profile_to_csv(profile_from_rows(rows)))
    return path


def torch_csv(path: Path, actions: list[list[tuple]], overlap: bool = False) -> Path:
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        for seq in actions:
            cells = [f"{u}{LETTER[k]}{j}" for u, k, j in seq]
            if overlap and len(cells) > 3:  # pair two as torch prints OVERLAP_F_B
                cells[1:3] = [f"({cells[1]};{cells[2]})OVERLAP_F_B"]
            writer.writerow(["", *cells])  # a leading bubble, as torch writes None
    return path


def test_a_torch_csv_of_zbv_is_planned_as_zbv(
    profile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = torch_csv(tmp_path / "zbv.csv", make_schedule("zbv", 2, 4, 2).actions())
    plan_path = tmp_path / "plan.json"
    main(
        [
            "plan",
            str(profile),
            "--p-block",
            "20",
            "--schedule-file",
            str(file),
            "--plan-output",
            str(plan_path),
        ]
    )
    out = capsys.readouterr().out
    assert "schedule  zbv, 2 stages x 4 microbatches x 2 chunks (48 instructions)" in out
    assert json.loads(plan_path.read_text())["schedule"] == "zbv"


def test_overlapped_pairs_are_read_as_their_halves_in_order(tmp_path: Path) -> None:
    actions = make_schedule("zbv", 2, 4, 2).actions()
    got = read_torch_schedule(torch_csv(tmp_path / "o.csv", actions, overlap=True))
    assert got == [[(u, str(k), j) for u, k, j in seq] for seq in actions]


def test_an_unnamed_order_is_planned_but_not_written(
    profile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    actions = make_schedule("zbv", 2, 4, 2).actions()
    # GPU 1 runs its last two weight halves the other way round: still valid, no longer zbv
    actions[1][-2], actions[1][-1] = actions[1][-1], actions[1][-2]
    file = torch_csv(tmp_path / "mine.csv", actions)
    main(["plan", str(profile), "--p-block", "20", "--schedule-file", str(file)])
    assert "schedule  mine.csv, 2 stages x 4 microbatches x 2 chunks" in capsys.readouterr().out
    assert (
        main(
            [
                "plan",
                str(profile),
                "--p-block",
                "20",
                "--schedule-file",
                str(file),
                "--output",
                "f.json",
            ]
        )
        == 2
    )
    assert "none of the named schedules" in capsys.readouterr().err


def test_a_deadlocking_or_incomplete_file_names_the_actions(
    profile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    actions = make_schedule("zbv", 2, 4, 2).actions()
    actions[0].remove((0, "backward_weight", 2))
    file = torch_csv(tmp_path / "short.csv", actions)
    assert main(["plan", str(profile), "--p-block", "20", "--schedule-file", str(file)]) != 0
    assert "no backward_weight 2 of stage 0" in capsys.readouterr().err
    actions = make_schedule("zbv", 2, 4, 2).actions()
    actions[0].insert(0, actions[0].pop(actions[0].index((0, "backward_input", 0))))
    file = torch_csv(tmp_path / "stuck.csv", actions)
    assert main(["plan", str(profile), "--p-block", "20", "--schedule-file", str(file)]) != 0
    err = capsys.readouterr().err
    assert "deadlocks" in err and "GPU 0 backward_input 0 of stage 0" in err
    bad = tmp_path / "bad.csv"
    bad.write_text("0F0,0X1\n")
    with pytest.raises(ScheduleError, match=r"row 1, column 2: '0X1' is not a torch action"):
        read_torch_schedule(bad)


def test_schedules_side_by_side(profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["plan", str(profile), "--p-block", "20", "--microbatches", "4", "--schedule", "1f1b,zbv"])
    out = capsys.readouterr().out
    one = re.search(r"^1f1b\s+1\s+(\d+)\s+([\d.]+)\s+([\d.]+)", out, re.M)
    zbv = re.search(r"^zbv\s+2\s+(\d+)\s+([\d.]+)\s+([\d.]+)", out, re.M)
    assert one and zbv, out
    assert (one[1], zbv[1]) == ("16", "48")
    assert float(zbv[2]) < float(one[2])  # the zero-bubble schedule is faster here


def test_a_split_schedule_on_a_profile_without_the_halves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        (s, kind, f, t * 1400 / f, 60 * t)
        for s in range(2)
        for kind, t in (("forward", 1.0), ("backward", 2.0))
        for f in CLOCKS
    ]
    path = tmp_path / "plain.csv"
    path.write_text(profile_to_csv(profile_from_rows(rows)))
    assert (
        main(["plan", str(path), "--p-block", "20", "--microbatches", "4", "--schedule", "zbv"])
        != 0
    )
    assert "stage 0: instruction: no backward_input rows" in capsys.readouterr().err


def test_a_dualpipev_csv_keeps_its_overlapped_actions(
    profile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """torch prints DualPipeV's overlapped actions as ``(0F3;3B1)OVERLAP_F_B``: read back, they
    are the named schedule's overlapped pairs (whose forward's output leaves with the
    backward's), and the file plans as ``dualpipev``."""
    from perseus.formats.plan_files import read_torch_schedule_file

    schedule = make_schedule("dualpipev", 2, 8, 2)
    path = tmp_path / "dualpipev.csv"
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        for g, seq in enumerate(schedule.actions()):
            cells = [f"{u}{LETTER[k]}{j}" for u, k, j in seq]
            for k in sorted((k for h, k in schedule.overlapped if h == g), reverse=True):
                cells[k : k + 2] = [f"({cells[k]};{cells[k + 1]})OVERLAP_F_B"]
            writer.writerow(["", *cells])
    actions, overlapped = read_torch_schedule_file(path)
    assert actions == [[(u, str(k), j) for u, k, j in seq] for seq in schedule.actions()]
    assert tuple(overlapped) == schedule.overlapped
    main(["plan", str(profile), "--p-block", "20", "--schedule-file", str(path)])
    assert "schedule  dualpipev, 2 stages x 8 microbatches x 2 chunks" in capsys.readouterr().out
