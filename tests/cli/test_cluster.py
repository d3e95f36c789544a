"""``perseus cluster simulate``: a folder of saved jobs planned, three ways compared."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from perseus.cli import main
from perseus.cli.cluster import parse_power
from perseus.cli.cluster_simulate import load_jobs, plan_jobs, simulate


def _folder(tmp_path: Path, example: Path) -> Path:
    jobs = {
        "a": {"schedule": "1f1b", "microbatches": 6, "replicas": 4},
        "b": {"schedule": "gpipe", "microbatches": 4, "replicas": 2, "priority": 3},
        "c": {"schedule": "1f1b", "microbatches": 8, "replicas": 1, "policy": "max-slowdown:1.02"},
    }
    for name, shape in jobs.items():
        data = {"profile": str(example), "p_block_w": 60.0, **shape}
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    return tmp_path


def test_the_frontiers_choice_fits_every_budget_and_loses_least_weighted_speed(
    tmp_path: Path, example: Path
) -> None:
    folder = _folder(tmp_path, example)
    jobs = plan_jobs(folder, load_jobs(folder))
    least = sum(min(j.power_w(k) for k in range(len(j.frontier))) for j in jobs)
    most = sum(j.power_w(j.policy_index) for j in jobs)
    budgets = [least * 0.99, least, (least + most) / 2, most, most * 1.5]
    curves = simulate(jobs, budgets)
    assert curves[0].frontiers_kept is None  # below what every job can draw: said, not met
    assert curves[0].frontiers_power_w > budgets[0]
    for curve in curves[1:]:
        assert curve.frontiers_kept is not None
        assert curve.frontiers_power_w <= curve.budget_w
    assert curves[-1].frontiers_kept == curves[-2].frontiers_kept  # the policies: no slowdown
    kept = [c.frontiers_kept for c in curves[1:]]
    assert kept == sorted(kept)  # more power never keeps less


def test_the_command_prints_a_row_per_budget_and_draws_the_curves(
    tmp_path: Path, example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _folder(tmp_path, example)
    png = tmp_path / "curves.png"
    status = main(["cluster", "simulate", str(folder), "--budget", "2kW", "--budget", "1500W",
                   "--plot", str(png)])  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0
    lines = out.splitlines()
    assert lines[0].startswith("3 jobs, ")
    assert lines[1].split() == [
        "budget",
        "frontiers",
        "power",
        "limit",
        "per-job",
        "frontiers'",
        "power",
    ]
    assert [line.split()[0] for line in lines[2:4]] == ["1.5", "2.0"]
    assert png.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[1]", "expected a JSON object"),
        ('{"profile": "x.csv", "schedule": "1f1b", "microbatches": 4}', "replicas: missing"),
        (
            '{"profile": "x", "schedule": "1f1b", "microbatches": 4, "replicas": 1, "gpus": 2}',
            "unknown field 'gpus'",
        ),
        ("{", "not a JSON job file"),
    ],
)
def test_a_bad_job_file_is_one_line_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    (tmp_path / "job.json").write_text(content)
    assert main(["cluster", "simulate", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "job.json" in err and message in err


def test_a_job_that_cannot_be_planned_is_named(
    tmp_path: Path, example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = {"profile": str(example), "schedule": "nope", "microbatches": 4, "replicas": 1}
    (tmp_path / "odd.json").write_text(json.dumps(data))
    assert main(["cluster", "simulate", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("perseus: error: job odd: ")


@pytest.mark.parametrize(
    ("text", "watts"), [("2.4MW", 2.4e6), ("800kW", 8e5), ("1500W", 1500.0), ("950", 950.0)]
)
def test_powers_read_with_their_units(text: str, watts: float) -> None:
    assert parse_power(text) == pytest.approx(watts)


@pytest.mark.parametrize("text", ["", "-3kW", "0", "2.4 XW", "MW"])
def test_a_power_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected a power"):
        parse_power(text)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"microbatches": 10**9}, "microbatches: expected an integer in 1..100000"),
        ({"microbatches": 50_000}, "2 x stages x microbatches x virtual_stages = 400000 exceeds"),
        ({"virtual_stages": 10**6}, "virtual_stages: expected an integer in 1..64"),
        ({"replicas": 10**400}, "replicas: expected an integer in 1..131072, got <an integer"),
        ({"priority": 10**400}, "priority: expected a finite number in (0, 1e+06]"),
        ({"p_block_w": 1e308}, "p_block_w: expected a finite number in (0, 1e+06]"),
        ({"schedule": [[["1f1b"]]]}, "schedule: expected a string"),
        ({"profile": "typo.csv"}, "typo.csv: row 1058: stage: must be in 0..1023"),
    ],
)
def test_a_job_file_past_a_jobs_limits_is_one_line_before_any_planning(
    tmp_path: Path,
    example: Path,
    capsys: pytest.CaptureFixture[str],
    change: dict[str, object],
    message: str,
) -> None:
    (tmp_path / "typo.csv").write_text(example.read_text() + "999999999999,forward,1410,0.05,24\n")
    data = {"profile": str(example), "schedule": "1f1b", "microbatches": 4, "replicas": 1,
            "p_block_w": 60.0}  # fmt: skip
    (tmp_path / "big.json").write_text(json.dumps({**data, **change}))
    assert main(["cluster", "simulate", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 400, err[:500]
    assert err.startswith("perseus: error: ") and "big" in err and message in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            '{"microbatches": ' + "9" * 5000 + "}",
            "not a JSON job file (a number of over 4,300 digits)",
        ),
        ("[" * 100_000 + "]" * 100_000, "not a JSON job file (nested too deeply)"),
        ('{"' + "x" * 2 * 2**20 + '": 1}', "larger than 1024 KiB"),
    ],
)
def test_a_hostile_job_file_is_one_short_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    (tmp_path / "job.json").write_text(content)
    assert main(["cluster", "simulate", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 400 and "job.json" in err and message in err
