"""``perseus cluster budget|status|priority`` through ``perseus.cli.main`` against a real
planner (uvicorn on loopback)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from perseus.cli.cluster_budget import parse_when, watts

from . import test_job as cli
from .test_job import ADMIN, Planner, create, error_line, make_ready, run

clean_env = cli.clean_env  # no PERSEUS_* variable of the caller's shell reaches the commands


@pytest.fixture
def planners(tmp_path: Path) -> Iterator[Callable[..., Planner]]:
    """Start real planners on loopback (as tests/cli/test_job.py does); stopped at teardown."""
    started: list[Planner] = []

    def start(admin_token: str | None = None) -> Planner:
        started.append(cli._start(tmp_path, f"planner{len(started)}", admin_token))
        return started[-1]

    yield start
    for planner in started:
        planner.server.should_exit = True
    for planner in started:
        planner.thread.join(30)


def test_when_is_relative_or_an_iso_time() -> None:
    assert parse_when("+10m", now_s=1000.0) == 1600.0
    assert parse_when("+1.5h", now_s=0.0) == 5400.0
    assert parse_when("+30s", now_s=0.0) == 30.0
    utc = dt.datetime(2027, 1, 20, 14, 0, tzinfo=dt.UTC).timestamp()
    assert parse_when("2027-01-20T14:00+00:00") == utc
    local = dt.datetime(2027, 1, 20, 14, 0).astimezone().timestamp()
    assert parse_when("2027-01-20T14:00") == local
    for bad in ("soon", "+10", "10m", "+-1m", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="expected a time"):
            parse_when(bad)
    assert [watts(v) for v in (2.4e6, 8.12e5, 950.0, None)] == ["2.4 MW", "812 kW", "950 W", "-"]


def test_budget_status_and_off_with_the_admin_token(
    planners: Callable[..., Planner],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = planners(admin_token=ADMIN)
    monkeypatch.setenv("PERSEUS_ADMIN_TOKEN", ADMIN)
    env = create(capsys, monkeypatch, server.url)
    make_ready(env)
    # Unmeetable: 1 W. Every job at its least power, and said so.
    r = run(capsys, "cluster", "budget", "1W")
    assert r.status == 0, r.err
    assert "budget      1 W" in r.out and "met         NO" in r.out
    assert "below the least the jobs can draw" in r.out
    assert env["PERSEUS_JOB"] in r.out
    r = run(capsys, "cluster", "status", "--json")
    status = json.loads(r.out)
    assert status["meetable"] is False and status["jobs"][0]["counted"] == "plan"
    # A window ahead: scheduled, the standing budget in force meanwhile.
    r = run(capsys, "cluster", "budget", "2.4MW", "--from", "+1h", "--to", "+2h")
    assert r.status == 0, r.err
    assert "window      2.4 MW from" in r.out and "(scheduled)" in r.out
    assert "budget      1 W" in r.out
    # The server refuses an inverted window and says which field; nothing changes.
    r = run(capsys, "cluster", "budget", "2MW", "--from", "+2h", "--to", "+1h")
    assert "to_s must be after from_s" in error_line(r)
    r = run(capsys, "cluster", "budget", "off")
    assert r.status == 0, r.err
    assert "budget      none" in r.out and "window" not in r.out
    # Without the admin token, or with the job's: refused.
    monkeypatch.delenv("PERSEUS_ADMIN_TOKEN")
    assert "admin token" in error_line(run(capsys, "cluster", "status"))
    line = error_line(run(capsys, "cluster", "budget", "1MW", "--token", env["PERSEUS_TOKEN"]))
    assert "not the admin token" in line


def test_priority_with_the_jobs_token(
    planners: Callable[..., Planner],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = create(capsys, monkeypatch, planners().url)
    r = run(capsys, "cluster", "priority", env["PERSEUS_JOB"], "2.5")
    assert r.status == 0, r.err
    assert r.out == f"job {env['PERSEUS_JOB']}: priority 2.5 (plan version 0)\n"
    r = run(capsys, "job", "status", "--json")
    assert json.loads(r.out)["priority"] == 2.5
    assert "expected a finite number > 0" in error_line(
        run(capsys, "cluster", "priority", env["PERSEUS_JOB"], "0")
    )


def test_bad_command_lines_fail_before_asking(capsys: pytest.CaptureFixture[str]) -> None:
    assert "expected a power" in error_line(run(capsys, "cluster", "budget", "lots"))
    assert "expected a time" in error_line(
        run(capsys, "cluster", "budget", "1MW", "--from", "tomorrow")
    )
    assert "--from/--to need a POWER" in error_line(
        run(capsys, "cluster", "budget", "off", "--to", "+1h")
    )
    assert "no planner server" in error_line(run(capsys, "cluster", "status"))
