"""The ``perseus`` command line: plan, simulate, demo, serve, errors and output files."""

from __future__ import annotations

import io
import json
import os
import re
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest

import perseus
from perseus.baselines import baseline_label, reference_key
from perseus.cli import ProgressBar, main
from perseus.files import FrontierFile
from perseus.solver import Frontier

MICROBATCHES = "4"
OUTPUT_OPTIONS = ("--output", "--plot", "--timeline", "--plan-output")


@pytest.fixture(scope="module")
def example() -> Iterator[Path]:
    with resources.as_file(resources.files("perseus") / "data" / "example_profile.csv") as path:
        yield path


@pytest.fixture(scope="module")
def planned(
    example: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, Path, str]:
    """One planning run shared by the tests that read its files: frontier, plan, dir, stdout."""
    out = tmp_path_factory.mktemp("planned")
    frontier, plan = out / "frontier.json", out / "plan.json"
    stdout = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "stdout", stdout)
        status = main(
            [
                "plan",
                str(example),
                "--microbatches",
                MICROBATCHES,
                "--p-block",
                "100",
                "--output",
                str(frontier),
                "--plan-output",
                str(plan),
            ]
        )
    assert status == 0
    return frontier, plan, out, stdout.getvalue()


def _frontier(path: Path) -> Frontier:
    return FrontierFile.model_validate_json(path.read_text()).to_frontier()


def _reference(path: Path) -> str:
    """The label of the baseline a frontier file's savings are against."""
    key = reference_key(json.loads(path.read_text())["baselines"])
    assert key is not None
    return baseline_label(key)


def _numbers(text: str, label: str) -> float:
    found = re.search(rf"^{label}\s+([0-9.]+)", text, re.MULTILINE)
    assert found, f"no {label!r} line in:\n{text}"
    return float(found.group(1))


def test_plan_prints_every_baseline_and_the_chosen_point(
    planned: tuple[Path, Path, Path, str],
) -> None:
    frontier_path, _, _, out = planned
    frontier = _frontier(frontier_path)
    reference = _reference(frontier_path)
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
        (None, ["--schedule", "interleaved-1f1b", "--microbatches", "6"], ["multiple"]),
        (None, ["--schedule", "gpipe", "--virtual-stages", "2"], ["virtual"]),
        (None, ["--policy", "deadline:0.001"], ["--policy deadline:0.001", "fastest"]),
        (None, ["--straggler", "0.001"], ["--straggler", "fastest"]),
        (None, ["--resolution", "0.01"], ["--resolution", "<= 0.001", "'0.01'"]),
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


def _simulated(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[float, float]:
    assert main(["simulate", *args]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^stage\s+busy \(s\)\s+idle \(s\)\s+busy$", out, re.M)
    return _numbers(out, "iteration time"), _numbers(out, "energy")


def test_simulate_round_trips_a_frontier(
    example: Path, planned: tuple[Path, Path, Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    frontier_path = planned[0]
    frontier = _frontier(frontier_path)
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
    frontier = _frontier(frontier_path)
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


def test_demo_as_a_subprocess(tmp_path: Path) -> None:
    outdir = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, "-m", "perseus.cli", "demo", "--outdir", str(outdir)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    reference = _reference(outdir / "frontier.json")
    for label in (reference, "global clock", "per-stage clock", "no-slowdown"):
        assert label in done.stdout
    # The demo leaves its profile beside the plans, so that perseus simulate can replay them.
    assert (outdir / "example_profile.csv").read_bytes() == (
        resources.files("perseus") / "data" / "example_profile.csv"
    ).read_bytes()
    assert f"profile   {outdir / 'example_profile.csv'}: 4 stages" in done.stdout
    for name in ("frontier.png", "timeline.png"):
        assert (outdir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"wrote {outdir / name}" in done.stdout
    assert json.loads((outdir / "frontier.json").read_text())["format"] == "perseus.frontier/1"
    # A real saving at no slowdown: the chosen point's saving column.
    found = re.search(
        r"^no-slowdown \(point \d+ of \d+\)\s+\S+\s+\S+\s+([0-9.]+) %\s+0\.00 %", done.stdout, re.M
    )
    assert found and float(found.group(1)) > 3.0, done.stdout


def test_no_command_and_unknown_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "perseus: error: " in capsys.readouterr().err
    assert main(["plan", "x.csv", "--microbatches", "2", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("perseus: error: ") and "--bogus" in err


def test_serve_delegates_its_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("perseus.server.cli")
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--help"])
    assert exited.value.code == 0
    assert "--port" in capsys.readouterr().out
    assert main(["serve", "--port", "eighty"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("perseus: error: serve: argument --port") and err.count("\n") == 1


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_shows_the_phase_and_a_bar_that_never_moves_back() -> None:
    now = [0.0]
    terminal = _Terminal()
    bar = ProgressBar(terminal, clock=lambda: now[0], delay_s=0.2, thread=False)
    bar.phase("loading the solver")
    now[0] = 0.1
    bar.draw()
    assert terminal.getvalue() == ""  # quick commands stay silent
    now[0] = 0.3
    bar.draw()
    assert "perseus: loading the solver" in terminal.getvalue()
    bar.phase("planning")
    bar(5, 10)
    bar.draw()
    line = terminal.getvalue().rsplit("\r", 1)[-1]
    assert "planning [" in line and " 50 %" in line and "0.3 s" in line
    bar(5, 40)  # the total grew: the bar holds its place
    now[0] = 0.4
    bar.draw()
    assert " 50 %" in terminal.getvalue().rsplit("\r", 1)[-1]
    bar.close()
    assert terminal.getvalue().endswith("\r\033[K")

    log = io.StringIO()  # not a terminal
    bar = ProgressBar(log, clock=lambda: now[0], thread=False)
    now[0] = 5.0
    bar(5, 10)
    bar.draw()
    bar.close()
    assert log.getvalue() == ""


def test_progress_bar_thread_redraws_until_closed() -> None:
    terminal = _Terminal()
    with ProgressBar(terminal, delay_s=0.0, interval_s=0.01) as bar:
        bar.phase("working")
        deadline = time.monotonic() + 5
        while terminal.getvalue().count("perseus: working") < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert terminal.getvalue().count("perseus: working") >= 3
    assert terminal.getvalue().endswith("\r\033[K")


def test_help_and_version_load_no_heavy_module() -> None:
    code = (
        "import sys\n"
        "from perseus.cli import main\n"
        "for argv in (['--help'], ['--version']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = {'numpy', 'scipy', 'networkx', 'matplotlib', 'pydantic', 'highspy'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    *_, last = done.stdout.strip().splitlines()
    assert last == "[]", done.stdout
    assert f"perseus {perseus.__version__}" in done.stdout
    assert "plan" in done.stdout and "reset-clocks" in done.stdout


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
    chosen_s = _numbers(out, r"max-slowdown:1\.1 \(point \d+ of \d+\)")
    assert plan["time_s"] == pytest.approx(chosen_s, abs=5e-5)


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


_BARE = """
import sys
for name in ("httpx", "pydantic_settings", "fastapi", "uvicorn", "torch", "sqlalchemy", "pynvml"):
    sys.modules[name] = None  # as if the extras were not installed
from perseus.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["serve"], "server"),
        (["job", "status"], "client"),
        (["profile", "--gpu", "fake", "--clocks", "every:50"], "torch"),
    ],
)
def test_every_help_works_without_the_extras_and_running_says_which_to_install(
    argv: list[str], extra: str, tmp_path: Path
) -> None:
    env = {**os.environ, "PERSEUS_SERVER": "http://127.0.0.1:9", "PERSEUS_JOB": "j",
           "PERSEUS_TOKEN": "t"}  # fmt: skip
    run = [sys.executable, "-c", _BARE]
    helped = subprocess.run([*run, *argv, "--help"], capture_output=True, text=True, env=env)
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith(f"usage: perseus {argv[0]}")
    ran = subprocess.run(
        [*run, *argv], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60
    )
    assert ran.returncode == 2
    assert f"pip install 'perseus-planner[{extra}]'" in ran.stderr, ran.stderr


def test_the_core_install_plans_without_scipy_or_networkx(tmp_path: Path) -> None:
    """scipy and networkx are test extras only: the demo, an exact plan and a simulation run
    with them (and every extra) absent."""
    bare = _BARE.replace('"pynvml")', '"pynvml", "scipy", "networkx")')
    run = [sys.executable, "-c", bare]
    demo = subprocess.run([*run, "demo"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert demo.returncode == 0, demo.stderr
    rows = ["stage,instruction,frequency,time,energy"] + [
        f"{g},{kind},{f},{t * (1 + g / 10):.4f},{t * f / 10:.4f}"
        for g in range(2)
        for kind, base in (("forward", 1.0), ("backward", 2.0))
        for f, t in ((1400, base), (1200, base * 1.1), (1000, base * 1.3))
    ]
    (tmp_path / "tiny.csv").write_text("\n".join(rows) + "\n")
    exact = subprocess.run(
        [*run, "plan", "tiny.csv", "--microbatches", "2", "--p-block", "50", "--exact",
         "--output", "exact.json"], capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert exact.returncode == 0, exact.stderr
    assert "gap" in exact.stdout
    simulate = subprocess.run(
        [*run, "simulate", "example_profile.csv", "frontier.json"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert simulate.returncode == 0, simulate.stderr


def test_a_straggler_faster_than_the_chosen_plan_is_warned_about(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A straggler at 1.75 s with a policy that chose a 1.92 s plan: this pipeline is the slow
    one, which the straggler rows alone do not say."""
    argv = ["plan", str(example), "--microbatches", "8", "--p-block", "100",
            "--policy", "max-slowdown:1.1", "--straggler", "1.75"]  # fmt: skip
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "straggler (point" in captured.out
    assert "warning: --straggler 1.75 s is shorter than the chosen plan's" in captured.err
    assert main([*argv[:-2], "--straggler", "2.0"]) == 0
    assert "warning" not in capsys.readouterr().err
