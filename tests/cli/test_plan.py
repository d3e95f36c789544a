"""``perseus plan``: the table, the files, policies, stragglers, bad input."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

from perseus.cli import main
from perseus.core.baselines import baseline_label, reference_key

from .plans import MICROBATCHES, frontier_of, number_after, reference_label

OUTPUT_OPTIONS = ("--output", "--plot", "--timeline", "--plan-output")


def test_plan_prints_every_baseline_and_the_chosen_point(
    planned: tuple[Path, Path, Path, str],
) -> None:
    frontier_path, _, _, out = planned
    frontier = frontier_of(frontier_path)
    reference = reference_label(frontier_path)
    for label in (reference, "global clock", "per-stage clock", "no-slowdown"):
        assert label in out
    assert f"saving and slowdown are against {reference}" in out
    assert re.search(r"^plan\s+time \(s\)\s+energy \(J\)\s+saving\s+slowdown\s+gap$", out, re.M)
    key = reference_key(frontier.baselines)
    assert key is not None
    fastest = frontier.baselines[key]
    assert re.search(
        rf"^{re.escape(reference)} .*{fastest.time_s:.4f}\s+{fastest.energy_j:.1f}"
        r"\s+0\.00 %\s+0\.00 %\s+-$",
        out,
        re.M,
    )
    point = frontier.point(0)
    assert re.search(
        rf"^no-slowdown \(point \d+ of {len(frontier)}\)\s+{point.time_s:.4f}", out, re.M
    )


def test_plan_writes_every_requested_file(example: Path, tmp_path: Path) -> None:
    files = {
        "--output": tmp_path / "f.json",
        "--plan-output": tmp_path / "p.json",
        "--plot": tmp_path / "f.png",
        "--timeline": tmp_path / "t.png",
    }
    args = ["plan", str(example), "--microbatches", MICROBATCHES, "--p-block", "100"]
    for option, path in files.items():
        args += [option, str(path)]
    assert main(args) == 0
    assert json.loads(files["--output"].read_text())["format"] == "perseus.frontier/1"
    assert json.loads(files["--plan-output"].read_text())["format"] == "perseus.plan/1"
    for png in (files["--plot"], files["--timeline"]):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # No temporary files left behind, and the usual mode rather than mkstemp's 0600.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json", "f.png", "p.json", "t.png"]
    umask = os.umask(0)
    os.umask(umask)
    assert {stat.S_IMODE(p.stat().st_mode) for p in files.values()} == {0o666 & ~umask}


def test_plan_takes_p_block_from_a_json_profile(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from perseus.solver import load_profile, profile_to_json

    data = profile_to_json(load_profile(example))
    data["p_block_w"] = 90.0
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(data))
    assert main(["plan", str(profile), "--microbatches", "2"]) == 0
    assert "P_block 90 W" in capsys.readouterr().out


@pytest.mark.parametrize("policy", ["min-energy", "max-slowdown:1.05", "zeus-cost:0.5"])
def test_plan_policies(example: Path, policy: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", str(example), "--microbatches", "2", "--p-block", "100", "--policy", policy]
    assert main(args) == 0
    assert re.search(rf"^{re.escape(policy)} \(point \d+ of \d+\)", capsys.readouterr().out, re.M)


def test_plan_straggler_rows(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["plan", str(example), "--microbatches", "2", "--p-block", "100"]
    assert main(base) == 0
    out = capsys.readouterr().out
    reference = re.search(r"^saving and slowdown are against (.*)$", out, re.M)
    assert reference, out
    label = reference.group(1)
    fastest = re.search(rf"^{re.escape(label)}\s+\S+ MHz\s+([0-9.]+)", out, re.M)
    assert fastest, out
    fastest_s = float(fastest.group(1))
    imposed = f"{fastest_s * 1.2:.4f}"
    plot = tmp_path / "frontier.png"
    assert main([*base, "--straggler", imposed, "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    stretched = re.search(
        rf"^{re.escape(label)}, stretched\s+{imposed}\s+([0-9.]+)\s+0\.00 %", out, re.M
    )
    lagging = re.search(
        rf"^straggler \(point \d+ of \d+\)\s+{imposed}\s+([0-9.]+)\s+([0-9.]+) %", out, re.M
    )
    assert stretched and lagging, out
    assert float(lagging.group(1)) < float(stretched.group(1))
    assert float(lagging.group(2)) > 0
    assert plot.exists()


def _csv(tmp_path: Path, example: Path, edit: tuple[int, str, str] | None = None) -> Path:
    """Copy the example profile, optionally setting field ``edit[1]`` of data line ``edit[0]``."""
    lines = example.read_text().splitlines()
    if edit is not None:
        row, column, value = edit
        header = lines[0].split(",")
        cells = lines[row - 1].split(",")
        cells[header.index(column)] = value
        lines[row - 1] = ",".join(cells)
    path = tmp_path / "bad.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("edit", "extra", "expected"),
    [
        ((4, "time", "nan"), [], ["bad.csv", "row 4", "time"]),
        ((7, "energy", "-3"), [], ["bad.csv", "row 7", "energy"]),
        ((9, "instruction", "sideways"), [], ["bad.csv", "row 9", "instruction"]),
        ((3, "frequency", "fast"), [], ["bad.csv", "row 3", "frequency"]),
        (None, ["--policy", "deadline:soon"], ["--policy"]),
        (None, ["--policy", "sometimes"], ["--policy"]),
        (None, ["--microbatches", "0"], ["--microbatches"]),
        (None, ["--p-block", "-5"], ["--p-block"]),
        (None, ["--schedule", "zigzag"], ["--schedule"]),
        (None, ["--resolution", "inf"], ["--resolution"]),
        (None, ["--polish", "-1"], ["--polish"]),
        (None, ["--clock-change-margin", "-0.001"], ["--clock-change-margin", "'-0.001'"]),
        (None, ["--clock-change-margin", "1"], ["--clock-change-margin", "< 1"]),
        (None, ["--clock-change-margin", "nan"], ["--clock-change-margin"]),
        (None, ["--schedule", "interleaved-1f1b", "--microbatches", "6"], ["multiple"]),
        (None, ["--schedule", "gpipe", "--virtual-stages", "2"], ["virtual"]),
        (None, ["--policy", "deadline:0.001"], ["--policy deadline:0.001", "fastest"]),
        (None, ["--straggler", "0.001"], ["--straggler", "fastest"]),
        (None, ["--resolution", "2"], ["--resolution", "<= 1", "'2'"]),
        (None, ["--virtual-stages", "2"], ["--virtual-stages", "interleaved-1f1b"]),
        (
            None,
            ["--schedule", "interleaved-1f1b", "--virtual-stages", "1"],
            ["--virtual-stages", "V >= 2"],
        ),
    ],
)
def test_bad_input_exits_2_naming_the_place_and_writes_nothing(
    example: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    edit: tuple[int, str, str] | None,
    extra: list[str],
    expected: list[str],
) -> None:
    profile = _csv(tmp_path, example, edit)
    outputs = [tmp_path / name for name in ("f.json", "f.png", "t.png", "p.json")]
    args = ["plan", str(profile), "--microbatches", "4", "--p-block", "100", *extra]
    for option, path in zip(OUTPUT_OPTIONS, outputs, strict=True):
        args += [option, str(path)]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("perseus: error: "), captured.err
    for word in expected:
        assert word in lines[0]
    assert not any(path.exists() for path in outputs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv"]


def test_csv_profile_without_p_block_is_an_error(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "f.json"
    assert main(["plan", str(example), "--microbatches", "2", "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert "example_profile.csv" in err and "p_block_w" in err and "--p-block" in err
    assert not output.exists()


def test_missing_profile_and_missing_output_directory(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", str(tmp_path / "nope.csv"), "--microbatches", "2", "--p-block", "1"]) == 2
    assert "nope.csv" in capsys.readouterr().err
    output = tmp_path / "missing" / "f.json"
    args = [
        "plan",
        str(example),
        "--microbatches",
        "2",
        "--p-block",
        "100",
        "--output",
        str(output),
    ]
    assert main(args) == 2
    assert "--output" in capsys.readouterr().err
    assert not output.parent.exists()


@pytest.mark.parametrize("option", ["--plot", "--timeline"])
def test_plots_must_be_png_files(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    target = tmp_path / "f.txt"
    args = ["plan", str(example), "--microbatches", "2", "--p-block", "100", option, str(target)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and option in err and ".png" in err
    assert not target.exists()


def test_infeasible_deadline_is_refused_before_planning(
    example: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import perseus.solver

    def no_solving(*args: object, **kwargs: object) -> None:
        raise AssertionError("compute_frontier ran")

    monkeypatch.setattr(perseus.solver, "compute_frontier", no_solving)
    base = ["plan", str(example), "--microbatches", "8", "--p-block", "100"]
    assert main([*base, "--policy", "deadline:1.0"]) == 2
    assert "--policy deadline:1.0: no plan finishes within 1.000000 s" in capsys.readouterr().err
    assert main([*base, "--straggler", "1.0"]) == 2
    assert "--straggler: no plan finishes" in capsys.readouterr().err


def test_files_carry_the_profile_fingerprint_and_the_runs_baselines(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    frontier_path, plan_path = tmp_path / "f.json", tmp_path / "p.json"
    args = ["plan", str(example), "--microbatches", "4", "--p-block", "100"]
    args += ["--policy", "max-slowdown:1.1", "--output", str(frontier_path)]
    args += ["--plan-output", str(plan_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    data = json.loads(frontier_path.read_text())
    plan = json.loads(plan_path.read_text())
    assert data["profile"] == plan["profile"]
    assert data["profile"]["source"] == "example_profile.csv"
    assert len(data["profile"]["sha256"]) == 64
    # The file's baselines are the table's, at the policy's limit, not the no-slowdown ones.
    for key, baseline in data["baselines"].items():
        row = re.search(
            rf"^{re.escape(baseline_label(key))}(?!\w).*?\s([0-9.]+)\s+([0-9.]+)\s", out, re.M
        )
        if row is None:  # all-fastest folded into an identical default row
            assert key == "all_fastest" and "default" in data["baselines"]
            continue
        assert float(row.group(1)) == pytest.approx(baseline["time_s"], abs=5e-5)
        assert float(row.group(2)) == pytest.approx(baseline["energy_j"], abs=0.05)
    reference = data["baselines"][reference_key(data["baselines"]) or ""]
    assert data["baselines_deadline_s"] == pytest.approx(1.1 * reference["time_s"])
    assert data["baselines"]["global_clock"]["time_s"] <= data["baselines_deadline_s"]
    chosen_s = number_after(out, r"max-slowdown:1\.1 \(point \d+ of \d+\)")
    assert plan["time_s"] == pytest.approx(chosen_s, abs=5e-5)


def test_exact_refusal_names_the_flag_that_allows_more_time(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The solver's refusal says how long the sweep would take; the command line adds which
    flag gives it that time."""
    argv = ["plan", str(example), "--microbatches", "8", "--p-block", "100", "--exact",
            "--exact-time-limit", "1", "--output", str(tmp_path / "f.json")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "estimated to need at least" in err and "(--exact-time-limit SECONDS)" in err
    assert not (tmp_path / "f.json").exists()


def test_a_straggler_faster_than_the_chosen_plan_does_not_slow_it(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A straggler at 1.75 s with a policy that chose a 1.92 s plan: this pipeline is the slow
    one, so the chosen plan runs as it is (as the planner server decides): no row claims a
    stretched reference or a 1.75 s iteration, and --plan-output saves the chosen plan."""
    plan_file = tmp_path / "plan.json"
    argv = ["plan", str(example), "--microbatches", "8", "--p-block", "100",
            "--policy", "max-slowdown:1.1", "--plan-output", str(plan_file),
            "--straggler", "1.75"]  # fmt: skip
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "straggler (point" not in captured.out
    assert ", stretched" not in captured.out
    assert "takes 1.7500 s" not in captured.out
    chosen = re.search(r"^max-slowdown:1.1 \(point \d+ of \d+\)\s+([0-9.]+)", captured.out, re.M)
    assert chosen, captured.out
    assert (
        f"straggler: its 1.7500 s is not longer than the chosen plan's {chosen.group(1)} s,\n"
        "so it does not slow this pipeline: the chosen plan runs as it is\n"
    ) in captured.out
    assert "warning: --straggler 1.75 s is not longer than the chosen plan's" in captured.err
    assert f"{json.loads(plan_file.read_text())['time_s']:.4f}" == chosen.group(1)
    assert main([*argv[:-2], "--straggler", "2.0"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_plan_output_under_a_straggler_is_the_straggler_plan(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The plan that runs under the straggler is the one --plan-output saves (the table's
    straggler row, stretched to the imposed time), not the policy's."""
    plan_file, frontier_file = tmp_path / "plan.json", tmp_path / "frontier.json"
    argv = ["plan", str(example), "--microbatches", "8", "--p-block", "100",
            "--straggler", "2.0", "--plan-output", str(plan_file),
            "--output", str(frontier_file)]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    row = re.search(r"^straggler \(point (\d+) of \d+\)\s+2\.0000\s+([0-9.]+)", out, re.M)
    policy = re.search(r"^no-slowdown \(point (\d+) of", out, re.M)
    assert row and policy, out
    assert row.group(1) != policy.group(1)
    assert "the straggler plan is the one that runs: --plan-output and --timeline take it" in out
    saved = json.loads(plan_file.read_text())
    point = json.loads(frontier_file.read_text())["points"][int(row.group(1))]
    assert saved["frequencies_mhz"] == point["frequencies_mhz"]
    assert saved["time_s"] == point["time_s"] <= 2.0
    stretched_j = saved["energy_j"] + 4 * 100 * (2.0 - saved["time_s"])
    assert f"{stretched_j:.1f}" == row.group(2)


def test_exact_cut_short_by_its_limit_says_so(
    example: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fake clock (one second a reading) lets three MILPs run within --exact-time-limit 3.5
    before the limit ends the sweep: the summary and a warning say how much it cut short."""
    import types

    from perseus.solver import exact

    readings = iter(range(10**6))
    monkeypatch.setattr(
        exact, "time", types.SimpleNamespace(monotonic=lambda: float(next(readings)))
    )
    monkeypatch.setattr(exact, "exact_estimate_s", lambda *args: 0.0)
    argv = ["plan", str(example), "--microbatches", "1", "--p-block", "100", "--exact",
            "--exact-time-limit", "3.5"]  # fmt: skip
    assert main(argv) == 0
    captured = capsys.readouterr()
    line = re.search(r"^exact     PARTIAL: the time limit of 3.5 s cut (.*)$", captured.out, re.M)
    assert line, captured.out
    assert re.search(
        r"\d+ of \d+ deadlines \(the shortest\) left to the fast mode's plans", line[1]
    )
    assert (
        "warning: --exact-time-limit 3.5 s cut the exact sweep short (" in captured.err
        and "the frontier is partial" in captured.err
    )


def test_exact_within_its_limit_says_every_point_is_proven(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """(The fast mode says nothing of MILPs.)"""
    tiny = tmp_path / "tiny.csv"
    lines = example.read_text().splitlines()
    kept = [lines[0]] + [line for line in lines[1:] if line.split(",")[2] in ("1980", "1005")]
    tiny.write_text("\n".join(kept) + "\n")
    argv = ["plan", str(tiny), "--microbatches", "1", "--p-block", "100"]
    assert main([*argv, "--exact"]) == 0
    captured = capsys.readouterr()
    assert re.search(r"^exact     every point proven optimal \(\d+ MILPs for \d+ deadlines\)$",
                     captured.out, re.M), captured.out  # fmt: skip
    assert "warning" not in captured.err
    assert main(argv) == 0
    assert "exact " not in capsys.readouterr().out


@pytest.mark.parametrize(("given", "shown", "margin"), [([], "5 ms", 0.005),
                         (["--clock-change-margin", "0.02"], "20 ms", 0.02),
                         (["--clock-change-margin", "0"], None, 0.0)])  # fmt: skip
def test_the_clock_change_margin_is_planned_with_shown_and_recorded(
    example: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    given: list[str],
    shown: str | None,
    margin: float,
) -> None:
    """The default margin is perseus.core.defaults'; the summary says it, both files record it, and
    the stated times and energies are the replay with it."""
    from perseus.solver import load_profile, replay

    frontier_path, plan_path = tmp_path / "f.json", tmp_path / "p.json"
    args = ["plan", str(example), "--microbatches", MICROBATCHES, "--p-block", "100", *given]
    assert main([*args, "--output", str(frontier_path), "--plan-output", str(plan_path)]) == 0
    out = capsys.readouterr().out
    schedule_line = next(line for line in out.splitlines() if line.startswith("schedule"))
    if shown is None:
        assert "clock-change margin" not in schedule_line
    else:
        assert schedule_line.endswith(f"P_block 100 W, clock-change margin {shown}")
    frontier = frontier_of(frontier_path)
    assert frontier.clock_change_margin_s == margin
    plan = json.loads(plan_path.read_text())
    assert plan["clock_change_margin_s"] == margin
    replayed = replay(
        load_profile(example),
        frontier.schedule,
        100.0,
        plan["frequencies_mhz"],
        clock_change_margin_s=margin,
    )
    assert (replayed.time_s, replayed.energy_j) == pytest.approx(
        (plan["time_s"], plan["energy_j"]), rel=1e-12
    )


@pytest.mark.parametrize(
    ("row", "words"),
    [
        ("999999999999,forward,1410,0.05,24", ["stage: must be in 0..1023"]),
        ("0,forward,1410,1e308,24", ["time: must be at most 1e+07"]),
        ("0,forward,1" + "0" * 30 + ",0.05,24", ["frequency: must be in 1..100000"]),
        ("0,forward,1410,0.05," + "x" * 100_000, ["energy: expected a number", "..."]),
    ],
)
@pytest.mark.parametrize("command", ["plan", "simulate"])
def test_a_malformed_profile_row_is_exit_2_and_one_short_line(
    example: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    row: str,
    words: list[str],
    command: str,
) -> None:
    profile = tmp_path / "typo.csv"
    profile.write_text(example.read_text() + row + "\n")
    if command == "plan":
        args = ["plan", str(profile), "--microbatches", "4", "--p-block", "100"]
    else:
        args = ["simulate", str(profile), str(tmp_path / "plan.json")]
    assert main(args) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == "" and len(lines) == 1 and len(lines[0]) < 300, captured.err[:500]
    assert lines[0].startswith(f"perseus: error: {profile}: row ")
    assert all(word in lines[0] for word in words)
